/* signoff chat page: the page's words in English and Brazilian Portuguese, and the
 * locale formats (Intl) for money, dates and times.
 *
 * The language is the one the person chose on the page (kept in localStorage), else
 * the browser's (navigator.language): pt* -> pt-BR, anything else -> en. Text that
 * comes from the server (card summaries, messages) is never translated here.
 *
 * Static elements name their string with data-i18n (textContent), data-i18n-label
 * (aria-label) or data-i18n-placeholder; apply() sets them all.
 */
(function () {
  'use strict';

  var LANG_KEY = 'signoff.lang';

  var STRINGS = {
    en: {
      'page.title': 'signoff — chat',
      'skip': 'Skip to the message box',
      'skipCards': 'Skip to the cards waiting for you',
      'lang.label': 'Language',
      'conn.online': 'Online',
      'conn.connecting': 'Connecting…',
      'conn.offline': 'Offline',
      'conn.signedOut': 'Signed out',
      'conn.retry': 'Offline — reconnecting in {s} s',
      'conn.noNetwork': 'Offline — no network; reconnecting when it is back',
      'who': 'Signed in as {user}',
      'newChat': 'New chat',
      'logout': 'Sign out',
      'login.title': 'Sign in',
      'login.help': 'Paste a token from “signoff token --user demo” (or open the link “signoff dev” prints).',
      'login.token': 'Token',
      'login.submit': 'Sign in',
      'login.empty': 'Paste a token first.',
      'login.refused': 'That token was refused (invalid or expired). Paste a new one.',
      'login.linkRefused': 'A link asked to sign this tab in as another user; you stay signed in as {now}. Sign out first to switch.',
      'chat.label': 'Conversation',
      'threads.title': 'Conversations',
      'threads.toggle': 'Conversations',
      'threads.none': 'No conversations yet.',
      'threads.untitled': 'New conversation',
      'threads.pending': '{n} waiting',
      'threads.current': 'current conversation',
      'pending.region': 'Pending confirmations',
      'pending.formOpen': 'finish or cancel the open form to confirm all',
      'pending.one': '1 confirmation pending',
      'composer.replaces': 'A new message replaces the cards still waiting: none of them runs.',
      'guard.one': 'Sent here, this message replaces the card waiting, which then does not run. To change the card, use its Edit button.',
      'guard.many': 'Sent here, this message replaces the {n} cards waiting: none of them runs. To change a card, use its Edit button.',
      'guard.send': 'Send here',
      'guard.newChat': 'Send in a new chat',
      'pending.many': '{n} confirmations pending',
      'pending.confirmAll': 'Confirm all {n}',
      'batch.check': 'Confirm these {n} at once? Each runs as soon as it is confirmed:',
      'batch.go': 'Yes, confirm the {n}',
      'batch.cancel': 'Not now',
      'pending.rejectAll': 'Reject all {n}',
      'transcript': 'Messages',
      'empty': 'Ask for something. Writes are only proposed; you confirm each one on its card.',
      'empty.example': 'Ask for something, e.g. {example}. Writes are only proposed; you confirm each one on its card.',
      'thinking': 'Assistant is working…',
      'gate.needed': 'Your decision is needed',
      'gate.until': 'until {when}',
      'gate.submit': 'Submit',
      'gate.refused': 'Refused ({status})',
      'gate.offline': 'Could not reach the server; try again.',
      'gate.sent': 'Sent: {workflow} goes on.',
      'gate.yes': 'Yes',
      'gate.no': 'No',
      'gate.approve': 'Approve',
      'gate.reject': 'Reject',
      'gate.edit': 'Edit and approve',
      'gate.region': 'Workflow decisions',
      'notice.modelUnavailable': 'The model cannot be reached right now; still trying.',
      'composer.label': 'Message',
      'composer.placeholder': 'Message…',
      'composer.send': 'Send',
      'composer.offline': 'Not connected; your message was not sent.',
      'composer.maybeQueued': 'Could not confirm your message was received. Send it again: it will not run twice.',
      'composer.notTaken': 'Your message was not taken ({msg}). It is back in the box: send it again.',
      'composer.workflow': 'This conversation belongs to a workflow: decide its cards here; it takes no messages.',
      'thread.unavailable': 'That conversation does not exist or is not yours: this is a new one.',
      'composer.tooLong': 'Too long to send: {n} characters of at most {max}. Shorten it first.',
      'msg.you': 'You',
      'msg.workflow': 'Workflow',
      'msg.assistant': 'Assistant',
      'run.failed': 'The assistant stopped: {error}',
      'run.failedDefault': 'the run failed',
      'notice.tool': 'Nothing was proposed: the tool could not prepare it (details)',
      'card.title': 'Confirmation',
      'card.decision': 'Decision',
      'risk.read': 'read only',
      'risk.reversible': 'reversible',
      'risk.critical': 'critical',
      'risk.read.title': 'Read only',
      'risk.reversible.title': 'Can be undone',
      'risk.critical.title': 'Cannot be undone',
      'status.pending': 'Waiting for your decision',
      'status.approved': 'Approved — running',
      'status.executing': 'Executing',
      'status.executed': 'Executed',
      'status.rejected': 'Rejected',
      'status.expired': 'Expired',
      'status.superseded': 'Superseded',
      'status.modified': 'Edited',
      'status.invalidated': 'Not executed',
      'status.failed': 'Failed',
      'impact.amount': 'Amount',
      'impact.target': 'Target',
      'impact.reversible': 'Reversible',
      'impact.yes': 'Yes — can be undone',
      'impact.no': 'No — cannot be undone',
      'impact.sideEffects': 'Side effects',
      'impact.expires': 'Expires',
      'field.amount': 'Amount',
      'field.description': 'Description',
      'field.email': 'E-mail',
      'btn.confirm': 'Confirm',
      'btn.reject': 'Reject',
      'btn.edit': 'Edit',
      'btn.again': 'Propose again',
      'btn.cancel': 'Cancel',
      'btn.copy': 'Copy',
      'btn.copied': 'Copied',
      'again.text': 'Propose again: {summary}',
      'where.ws': 'in the chat',
      'where.http': 'through the API',
      'where.whatsapp': 'on WhatsApp',
      'by': 'by {who}',
      'at': 'at {time}',
      'out.approved': 'Approved {decided}.',
      'out.running': 'Approved {decided}. Running…',
      'out.executing': 'Approved {decided}. Executing…',
      'out.rejected': 'Rejected {decided}. Nothing was done.',
      'out.reason': 'Reason: {reason}',
      'out.expired': 'Expired without a decision. Nothing was done.',
      'out.superseded': 'Superseded by a newer message. Nothing was done.',
      'out.modified': 'Edited {decided}; replaced by a new card.',
      'out.newCard': 'Go to the new card',
      'out.invalidated': 'Approved {decided}, but NOT executed: {reason}.',
      'out.invalidatedDefault': 'something changed',
      'out.change': '{field}: approved {approved}, now {current}',
      'out.failed': 'Failed: {error}.',
      'out.failedDefault': 'unknown error',
      'out.reconcile': 'Outcome unknown: flagged for an operator to reconcile. Do not retry.',
      'out.executedTitle': 'Done',
      'form.reject': 'Reject this card',
      'form.reason': 'Reason (optional)',
      'form.edit': 'Edit this card',
      'form.editNote': '“Propose edited card” makes a new card with the new values; you confirm that one.',
      'form.editSubmit': 'Propose edited card',
      'form.noChange': 'Change a field first.',
      'card.unknown': 'The connection dropped before an answer: your decision may or may not have arrived. Once back online, this card shows which; decide again only if it still waits.',
      'form.droppedEdit': 'Your edit was not sent: the card was decided (or replaced) elsewhere first.',
      'form.droppedReject': 'Your rejection was not sent: the card was decided (or replaced) elsewhere first.',
      'form.droppedEditExpired': 'Your edit was not sent: the card expired first.',
      'form.droppedRejectExpired': 'Your rejection was not sent: the card expired first.',
      'progress.sending': 'Sending your decision…',
      'announce.new': 'New confirmation card: {summary}. Confirm, reject or edit it.',
      'announce.status': 'Card {status}: {summary}',
      'err.notConnected': 'Not connected; try again when the page is back online.',
      'err.already': 'Already decided elsewhere: {msg}',
      'err.stale': 'This card changed since it was shown; reload the page.',
      'err.expired': 'This card expired before your decision.',
      'err.unknownTool': 'This server cannot act on this card right now (an update is rolling out); try again shortly.',
      'err.forbidden': 'Not allowed: {msg}',
      'err.gone': 'This card no longer exists.',
      'err.invalid': 'Invalid: {msg}',
      'err.session': 'Your session ended; sign in again.',
      'err.conflict': 'Conflict: {msg}',
      'err.busy': 'The service is busy; try again.',
      'err.network': 'Network error: {msg}',
      'err.generic': 'Something went wrong'
    },
    'pt-BR': {
      'page.title': 'signoff — conversa',
      'skip': 'Pular para a caixa de mensagem',
      'skipCards': 'Pular para os cartões que aguardam você',
      'lang.label': 'Idioma',
      'conn.online': 'Conectado',
      'conn.connecting': 'Conectando…',
      'conn.offline': 'Sem conexão',
      'conn.signedOut': 'Desconectado',
      'conn.retry': 'Sem conexão — reconectando em {s} s',
      'conn.noNetwork': 'Sem conexão — sem rede; reconectando quando ela voltar',
      'who': 'Entrou como {user}',
      'newChat': 'Nova conversa',
      'logout': 'Sair',
      'login.title': 'Entrar',
      'login.help': 'Cole um token de “signoff token --user demo” (ou abra o link que o “signoff dev” mostra).',
      'login.token': 'Token',
      'login.submit': 'Entrar',
      'login.empty': 'Cole um token primeiro.',
      'login.refused': 'Esse token foi recusado (inválido ou expirado). Cole um novo.',
      'login.linkRefused': 'Um link pediu para entrar nesta aba como outro usuário; você continua como {now}. Saia primeiro para trocar.',
      'chat.label': 'Conversa',
      'threads.title': 'Conversas',
      'threads.toggle': 'Conversas',
      'threads.none': 'Nenhuma conversa ainda.',
      'threads.untitled': 'Nova conversa',
      'threads.pending': '{n} aguardando',
      'threads.current': 'conversa atual',
      'pending.region': 'Confirmações pendentes',
      'pending.formOpen': 'conclua ou cancele o formulário aberto para confirmar todas',
      'pending.one': '1 confirmação pendente',
      'composer.replaces': 'Uma nova mensagem substitui os cartões ainda pendentes: nada deles é executado.',
      'guard.one': 'Enviada aqui, esta mensagem substitui o cartão pendente: nada dele é executado. Para mudar o cartão, use Editar.',
      'guard.many': 'Enviada aqui, esta mensagem substitui os {n} cartões pendentes: nada deles é executado. Para mudar um cartão, use Editar.',
      'guard.send': 'Enviar aqui',
      'guard.newChat': 'Enviar numa nova conversa',
      'pending.many': '{n} confirmações pendentes',
      'pending.confirmAll': 'Confirmar todas ({n})',
      'batch.check': 'Confirmar estas {n} de uma vez? Cada uma é executada assim que confirmada:',
      'batch.go': 'Sim, confirmar as {n}',
      'batch.cancel': 'Agora não',
      'pending.rejectAll': 'Recusar todas ({n})',
      'transcript': 'Mensagens',
      'empty': 'Peça algo. Nada é feito sem você: cada ação é proposta num cartão que você confirma.',
      'empty.example': 'Peça algo, por ex. {example}. Nada é feito sem você: cada ação é proposta num cartão que você confirma.',
      'thinking': 'O assistente está trabalhando…',
      'gate.needed': 'Sua decisão é necessária',
      'gate.until': 'até {when}',
      'gate.submit': 'Enviar',
      'gate.refused': 'Recusado ({status})',
      'gate.offline': 'Não foi possível falar com o servidor; tente de novo.',
      'gate.sent': 'Enviado: {workflow} continua.',
      'gate.yes': 'Sim',
      'gate.no': 'Não',
      'gate.approve': 'Aprovar',
      'gate.reject': 'Recusar',
      'gate.edit': 'Editar e aprovar',
      'gate.region': 'Decisões de fluxos de trabalho',
      'notice.modelUnavailable': 'Não foi possível falar com o modelo agora; tentando de novo.',
      'composer.label': 'Mensagem',
      'composer.placeholder': 'Mensagem…',
      'composer.send': 'Enviar',
      'composer.offline': 'Sem conexão; sua mensagem não foi enviada.',
      'composer.maybeQueued': 'Não deu para confirmar que sua mensagem chegou. Envie de novo: ela não será executada duas vezes.',
      'composer.notTaken': 'Sua mensagem não foi aceita ({msg}). Ela voltou para a caixa: envie de novo.',
      'composer.workflow': 'Esta conversa pertence a um fluxo de trabalho: decida os cartões aqui; ela não recebe mensagens.',
      'thread.unavailable': 'Essa conversa não existe ou não é sua: esta é uma nova.',
      'composer.tooLong': 'Longa demais para enviar: {n} caracteres de no máximo {max}. Encurte antes.',
      'msg.you': 'Você',
      'msg.workflow': 'Fluxo de trabalho',
      'msg.assistant': 'Assistente',
      'run.failed': 'O assistente parou: {error}',
      'run.failedDefault': 'a execução falhou',
      'notice.tool': 'Nada foi proposto: a ferramenta não conseguiu prepará-lo (detalhes)',
      'card.title': 'Confirmação',
      'card.decision': 'Decisão',
      'risk.read': 'só leitura',
      'risk.reversible': 'reversível',
      'risk.critical': 'crítico',
      'risk.read.title': 'Só leitura',
      'risk.reversible.title': 'Pode ser desfeito',
      'risk.critical.title': 'Não pode ser desfeito',
      'status.pending': 'Aguardando sua decisão',
      'status.approved': 'Aprovado — executando',
      'status.executing': 'Executando',
      'status.executed': 'Executado',
      'status.rejected': 'Recusado',
      'status.expired': 'Expirado',
      'status.superseded': 'Substituído',
      'status.modified': 'Editado',
      'status.invalidated': 'Não executado',
      'status.failed': 'Falhou',
      'impact.amount': 'Valor',
      'impact.target': 'Para',
      'impact.reversible': 'Reversível',
      'impact.yes': 'Sim — pode ser desfeito',
      'impact.no': 'Não — não pode ser desfeito',
      'impact.sideEffects': 'Efeitos',
      'impact.expires': 'Expira',
      'field.amount': 'Valor',
      'field.description': 'Descrição',
      'field.email': 'E-mail',
      'btn.confirm': 'Confirmar',
      'btn.reject': 'Recusar',
      'btn.edit': 'Editar',
      'btn.again': 'Propor de novo',
      'btn.cancel': 'Cancelar',
      'btn.copy': 'Copiar',
      'btn.copied': 'Copiado',
      'again.text': 'Proponha novamente: {summary}',
      'where.ws': 'no chat',
      'where.http': 'pela API',
      'where.whatsapp': 'no WhatsApp',
      'by': 'por {who}',
      'at': 'às {time}',
      'out.approved': 'Aprovado {decided}.',
      'out.running': 'Aprovado {decided}. Executando…',
      'out.executing': 'Aprovado {decided}. Executando…',
      'out.rejected': 'Recusado {decided}. Nada foi feito.',
      'out.reason': 'Motivo: {reason}',
      'out.expired': 'Expirou sem decisão. Nada foi feito.',
      'out.superseded': 'Substituído por uma mensagem mais nova. Nada foi feito.',
      'out.modified': 'Editado {decided}; substituído por um novo cartão.',
      'out.newCard': 'Ir para o novo cartão',
      'out.invalidated': 'Aprovado {decided}, mas NÃO executado: {reason}.',
      'out.invalidatedDefault': 'algo mudou',
      'out.change': '{field}: aprovado {approved}, agora {current}',
      'out.failed': 'Falhou: {error}.',
      'out.failedDefault': 'erro desconhecido',
      'out.reconcile': 'Resultado incerto: um operador vai verificar. Não tente de novo.',
      'out.executedTitle': 'Feito',
      'form.reject': 'Recusar este cartão',
      'form.reason': 'Motivo (opcional)',
      'form.edit': 'Editar este cartão',
      'form.editNote': '“Propor cartão editado” cria um novo cartão com os novos valores; é esse que você confirma.',
      'form.editSubmit': 'Propor cartão editado',
      'form.noChange': 'Altere um campo primeiro.',
      'card.unknown': 'A conexão caiu antes da resposta: sua decisão pode ou não ter chegado. De volta à conexão, este cartão mostra qual; decida de novo só se ele ainda aguardar.',
      'form.droppedEdit': 'Sua edição não foi enviada: o cartão foi decidido (ou substituído) em outro lugar antes.',
      'form.droppedReject': 'Sua recusa não foi enviada: o cartão foi decidido (ou substituído) em outro lugar antes.',
      'form.droppedEditExpired': 'Sua edição não foi enviada: o cartão expirou antes.',
      'form.droppedRejectExpired': 'Sua recusa não foi enviada: o cartão expirou antes.',
      'progress.sending': 'Enviando sua decisão…',
      'announce.new': 'Novo cartão de confirmação: {summary}. Confirme, recuse ou edite.',
      'announce.status': 'Cartão {status}: {summary}',
      'err.notConnected': 'Sem conexão; tente de novo quando a página voltar a ficar online.',
      'err.already': 'Já decidido em outro lugar: {msg}',
      'err.stale': 'Este cartão mudou desde que foi mostrado; recarregue a página.',
      'err.expired': 'Este cartão expirou antes da sua decisão.',
      'err.unknownTool': 'Este servidor não pode agir sobre este cartão agora (uma atualização está em andamento); tente de novo em instantes.',
      'err.forbidden': 'Não permitido: {msg}',
      'err.gone': 'Este cartão não existe mais.',
      'err.invalid': 'Inválido: {msg}',
      'err.session': 'Sua sessão terminou; entre de novo.',
      'err.conflict': 'Conflito: {msg}',
      'err.busy': 'O serviço está ocupado; tente de novo.',
      'err.network': 'Erro de rede: {msg}',
      'err.generic': 'Algo deu errado'
    }
  };

  var LANGS = [{ tag: 'pt-BR', name: 'Português (Brasil)' }, { tag: 'en', name: 'English' }];

  function pick(tag) {
    return /^pt\b/i.test(String(tag || '')) ? 'pt-BR' : 'en';
  }

  function chosen() {
    var saved = null;
    try { saved = window.localStorage.getItem(LANG_KEY); } catch (e) { /* disabled */ }
    if (saved && STRINGS[saved]) return saved;
    return pick(navigator.language || (navigator.languages || [])[0]);
  }

  var I = { lang: chosen(), langs: LANGS };

  I.locale = function () { return I.lang === 'pt-BR' ? 'pt-BR' : 'en-US'; };

  I.t = function (key, vars) {
    var table = STRINGS[I.lang] || STRINGS.en;
    var text = table[key];
    if (text === undefined) text = STRINGS.en[key];
    if (text === undefined) return key;
    return text.replace(/\{(\w+)\}/g, function (m, name) {
      return vars && vars[name] !== undefined && vars[name] !== null ? String(vars[name]) : m;
    });
  };

  I.set = function (tag) {
    I.lang = STRINGS[tag] ? tag : pick(tag);
    try { window.localStorage.setItem(LANG_KEY, I.lang); } catch (e) { /* disabled */ }
    I.apply(document);
  };

  /* A label a tool declared: one text, or one per language tag. */
  I.label = function (label) {
    if (label === null || label === undefined) return '';
    if (typeof label !== 'object') return String(label);
    if (label[I.lang] !== undefined) return String(label[I.lang]);
    var base = I.lang.split('-')[0];
    if (label[base] !== undefined) return String(label[base]);
    if (label.en !== undefined) return String(label.en);
    var keys = Object.keys(label);
    return keys.length ? String(label[keys[0]]) : '';
  };

  I.money = function (cents, currency) {
    var n = Number(cents);
    if (!isFinite(n)) return String(cents);
    try {
      return new Intl.NumberFormat(I.locale(), { style: 'currency', currency: currency || 'BRL' }).format(n / 100);
    } catch (e) {
      return (n / 100).toFixed(2) + ' ' + (currency || '');
    }
  };

  I.number = function (value) {
    var n = Number(value);
    return isFinite(n) ? new Intl.NumberFormat(I.locale()).format(n) : String(value);
  };

  function date(iso) {
    var d = new Date(iso);
    return isNaN(d.getTime()) ? null : d;
  }

  I.time = function (iso) {
    var d = date(iso);
    return d ? new Intl.DateTimeFormat(I.locale(), { hour: '2-digit', minute: '2-digit' }).format(d) : '';
  };

  // A card's deadline: with seconds when it is less than an hour away (a card of a
  // short lifetime showed "19:13" for "in 20 s").
  I.expiry = function (iso) {
    var d = date(iso);
    if (!d) return '';
    var soon = d.getTime() - Date.now() < 3600 * 1000;
    var opts = soon
      ? { hour: '2-digit', minute: '2-digit', second: '2-digit' }
      : { hour: '2-digit', minute: '2-digit' };
    return new Intl.DateTimeFormat(I.locale(), opts).format(d);
  };

  I.dateTime = function (iso) {
    var d = date(iso);
    return d ? new Intl.DateTimeFormat(I.locale(), { dateStyle: 'medium', timeStyle: 'short' }).format(d) : '';
  };

  I.date = function (iso) {
    var d = date(iso);
    return d ? new Intl.DateTimeFormat(I.locale(), { dateStyle: 'medium' }).format(d) : '';
  };

  /* A time when it is today, else a short date: for the thread list. */
  I.when = function (iso) {
    var d = date(iso);
    if (!d) return '';
    var now = new Date();
    if (d.toDateString() === now.toDateString()) return I.time(iso);
    return new Intl.DateTimeFormat(I.locale(), { day: 'numeric', month: 'short' }).format(d);
  };

  I.apply = function (root) {
    document.documentElement.lang = I.lang;
    document.title = I.t('page.title');
    root.querySelectorAll('[data-i18n]').forEach(function (n) { n.textContent = I.t(n.dataset.i18n); });
    root.querySelectorAll('[data-i18n-label]').forEach(function (n) {
      n.setAttribute('aria-label', I.t(n.dataset.i18nLabel));
    });
    root.querySelectorAll('[data-i18n-placeholder]').forEach(function (n) {
      n.setAttribute('placeholder', I.t(n.dataset.i18nPlaceholder));
    });
  };

  window.SignoffI18n = I;
})();
