/* signoff chat page: plain JS, no build step, no third-party code.
 *
 * Everything shown is rebuilt from the server's thread log: on every (re)connect the
 * page sends `resume {after_seq: 0}` and replays the events in seq order. A card's
 * state is the last `card` / `card_update` event for its id; clicks never change a
 * card by themselves, they only send a decision and wait for the event.
 *
 * Text that comes from the server (summaries, messages, reasons) is always set with
 * textContent, never parsed as HTML.
 */
(function () {
  'use strict';

  var TOKEN_KEY = 'signoff.token';
  var THREAD_KEY = 'signoff.thread';
  // Close code of a gateway that stops (docs/websocket.md): reconnect at once, elsewhere.
  var RECONNECT_ELSEWHERE = 1012;
  var BACKOFF_MIN = 500;
  var BACKOFF_MAX = 10000;

  var STATUS_LABEL = {
    pending: 'Waiting for your decision',
    approved: 'Approved — running',
    executing: 'Executing',
    executed: 'Executed',
    rejected: 'Rejected',
    expired: 'Expired',
    superseded: 'Superseded',
    modified: 'Edited',
    invalidated: 'Not executed',
    failed: 'Failed'
  };

  var FIELD_LABEL = {
    amount: 'Amount (R$)',
    description: 'Description',
    email: 'E-mail'
  };

  var el = {};
  var state = {
    token: null,
    user: null,
    threadId: null,
    ws: null,
    ready: false,
    attempt: 0,
    reconnectTimer: null,
    authFailed: false,
    moved: false, // closed with 1012 (the gateway stops): continue from lastSeq elsewhere
    nextId: 1,
    requests: new Map(), // frame id -> {kind, cardId?}
    awaitingThread: false, // a first message was sent; its thread is not known yet
    seenThreads: new Set(), // threads this socket follows besides the current one
    // The view model, rebuilt from events only.
    lastSeq: 0,
    liveFrom: Infinity, // events with a larger seq arrived live (announce them)
    cards: new Map(), // card id -> {card, el, busy, error, form}
    streams: new Map(), // run id -> {el, text}: the streaming assistant bubble
    finalText: new Map(), // run id -> text of its last assistant event
    doneRuns: new Set(), // runs that ended (late deltas are dropped)
    activeRun: null
  };

  // ------------------------------------------------------------------ helpers

  function $(id) { return document.getElementById(id); }

  function make(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function store(key, value) {
    try {
      if (value === null || value === undefined) sessionStorage.removeItem(key);
      else sessionStorage.setItem(key, value);
    } catch (e) { /* storage disabled: the URL still carries the thread */ }
  }

  function stored(key) {
    try { return sessionStorage.getItem(key); } catch (e) { return null; }
  }

  function frameId() { return 'c' + (state.nextId++); }

  function send(frame) {
    var ws = state.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN || !state.ready) return false;
    ws.send(JSON.stringify(frame));
    return true;
  }

  var announcements = [];
  function announce(text) {
    // Collect what happens in one burst (an edit: a new card and the old one's update)
    // and say it at once; clear first so that the same text is announced again.
    announcements.push(text);
    if (announcements.length > 1) return;
    el.announcer.textContent = '';
    window.setTimeout(function () {
      el.announcer.textContent = announcements.join(' ');
      announcements = [];
    }, 50);
  }

  function alertText(text) {
    el.alerts.textContent = text;
  }

  function timeOf(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) return '';
    return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  }

  function textOf(data) {
    var blocks = (data && data.content) || [];
    if (typeof blocks === 'string') return blocks;
    var parts = [];
    for (var i = 0; i < blocks.length; i++) {
      if (blocks[i] && blocks[i].type === 'text' && blocks[i].text) parts.push(blocks[i].text);
    }
    return parts.join('\n');
  }

  function scrollToEnd() {
    var last = el.transcript.lastElementChild;
    if (last && last.scrollIntoView) last.scrollIntoView({ block: 'end' });
  }

  function plural(n, one, many) { return n + ' ' + (n === 1 ? one : many); }

  function valueText(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }

  // ------------------------------------------------------------------ URL / login

  function readLocation() {
    var hash = window.location.hash.replace(/^#/, '');
    var params = new URLSearchParams(hash);
    var token = params.get('token');
    var url = new URL(window.location.href);
    if (token) {
      store(TOKEN_KEY, token);
      url.hash = '';
    }
    var thread = url.searchParams.get('thread');
    if (thread) store(THREAD_KEY, thread);
    history.replaceState(null, '', url.pathname + url.search);
    state.token = stored(TOKEN_KEY);
    state.threadId = thread || stored(THREAD_KEY);
    writeLocation();
  }

  function writeLocation() {
    var url = new URL(window.location.href);
    if (state.threadId) url.searchParams.set('thread', state.threadId);
    else url.searchParams.delete('thread');
    url.hash = '';
    history.replaceState(null, '', url.pathname + url.search);
    store(THREAD_KEY, state.threadId);
  }

  function showLogin(message) {
    el.login.hidden = false;
    el.chat.hidden = true;
    el.composer.hidden = true;
    el.logout.hidden = true;
    el.newChat.hidden = true;
    el.loginError.textContent = message || '';
    setConn('offline', 'Signed out');
    el.tokenInput.focus();
  }

  function showChat() {
    el.login.hidden = true;
    el.chat.hidden = false;
    el.composer.hidden = false;
    el.logout.hidden = false;
    el.newChat.hidden = false;
  }

  function signOut() {
    store(TOKEN_KEY, null);
    state.token = null;
    disconnect();
    showLogin('');
  }

  // ------------------------------------------------------------------ connection

  function setConn(kind, text) {
    el.conn.dataset.state = kind;
    el.conn.textContent = text;
    el.composer.setAttribute('aria-busy', kind === 'online' ? 'false' : 'true');
    renderComposer();
    renderAllCards();
    renderPending();
  }

  function disconnect() {
    window.clearTimeout(state.reconnectTimer);
    var ws = state.ws;
    state.ws = null;
    state.ready = false;
    if (ws) ws.close(1000);
  }

  function connect() {
    window.clearTimeout(state.reconnectTimer);
    if (!state.token) { showLogin(''); return; }
    showChat();
    var proto = window.location.protocol === 'https:' ? 'wss:' : 'ws:';
    var ws;
    try {
      ws = new WebSocket(proto + '//' + window.location.host + '/v1/ws');
    } catch (e) {
      scheduleReconnect();
      return;
    }
    state.ws = ws;
    state.ready = false;
    state.authFailed = false;
    setConn('connecting', 'Connecting…');
    ws.onopen = function () {
      ws.send(JSON.stringify({ type: 'auth', token: state.token }));
    };
    ws.onmessage = function (ev) {
      if (state.ws !== ws) return;
      var frame;
      try { frame = JSON.parse(ev.data); } catch (e) { return; }
      onFrame(frame);
    };
    ws.onclose = function (ev) {
      if (state.ws !== ws) return;
      state.ws = null;
      state.ready = false;
      dropRequests();
      if (state.authFailed || ev.code === 4401) {
        store(TOKEN_KEY, null);
        state.token = null;
        showLogin('That token was refused (invalid or expired). Paste a new one.');
        return;
      }
      if (ev.code === RECONNECT_ELSEWHERE) {
        // The gateway is stopping: reconnect now to the same URL (the load balancer sends
        // us to another gateway) and continue after the last event shown.
        state.moved = true;
        setConn('connecting', 'Reconnecting…');
        state.reconnectTimer = window.setTimeout(connect, Math.round(Math.random() * 250));
        return;
      }
      scheduleReconnect();
    };
    ws.onerror = function () { /* a close event follows */ };
  }

  function scheduleReconnect() {
    var base = Math.min(BACKOFF_MAX, BACKOFF_MIN * Math.pow(2, state.attempt));
    var delay = Math.round(base / 2 + Math.random() * base / 2);
    state.attempt += 1;
    setConn('offline', 'Offline — reconnecting in ' + Math.max(1, Math.round(delay / 1000)) + ' s');
    state.reconnectTimer = window.setTimeout(connect, delay);
  }

  function dropRequests() {
    // Requests in flight on a dead socket get no answer; the replay after the
    // reconnect shows what really happened.
    state.requests.forEach(function (req) {
      if (req.cardIds) req.cardIds.forEach(function (id) { setBusy(id, false); });
    });
    state.requests.clear();
    state.awaitingThread = false;
  }

  // ------------------------------------------------------------------ frames

  function onFrame(f) {
    switch (f.type) {
      case 'ready': return onReady(f);
      case 'ack': return onAck(f);
      case 'event': return onEvent(f);
      case 'delta': return onDelta(f);
      case 'resolved': return onResolved(f);
      case 'error': return onError(f);
      default: return undefined;
    }
  }

  function onReady(f) {
    var moved = state.moved;
    state.moved = false;
    state.ready = true;
    state.attempt = 0;
    state.user = f.user || state.user;
    el.who.textContent = state.user ? 'Signed in as ' + state.user : '';
    state.seenThreads.clear();
    setConn('online', 'Online');
    if (state.threadId && moved) {
      // After a 1012 the view is kept: only the events after the last one shown follow.
      var cid = frameId();
      state.requests.set(cid, { kind: 'continue' });
      send({ type: 'resume', id: cid, thread_id: state.threadId, after_seq: state.lastSeq });
    } else if (state.threadId) {
      var id = frameId();
      state.requests.set(id, { kind: 'resume' });
      send({ type: 'resume', id: id, thread_id: state.threadId, after_seq: 0 });
    } else {
      resetView();
    }
  }

  function onAck(f) {
    var req = state.requests.get(f.id);
    if (!req) return;
    state.requests.delete(f.id);
    if (req.kind === 'resume') {
      if (f.thread_id !== state.threadId) return;
      // Rebuild everything from the server's log, which follows this ack.
      resetView();
      state.liveFrom = (f.state && typeof f.state.last_seq === 'number') ? f.state.last_seq : 0;
    } else if (req.kind === 'continue') {
      // Events after the resume point happened while we were away: announce them.
      if (f.thread_id === state.threadId) state.liveFrom = Math.min(state.liveFrom, state.lastSeq);
    } else if (req.kind === 'message') {
      if (!state.threadId) {
        // A new thread: everything in it arrives live.
        state.threadId = f.thread_id;
        state.liveFrom = Math.min(state.liveFrom, state.lastSeq);
        writeLocation();
      }
      state.awaitingThread = false;
      renderComposer();
    }
  }

  function onEvent(f) {
    adoptThread(f.thread_id);
    if (f.thread_id !== state.threadId) {
      state.seenThreads.add(f.thread_id);
      return;
    }
    if (typeof f.seq !== 'number' || f.seq <= state.lastSeq) return;
    state.lastSeq = f.seq;
    applyEvent(f);
  }

  function onDelta(f) {
    if (!f.text) return;
    adoptThread(f.thread_id);
    if (f.thread_id !== state.threadId || state.doneRuns.has(f.run_id)) return;
    // Deltas carry no seq: the log may already hold the message they stream (a hint
    // and a log read can cross). A stream whose text is a prefix of the run's last
    // assistant message is that message again, so it stays hidden.
    var stream = state.streams.get(f.run_id);
    if (!stream) {
      var bubble = make('li', 'msg assistant streaming');
      bubble.appendChild(make('p', 'msg-text', ''));
      bubble.setAttribute('aria-busy', 'true');
      stream = { el: bubble, text: '' };
      state.streams.set(f.run_id, stream);
      el.transcript.appendChild(bubble);
    }
    stream.text += f.text;
    var shown = state.finalText.get(f.run_id);
    if (shown !== undefined && shown.indexOf(stream.text) === 0) {
      stream.el.hidden = true;
      if (shown === stream.text) dropStream(f.run_id);
    } else {
      stream.el.hidden = false;
      stream.el.firstChild.textContent = stream.text;
    }
    renderThinking();
    scrollToEnd();
  }

  function adoptThread(threadId) {
    if (!state.threadId && state.awaitingThread && !state.seenThreads.has(threadId)) {
      // The first message of a new thread: its events may come before the ack.
      state.threadId = threadId;
      state.liveFrom = 0;
      writeLocation();
    }
  }

  function onResolved(f) {
    var req = state.requests.get(f.id);
    state.requests.delete(f.id);
    // The card stays "sending" until its card_update event arrives (the log is the truth).
    if (req && req.cardIds) {
      req.cardIds.forEach(function (id) {
        var entry = state.cards.get(id);
        if (entry && entry.card.status !== 'pending') setBusy(id, false);
      });
    }
  }

  function onError(f) {
    var req = f.id ? state.requests.get(f.id) : null;
    if (f.id) state.requests.delete(f.id);
    var message = f.message || f.error || 'error';
    if (f.status === 401) {
      state.authFailed = true;
      return;
    }
    if (req && (req.kind === 'resume' || req.kind === 'continue')) {
      if (f.status === 404 || f.status === 403) {
        // The thread is gone or not ours: start a new one.
        state.threadId = null;
        writeLocation();
        resetView();
      }
      alertText(message);
      return;
    }
    if (req && req.cardIds) {
      req.cardIds.forEach(function (id) {
        var entry = state.cards.get(id);
        if (!entry) return;
        entry.busy = false;
        entry.error = errorText(f);
        renderCard(entry);
      });
      alertText(errorText(f));
      return;
    }
    if (req && req.kind === 'message') {
      state.awaitingThread = false;
      el.composerError.textContent = message;
      renderComposer();
      return;
    }
    el.composerError.textContent = message;
  }

  function errorText(f) {
    var msg = f.message || '';
    switch (f.error) {
      case 'already_decided': return 'Already decided elsewhere: ' + msg;
      case 'stale_hash': return 'This card changed since it was shown; reload the page.';
      case 'expired': return 'This card expired before your decision.';
      case 'unknown_tool': return 'This server cannot act on this card right now (an update is rolling out); try again shortly.';
      case 'not_owner':
      case 'forbidden': return 'Not allowed: ' + msg;
      case 'card_not_found':
      case 'not_found': return 'This card no longer exists.';
      case 'invalid_input':
      case 'tool_validation': return 'Invalid: ' + msg;
      case 'unauthenticated': return 'Your session ended; sign in again.';
      default: break;
    }
    if (f.status === 409) return 'Conflict: ' + msg;
    if (f.status === 410) return 'This card expired before your decision.';
    if (f.status === 503) return 'The service is busy; try again.';
    return msg || f.error || 'Something went wrong';
  }

  // ------------------------------------------------------------------ the view model

  function resetView() {
    state.lastSeq = 0;
    state.liveFrom = Infinity;
    state.cards.clear();
    state.streams.clear();
    state.finalText.clear();
    state.doneRuns.clear();
    state.activeRun = null;
    el.transcript.textContent = '';
    el.empty.hidden = false;
    renderPending();
    renderThinking();
    renderComposer();
  }

  function applyEvent(ev) {
    var data = ev.data || {};
    var live = ev.seq > state.liveFrom;
    switch (ev.kind) {
      case 'user':
        state.activeRun = ev.run_id;
        addMessage('user', textOf(data), ev);
        break;
      case 'assistant': {
        var text = textOf(data);
        var stream = state.streams.get(ev.run_id);
        // The stream was this message (or nothing of it is left to show).
        if (stream && (text.indexOf(stream.text) === 0 || !text)) dropStream(ev.run_id);
        state.finalText.set(ev.run_id, text);
        if (text) addMessage('assistant', text, ev);
        break;
      }
      case 'tool_results':
        addToolErrors(data, ev);
        break;
      case 'card':
      case 'card_update':
        upsertCard(data, live);
        break;
      case 'run':
        dropStream(ev.run_id);
        state.doneRuns.add(ev.run_id);
        if (state.activeRun === ev.run_id) state.activeRun = null;
        if (data.status === 'failed') {
          addNotice('The assistant stopped: ' + (data.error || 'the run failed'), 'error', ev);
        }
        break;
      case 'error':
        addNotice(data.message || data.error || JSON.stringify(data), 'error', ev);
        break;
      default:
        break;
    }
    renderPending();
    renderThinking();
    el.empty.hidden = el.transcript.childElementCount > 0;
    if (live) scrollToEnd();
  }

  function insertItem(node) {
    // Streaming bubbles stay last until their event lands.
    var firstStream = null;
    state.streams.forEach(function (st) { if (!firstStream && st.el.parentNode) firstStream = st.el; });
    if (firstStream) el.transcript.insertBefore(node, firstStream);
    else el.transcript.appendChild(node);
  }

  function addMessage(role, text, ev) {
    var li = make('li', 'msg ' + role);
    li.dataset.seq = ev.seq;
    var who = make('span', 'msg-who', role === 'user' ? 'You' : 'Assistant');
    var time = make('time', 'msg-time', timeOf(ev.at));
    time.dateTime = ev.at || '';
    var meta = make('div', 'msg-meta');
    meta.appendChild(who);
    meta.appendChild(time);
    li.appendChild(meta);
    li.appendChild(make('p', 'msg-text', text));
    insertItem(li);
  }

  function addNotice(text, kind, ev) {
    var li = make('li', 'notice ' + (kind || ''), text);
    li.dataset.seq = ev.seq;
    insertItem(li);
  }

  function addToolErrors(data, ev) {
    // Tool results are for the model; show only the ones that failed before any card
    // (e.g. a customer that does not exist), so the person knows why nothing was proposed.
    var blocks = data.content || [];
    for (var i = 0; i < blocks.length; i++) {
      var b = blocks[i];
      if (b && b.is_error && typeof b.content === 'string' && b.content.indexOf('Confirmation card shown') !== 0) {
        addNotice(b.content, 'tool-error', ev);
      }
    }
  }

  function dropStream(runId) {
    var stream = state.streams.get(runId);
    if (stream) {
      if (stream.el.parentNode) stream.el.parentNode.removeChild(stream.el);
      state.streams.delete(runId);
    }
  }

  // ------------------------------------------------------------------ cards

  function upsertCard(card, live) {
    if (!card || !card.id) return;
    var entry = state.cards.get(card.id);
    var previous = entry ? entry.card.status : null;
    if (!entry) {
      entry = { card: card, el: null, busy: false, error: '', form: null };
      state.cards.set(card.id, entry);
      entry.el = buildCard(card);
      insertItem(entry.el);
    }
    entry.card = card;
    if (card.status !== 'pending') {
      entry.busy = false;
      entry.form = null;
    }
    if (previous !== card.status) entry.error = '';
    renderCard(entry);
    if (live) {
      if (!previous) {
        announce('New confirmation card: ' + card.summary + '. Confirm, reject or edit it.');
      } else if (previous !== card.status) {
        announce('Card ' + (STATUS_LABEL[card.status] || card.status).toLowerCase() + ': ' + card.summary);
      }
    }
  }

  function buildCard(card) {
    var li = make('li', 'card-item');
    var art = make('article', 'card');
    art.id = 'card-' + card.id;
    art.dataset.cardId = card.id;
    art.tabIndex = -1;
    var titleId = 'card-title-' + card.id;
    art.setAttribute('aria-labelledby', titleId);

    var head = make('header', 'card-head');
    var title = make('h2', 'card-title', 'Confirmation');
    title.id = titleId;
    head.appendChild(title);
    head.appendChild(make('span', 'badge risk', ''));
    head.appendChild(make('span', 'badge status', ''));
    art.appendChild(head);

    art.appendChild(make('p', 'card-summary', ''));
    art.appendChild(make('dl', 'impact'));
    art.appendChild(make('div', 'outcome'));
    var err = make('p', 'card-error');
    err.setAttribute('role', 'alert');
    art.appendChild(err);

    var actions = make('div', 'actions');
    actions.setAttribute('role', 'group');
    actions.setAttribute('aria-label', 'Decision');
    var confirm = make('button', 'confirm', 'Confirm');
    confirm.type = 'button';
    confirm.dataset.action = 'confirm';
    var reject = make('button', 'reject', 'Reject');
    reject.type = 'button';
    reject.dataset.action = 'reject';
    var edit = make('button', 'edit', 'Edit');
    edit.type = 'button';
    edit.dataset.action = 'edit';
    var again = make('button', 'again', 'Propose again');
    again.type = 'button';
    again.dataset.action = 'again';
    actions.appendChild(confirm);
    actions.appendChild(reject);
    actions.appendChild(edit);
    actions.appendChild(again);
    art.appendChild(actions);
    art.appendChild(make('div', 'card-form'));
    art.appendChild(make('p', 'progress', ''));

    actions.addEventListener('click', function (ev) {
      var btn = ev.target.closest('button');
      if (!btn || btn.disabled) return;
      onCardAction(card.id, btn.dataset.action);
    });
    li.appendChild(art);
    return li;
  }

  function renderAllCards() {
    state.cards.forEach(renderCard);
  }

  function renderCard(entry) {
    if (!entry || !entry.el) return;
    var card = entry.card;
    var art = entry.el.firstChild;
    var status = card.status;
    art.dataset.status = status;
    art.dataset.risk = card.risk;
    art.setAttribute('aria-busy', entry.busy ? 'true' : 'false');

    var risk = art.querySelector('.badge.risk');
    risk.textContent = card.risk;
    risk.dataset.risk = card.risk;
    risk.title = { read: 'Read only', reversible: 'Can be undone', critical: 'Cannot be undone' }[card.risk] || '';
    var badge = art.querySelector('.badge.status');
    badge.textContent = STATUS_LABEL[status] || status;
    badge.dataset.status = status;

    // The exact stored text, never reformatted, never HTML, and rendered as one
    // paragraph (no pre-wrap): a newline in it cannot draw a line of its own.
    art.querySelector('.card-summary').textContent = card.summary;
    renderImpact(art.querySelector('.impact'), card);
    renderOutcome(art.querySelector('.outcome'), card);
    art.querySelector('.card-error').textContent = entry.error || '';

    var online = !!state.ready;
    var pending = status === 'pending';
    var expired = status === 'expired';
    var actions = art.querySelector('.actions');
    actions.hidden = !(pending || expired);
    var canDecide = pending && online && !entry.busy;
    actions.querySelector('[data-action=confirm]').disabled = !canDecide;
    actions.querySelector('[data-action=reject]').disabled = !canDecide;
    var editBtn = actions.querySelector('[data-action=edit]');
    editBtn.hidden = !(card.editable && card.editable.length);
    editBtn.disabled = !canDecide;
    var again = actions.querySelector('[data-action=again]');
    again.hidden = !expired;
    again.disabled = !online;

    var formBox = art.querySelector('.card-form');
    if (!pending || !entry.form) {
      formBox.textContent = '';
    } else {
      formBox.querySelectorAll('input, button, textarea').forEach(function (n) {
        n.disabled = entry.busy || !online;
      });
    }
    art.querySelector('.progress').textContent = entry.busy ? 'Sending your decision…' : '';
  }

  function renderImpact(dl, card) {
    dl.textContent = '';
    var impact = card.impact || {};
    function row(label, value, cls) {
      var dt = make('dt', cls ? cls + '-label' : '', label);
      var dd = make('dd', cls ? cls + '-value' : '', value);
      dl.appendChild(dt);
      dl.appendChild(dd);
    }
    // Values the model supplied (a description, an address): each in its own labelled
    // row, as text, after the code-written summary and never inside it.
    if (Array.isArray(impact.fields)) {
      impact.fields.forEach(function (f) {
        if (f && typeof f.label === 'string' && typeof f.value === 'string') {
          row(f.label, f.value, 'field');
        }
      });
    }
    if (impact.amount !== undefined) row('Amount', impact.amount);
    else if (impact.amount_cents !== undefined) row('Amount', (impact.amount_cents / 100).toFixed(2));
    if (impact.target !== undefined) row('Target', impact.target);
    if (impact.reversible !== undefined) {
      row('Reversible', impact.reversible ? 'Yes — can be undone' : 'No — cannot be undone');
    }
    if (impact.side_effects && impact.side_effects.length) {
      row('Side effects', impact.side_effects.join('; '));
    }
    if (card.status === 'pending' && card.expires_at) {
      row('Expires', timeOf(card.expires_at));
    }
  }

  function renderOutcome(box, card) {
    box.textContent = '';
    var status = card.status;
    var result = card.result || {};
    function line(text, cls) { box.appendChild(make('p', cls || 'outcome-line', text)); }
    function by() {
      var where = {whatsapp: 'no WhatsApp', ws: 'in the chat', http: 'through the API'}[card.channel] || card.channel;
      return card.decided_by ? ' by ' + card.decided_by + (where ? ' (' + where + ')' : '') : '';
    }
    if (status === 'executed') {
      line('Done' + by() + '.');
      var dl = make('dl', 'result');
      Object.keys(result).forEach(function (k) {
        dl.appendChild(make('dt', '', k));
        dl.appendChild(make('dd', '', valueText(result[k])));
      });
      if (dl.childElementCount) box.appendChild(dl);
    } else if (status === 'rejected') {
      line('Rejected' + by() + '. Nothing was done.');
      if (card.reason) line('Reason: ' + card.reason, 'reason');
    } else if (status === 'expired') {
      line('Expired without a decision. Nothing was done.');
    } else if (status === 'superseded') {
      line('Superseded by a newer message. Nothing was done.');
    } else if (status === 'modified') {
      line('Edited' + by() + '; replaced by a new card.');
      if (card.superseded_by) {
        var a = make('a', 'new-card-link', 'Go to the new card');
        a.href = '#card-' + card.superseded_by;
        a.addEventListener('click', function (ev) {
          ev.preventDefault();
          var target = document.getElementById('card-' + card.superseded_by);
          if (target) { target.scrollIntoView({ block: 'center' }); target.focus(); }
        });
        box.appendChild(a);
      }
    } else if (status === 'invalidated') {
      line('Approved' + by() + ', but NOT executed: ' + (result.reason || 'something changed') + '.');
      var changes = result.changes || [];
      if (changes.length) {
        var ul = make('ul', 'changes');
        changes.forEach(function (c) {
          ul.appendChild(make('li', '', (c.field || '?') + ': approved ' + valueText(c.approved) + ', now ' + valueText(c.current)));
        });
        box.appendChild(ul);
      }
    } else if (status === 'failed') {
      line('Failed: ' + (result.error || 'unknown error') + '.');
    } else if (status === 'approved') {
      line('Approved' + by() + '. Running…');
    } else if (status === 'executing') {
      line('Approved' + by() + '. Executing…');
    }
    if (card.needs_reconciliation) {
      line('Outcome unknown: flagged for an operator to reconcile. Do not retry.', 'warn');
    }
  }

  function setBusy(cardId, busy) {
    var entry = state.cards.get(cardId);
    if (!entry) return;
    entry.busy = busy;
    renderCard(entry);
  }

  function onCardAction(cardId, action) {
    var entry = state.cards.get(cardId);
    if (!entry || entry.busy) return;
    if (action === 'again') {
      sendMessage('Proponha novamente: ' + entry.card.summary);
      return;
    }
    if (entry.card.status !== 'pending') return;
    if (action === 'confirm') {
      resolve(entry, 'approve', {});
    } else if (action === 'reject') {
      openRejectForm(entry);
    } else if (action === 'edit') {
      openEditForm(entry);
    }
  }

  function resolve(entry, decision, extra) {
    var card = entry.card;
    var id = frameId();
    var frame = {
      type: 'resolve',
      id: id,
      card_id: card.id,
      decision: decision,
      snapshot_hash: card.snapshot_hash
    };
    if (extra.reason) frame.reason = extra.reason;
    if (extra.edits) frame.edits = extra.edits;
    // Disable at once: a second click finds the buttons disabled and the card busy.
    entry.busy = true;
    entry.error = '';
    renderCard(entry);
    state.requests.set(id, { kind: 'resolve', cardIds: [card.id] });
    if (!send(frame)) {
      state.requests.delete(id);
      entry.busy = false;
      entry.error = 'Not connected; try again when the page is back online.';
      renderCard(entry);
    }
  }

  function formShell(entry, kind, label) {
    var box = entry.el.querySelector('.card-form');
    box.textContent = '';
    var form = make('form', 'inline-form ' + kind);
    form.setAttribute('aria-label', label);
    form.noValidate = true;
    box.appendChild(form);
    entry.form = kind;
    return form;
  }

  function formButtons(form, submitText, submitClass, entry) {
    var row = make('div', 'form-buttons');
    var ok = make('button', submitClass, submitText);
    ok.type = 'submit';
    var cancel = make('button', 'ghost', 'Cancel');
    cancel.type = 'button';
    cancel.addEventListener('click', function () {
      entry.form = null;
      renderCard(entry);
      var back = entry.el.querySelector('[data-action=confirm]');
      if (back) back.focus();
    });
    row.appendChild(ok);
    row.appendChild(cancel);
    form.appendChild(row);
  }

  function openRejectForm(entry) {
    var form = formShell(entry, 'reject-form', 'Reject this card');
    var fid = 'reason-' + entry.card.id;
    var label = make('label', '', 'Reason (optional)');
    label.htmlFor = fid;
    var input = make('input');
    input.id = fid;
    input.name = 'reason';
    input.type = 'text';
    input.maxLength = 2000;
    input.autocomplete = 'off';
    form.appendChild(label);
    form.appendChild(input);
    formButtons(form, 'Reject', 'reject', entry);
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (entry.busy) return;
      var reason = input.value.trim();
      resolve(entry, 'reject', reason ? { reason: reason } : {});
    });
    input.focus();
  }

  function prefill(card, field) {
    var args = card.args_snapshot || {};
    var impact = card.impact || {};
    if (args[field] !== undefined && args[field] !== null && typeof args[field] !== 'object') {
      return String(args[field]);
    }
    var cents = args[field + '_cents'];
    if (cents === undefined && field === 'amount') cents = impact.amount_cents;
    if (typeof cents === 'number') return (cents / 100).toFixed(2).replace('.', ',');
    return '';
  }

  function openEditForm(entry) {
    var card = entry.card;
    var form = formShell(entry, 'edit-form', 'Edit this card');
    var initial = {};
    var inputs = {};
    (card.editable || []).forEach(function (field) {
      var fid = 'edit-' + field + '-' + card.id;
      var label = make('label', '', FIELD_LABEL[field] || field);
      label.htmlFor = fid;
      var input = make('input');
      input.id = fid;
      input.name = field;
      input.type = field === 'email' ? 'email' : 'text';
      if (field === 'amount') input.inputMode = 'decimal';
      input.autocomplete = 'off';
      input.value = initial[field] = prefill(card, field);
      inputs[field] = input;
      form.appendChild(label);
      form.appendChild(input);
    });
    var note = make('p', 'form-note', 'Saving proposes a new card with the new values; you confirm that one.');
    form.appendChild(note);
    formButtons(form, 'Propose edited card', 'edit', entry);
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (entry.busy) return;
      var edits = {};
      var any = false;
      Object.keys(inputs).forEach(function (field) {
        var value = inputs[field].value.trim();
        if (value !== '' && value !== initial[field]) { edits[field] = value; any = true; }
      });
      if (!any) {
        entry.error = 'Change a field first.';
        renderCard(entry);
        return;
      }
      resolve(entry, 'edit', { edits: edits });
    });
    var first = form.querySelector('input');
    if (first) { first.focus(); first.select(); }
  }

  // ------------------------------------------------------------------ pending + batch

  function pendingCards() {
    var out = [];
    state.cards.forEach(function (entry) { if (entry.card.status === 'pending') out.push(entry); });
    return out;
  }

  function renderPending() {
    var pending = pendingCards();
    var n = pending.length;
    el.pending.hidden = n === 0;
    el.pendingText.textContent = n === 1 ? '1 confirmation pending' : n + ' confirmations pending';
    var busy = pending.some(function (e) { return e.busy; });
    var batch = n > 1;
    el.confirmAll.hidden = !batch;
    el.rejectAll.hidden = !batch;
    el.confirmAll.disabled = busy || !state.ready;
    el.rejectAll.disabled = busy || !state.ready;
    el.confirmAll.textContent = 'Confirm all ' + n;
    el.rejectAll.textContent = 'Reject all ' + n;
  }

  function batch(decision) {
    var pending = pendingCards().filter(function (e) { return !e.busy; });
    if (!pending.length) return;
    var byRun = new Map();
    pending.forEach(function (e) {
      var list = byRun.get(e.card.run_id) || [];
      list.push(e);
      byRun.set(e.card.run_id, list);
      e.busy = true;
      e.error = '';
      renderCard(e);
    });
    renderPending();
    byRun.forEach(function (entries, runId) {
      var body = {
        decisions: entries.map(function (e) {
          return { card_id: e.card.id, decision: decision, snapshot_hash: e.card.snapshot_hash };
        })
      };
      fetch('/v1/runs/' + encodeURIComponent(runId) + '/decisions', {
        method: 'POST',
        headers: { 'Authorization': 'Bearer ' + state.token, 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
        credentials: 'omit',
        cache: 'no-store'
      }).then(function (res) {
        return res.json().then(function (data) { return { res: res, data: data }; });
      }).then(function (r) {
        if (!r.res.ok) throw { status: r.res.status, error: r.data.error, message: r.data.message };
        (r.data.results || []).forEach(function (item) {
          var entry = state.cards.get(item.card_id);
          if (!entry) return;
          if (!item.ok) {
            entry.busy = false;
            entry.error = errorText({ error: item.error, message: item.message });
            renderCard(entry);
          } else if (entry.card.status !== 'pending') {
            setBusy(entry.card.id, false);
          }
        });
        renderPending();
      }).catch(function (err) {
        entries.forEach(function (e) {
          e.busy = false;
          e.error = errorText(err && err.status ? err : { message: 'Network error: ' + err });
          renderCard(e);
        });
        renderPending();
      });
    });
  }

  // ------------------------------------------------------------------ composer

  function renderThinking() {
    var streaming = false;
    state.streams.forEach(function (st) { if (!st.el.hidden) streaming = true; });
    var working = !!state.activeRun && !streaming &&
      !pendingCards().some(function (e) { return e.card.run_id === state.activeRun; });
    el.thinking.hidden = !working;
  }

  function renderComposer() {
    el.send.disabled = !state.ready || state.awaitingThread;
  }

  function sendMessage(text) {
    text = (text || '').trim();
    if (!text) return false;
    if (state.awaitingThread) return false;
    var id = frameId();
    var frame = { type: 'message', id: id, text: text };
    if (state.threadId) frame.thread_id = state.threadId;
    else state.awaitingThread = true;
    state.requests.set(id, { kind: 'message' });
    el.composerError.textContent = '';
    if (!send(frame)) {
      state.requests.delete(id);
      state.awaitingThread = false;
      el.composerError.textContent = 'Not connected; your message was not sent.';
      return false;
    }
    renderComposer();
    return true;
  }

  // ------------------------------------------------------------------ start

  function init() {
    el.conn = $('conn');
    el.who = $('who');
    el.logout = $('logout');
    el.newChat = $('new-chat');
    el.login = $('login');
    el.loginForm = $('login-form');
    el.loginError = $('login-error');
    el.tokenInput = $('token-input');
    el.chat = $('chat');
    el.pending = $('pending');
    el.pendingText = $('pending-text');
    el.confirmAll = $('confirm-all');
    el.rejectAll = $('reject-all');
    el.transcript = $('transcript');
    el.empty = $('empty');
    el.thinking = $('thinking');
    el.composer = $('composer');
    el.text = $('text');
    el.send = $('send');
    el.composerError = $('composer-error');
    el.announcer = $('announcer');
    el.alerts = $('alerts');

    el.loginForm.addEventListener('submit', function (ev) {
      ev.preventDefault();
      var token = el.tokenInput.value.trim();
      if (!token) { el.loginError.textContent = 'Paste a token first.'; return; }
      store(TOKEN_KEY, token);
      state.token = token;
      el.tokenInput.value = '';
      el.loginError.textContent = '';
      state.attempt = 0;
      connect();
    });
    el.logout.addEventListener('click', signOut);
    el.newChat.addEventListener('click', function () {
      if (state.threadId) state.seenThreads.add(state.threadId);
      state.threadId = null;
      state.awaitingThread = false;
      writeLocation();
      resetView();
      el.empty.hidden = false;
      el.text.focus();
    });
    el.confirmAll.addEventListener('click', function () { batch('approve'); });
    el.rejectAll.addEventListener('click', function () { batch('reject'); });
    el.composer.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (sendMessage(el.text.value)) el.text.value = '';
    });
    el.text.addEventListener('keydown', function (ev) {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        if (!el.send.disabled && sendMessage(el.text.value)) el.text.value = '';
      }
    });
    window.addEventListener('online', function () {
      if (!state.ws && state.token) { state.attempt = 0; connect(); }
    });

    readLocation();
    resetView();
    if (state.token) connect();
    else showLogin('');
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
