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
  // The heartbeat (docs/websocket.md `ping`): after this much silence a ping, and with no
  // frame back within the wait, the socket is taken as gone. A test may shorten both
  // (sessionStorage "signoff.heartbeat" = "every,wait" in ms).
  var HEARTBEAT = (function () {
    var given = [];
    try { given = (window.sessionStorage.getItem('signoff.heartbeat') || '').split(','); } catch (e) { /* none */ }
    var every = parseInt(given[0], 10), wait = parseInt(given[1], 10);
    return { every: every > 0 ? every : 15000, wait: wait > 0 ? wait : 10000 };
  })();

  var I = window.SignoffI18n;
  var V = window.SignoffViews;
  var T = window.SignoffThreads;
  var t = I.t;

  function statusLabel(status) {
    var text = t('status.' + status);
    return text === 'status.' + status ? status : text;
  }

  function fieldLabel(field, card) {
    var text = t('field.' + field);
    if (text === 'field.' + field) return field;
    // An amount says its currency: the card's own (impact.currency), else reais.
    if (field === 'amount') return text + ' (' + currencySymbol((card && card.impact || {}).currency || 'BRL') + ')';
    return text;
  }

  function currencySymbol(currency) {
    try {
      var parts = new Intl.NumberFormat(I.locale(), { style: 'currency', currency: currency }).formatToParts(0);
      for (var i = 0; i < parts.length; i++) if (parts[i].type === 'currency') return parts[i].value;
    } catch (e) { /* an unknown code: shown as it is */ }
    return String(currency);
  }

  var el = {};
  var state = {
    token: null,
    user: null,
    threadId: null,
    retry: null, // {text, key} of a message not known to be taken: sent again as it was
    againOf: null, // {card, text}: a "Propose again" waiting on the composer's question
    batchIds: null, // the cards "Confirm all" asks about, while it asks
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
    hint: null, // the app's example request (its ready frame's hint)
    // The view model, rebuilt from events only.
    lastSeq: 0,
    liveFrom: Infinity, // events with a larger seq arrived live (announce them)
    cards: new Map(), // card id -> {card, el, busy, error, form}
    streams: new Map(), // run id -> {el, text}: the streaming assistant bubble
    finalText: new Map(), // run id -> text of its last assistant event
    doneRuns: new Set(), // runs that ended (late deltas are dropped)
    activeRun: null,
    conn: { kind: 'offline', key: 'conn.offline', vars: null },
    threadsTimer: null,
    threadsAsked: false,
    // Opened with no conversation (a new tab, the dev URL): the first thread list opens
    // the most recent one with a card waiting. Never after "New chat" or a first message.
    offerWaiting: false
  };

  // ------------------------------------------------------------------ helpers

  function $(id) { return document.getElementById(id); }

  function make(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // The sign-in is the browser's (localStorage): a thread opened in a new tab (each
  // list line is a link) is signed in too, until the token expires or "Sign out". The
  // open thread is the tab's own (sessionStorage).
  function area(key) { return key === TOKEN_KEY ? localStorage : sessionStorage; }

  function store(key, value) {
    try {
      if (value === null || value === undefined) area(key).removeItem(key);
      else area(key).setItem(key, value);
    } catch (e) { /* storage disabled: the URL still carries the thread */ }
  }

  function stored(key) {
    try { return area(key).getItem(key); } catch (e) { return null; }
  }

  function frameId() { return 'c' + (state.nextId++); }

  function messageKey() {
    var bytes = new Uint8Array(16);
    window.crypto.getRandomValues(bytes);
    return Array.prototype.map.call(bytes, function (b) {
      return (b < 16 ? '0' : '') + b.toString(16);
    }).join('');
  }

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

  function timeOf(iso) { return I.time(iso); }

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

  var valueText = V.plain;

  // ------------------------------------------------------------------ URL / login

  function readLocation() {
    var hash = window.location.hash.replace(/^#/, '');
    var params = new URLSearchParams(hash);
    var token = params.get('token');
    var url = new URL(window.location.href);
    if (token) {
      // A link signs in a tab that has no session. It never replaces a session of another
      // user without a word: a link someone sent could otherwise sign this tab in as them,
      // and what is typed or confirmed here would be theirs. Signing out first switches.
      var current = stored(TOKEN_KEY);
      if (current && expired(current)) current = null; // an expired session is none
      if (current && current !== token && principalOf(current) !== principalOf(token)) {
        // The link's user is not named: its token is unverified here, and its text would
        // be the attacker's words in the page's own alert.
        state.linkRefused = { now: userOf(current) };
      } else {
        // The same user's token (a renewal) is taken, the session kept to fall back on:
        // what a token claims is unverified here, and a forged one must not sign out.
        if (current && current !== token) state.fallbackToken = current;
        store(TOKEN_KEY, token);
      }
      url.hash = '';
    }
    var thread = url.searchParams.get('thread');
    if (thread) store(THREAD_KEY, thread);
    history.replaceState(null, '', url.pathname + url.search);
    state.token = stored(TOKEN_KEY);
    state.threadId = thread || stored(THREAD_KEY);
    state.offerWaiting = !state.threadId;
    writeLocation();
  }

  function claimsOf(token) {
    // What a token claims, unverified: only to tell whose a link is; the gateway
    // verifies every token.
    try {
      var part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
      var claims = JSON.parse(decodeURIComponent(escape(atob(part))));
      return claims && typeof claims === 'object' ? claims : {};
    } catch (e) {
      return {};
    }
  }

  function userOf(token) {
    var sub = claimsOf(token).sub;
    return typeof sub === 'string' ? sub : '?';
  }

  function expired(token) {
    var exp = claimsOf(token).exp;
    return typeof exp === 'number' && exp * 1000 <= Date.now();
  }

  function principalOf(token) {
    var c = claimsOf(token);
    return JSON.stringify([c.sub, c.tenant]);
  }

  function writeLocation(push) {
    var url = new URL(window.location.href);
    if (state.threadId) url.searchParams.set('thread', state.threadId);
    else url.searchParams.delete('thread');
    url.hash = '';
    var here = url.pathname + url.search;
    // A conversation the person opened is a step Back returns from (it left the page).
    if (push && here !== window.location.pathname + window.location.search) {
      history.pushState(null, '', here);
    } else {
      history.replaceState(null, '', here);
    }
    store(THREAD_KEY, state.threadId);
  }

  function showLogin(message) {
    el.login.hidden = false;
    el.chat.hidden = true;
    el.composer.hidden = true;
    el.logout.hidden = true;
    el.newChat.hidden = true;
    el.threads.hidden = true;
    el.threadsToggle.hidden = true;
    el.loginError.textContent = message || '';
    setConn('offline', 'conn.signedOut');
    el.tokenInput.focus();
  }

  function showChat() {
    el.login.hidden = true;
    el.chat.hidden = false;
    el.composer.hidden = false;
    el.logout.hidden = false;
    el.newChat.hidden = false;
    el.threads.hidden = false;
    el.threadsToggle.hidden = false;
  }

  function signOut() {
    store(TOKEN_KEY, null);
    state.token = null;
    disconnect();
    showLogin('');
  }

  // ------------------------------------------------------------------ connection

  function setConn(kind, key, vars) {
    state.conn = { kind: kind, key: key, vars: vars || null };
    el.conn.dataset.state = kind;
    el.conn.textContent = t(key, vars);
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
    setConn('connecting', 'conn.connecting');
    ws.onopen = function () {
      ws.send(JSON.stringify({ type: 'auth', token: state.token }));
      heard(ws);
    };
    ws.onmessage = function (ev) {
      if (state.ws !== ws) return;
      heard(ws);
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
        var fallback = state.fallbackToken;
        state.fallbackToken = null;
        if (fallback && fallback !== state.token && !expired(fallback)) {
          // A link's token was refused: back to the session it was to replace.
          store(TOKEN_KEY, fallback);
          state.token = fallback;
          state.reconnectTimer = window.setTimeout(connect, 0);
          return;
        }
        store(TOKEN_KEY, null);
        state.token = null;
        showLogin(t('login.refused'));
        return;
      }
      if (ev.code === RECONNECT_ELSEWHERE) {
        // The gateway is stopping: reconnect now to the same URL (the load balancer sends
        // us to another gateway) and continue after the last event shown.
        state.moved = true;
        setConn('connecting', 'conn.connecting');
        state.reconnectTimer = window.setTimeout(connect, Math.round(Math.random() * 250));
        return;
      }
      scheduleReconnect();
    };
    ws.onerror = function () { /* a close event follows */ };
  }

  // A frame came on ``ws``: it carries. Ping after a silence; nothing back in time, and the
  // socket is let go as if it had closed (a network gone without the browser knowing:
  // the page said "Online" while nothing went through).
  function heard(ws) {
    window.clearTimeout(state.pingTimer);
    window.clearTimeout(state.pongTimer);
    state.pingTimer = window.setTimeout(function () {
      if (state.ws !== ws) return;
      // Not ready yet: the auth is the ping (a socket stalled from the start is let go too).
      send({ type: 'ping', id: frameId() });
      state.pongTimer = window.setTimeout(function () {
        if (state.ws !== ws) return;
        lose(ws);
        scheduleReconnect();
      }, HEARTBEAT.wait);
    }, HEARTBEAT.every);
  }

  // Let ``ws`` go as if it had closed: its requests get no answer (handed back).
  function lose(ws) {
    state.ws = null;
    state.ready = false;
    dropRequests();
    window.clearTimeout(state.reconnectTimer);
    window.clearTimeout(state.pingTimer);
    window.clearTimeout(state.pongTimer);
    try { ws.close(1000); } catch (e) { /* already closing */ }
  }

  function scheduleReconnect() {
    var base = Math.min(BACKOFF_MAX, BACKOFF_MIN * Math.pow(2, state.attempt));
    var delay = Math.round(base / 2 + Math.random() * base / 2);
    state.attempt += 1;
    setConn('offline', 'conn.retry', { s: Math.max(1, Math.round(delay / 1000)) });
    state.reconnectTimer = window.setTimeout(connect, delay);
  }

  function dropRequests() {
    // Requests in flight on a dead socket get no answer; the replay after the
    // reconnect shows what really happened. A message among them may or may not have
    // been taken: its text goes back in the box, to be sent again under its key (the
    // server runs it once, in the thread its first send made, design note 54).
    var unanswered = null;
    state.requests.forEach(function (req) {
      if (req.cardIds) {
        req.cardIds.forEach(function (id) {
          // Said on the card: it looked undecided, as if the click was lost (a
          // first-hour walkthrough); the replay shows what happened once back online.
          var entry = state.cards.get(id);
          if (entry && entry.card.status === 'pending') entry.error = t('card.unknown');
          setBusy(id, false);
        });
      }
      if (req.kind === 'message') unanswered = req;
    });
    state.requests.clear();
    state.awaitingThread = false;
    if (unanswered) {
      state.retry = { text: unanswered.text, key: unanswered.key, thread: state.threadId };
      if (!el.text.value.trim()) el.text.value = unanswered.text;
      el.composerError.textContent = t('composer.maybeQueued');
      renderComposer();
    }
  }

  // ------------------------------------------------------------------ frames

  function onFrame(f) {
    switch (f.type) {
      case 'ready': return onReady(f);
      case 'ack': return onAck(f);
      case 'event': return onEvent(f);
      case 'delta': return onDelta(f);
      case 'notice': return onNotice(f);
      case 'resolved': return onResolved(f);
      case 'error': return onError(f);
      case 'threads': return onThreads(f);
      case 'threads_changed': return askThreadsSoon();
      default: return undefined;
    }
  }

  function onReady(f) {
    state.fallbackToken = null; // the token in use was accepted
    var moved = state.moved;
    state.moved = false;
    state.ready = true;
    state.attempt = 0;
    state.user = f.user || state.user;
    state.hint = f.hint || null;
    renderEmpty();
    el.who.textContent = state.user ? t('who', { user: state.user }) : '';
    state.seenThreads.clear();
    setConn('online', 'conn.online');
    askThreads();
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

  // The empty thread's line: the app's own example request (its ready frame's hint, one
  // text or one per language), or none: the demo's examples are not every app's.
  function renderEmpty() {
    var hint = state.hint;
    var example = typeof hint === 'string' ? hint
      : (hint && (hint[I.lang] || hint[I.lang.split('-')[0]] || hint.en || hint[Object.keys(hint)[0]])) || '';
    el.empty.textContent = example ? t('empty.example', { example: example }) : t('empty');
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
        T.setCurrent(state.threadId);
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
    state.notice = null;  // the model answers again
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

  // A run's passing state (the model cannot be reached: the turn is tried again): said
  // beside "working…" until the run streams, writes or ends.
  function onNotice(f) {
    if (f.thread_id !== state.threadId || state.doneRuns.has(f.run_id)) return;
    if (f.notice !== 'model_unavailable') return;
    state.notice = { run: f.run_id, key: 'notice.modelUnavailable' };
    renderThinking();
  }

  function adoptThread(threadId) {
    if (!state.threadId && state.awaitingThread && !state.seenThreads.has(threadId)) {
      // The first message of a new thread: its events may come before the ack.
      state.threadId = threadId;
      state.liveFrom = 0;
      writeLocation();
      T.setCurrent(threadId);
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
    if (req && req.kind === 'threads') {
      // The list could not be read or followed now (a 503): it is asked again on the
      // next change signal or reconnect; the conversation itself is unaffected.
      return;
    }
    if (req && (req.kind === 'resume' || req.kind === 'continue')) {
      if (f.status === 404 || f.status === 403) {
        // The thread is gone or not ours: start a new one, and say so where it is seen
        // (a screen reader's alert alone left a sighted person before an empty chat).
        state.threadId = null;
        writeLocation();
        resetView();
        message = t('thread.unavailable');
        el.composerError.textContent = message;
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
        // Refused (4xx: nothing was done): a form still open is unsent again, and is said
        // to be "not sent" if the card is then decided elsewhere (a review: it was lost)
        if (f.status >= 400 && f.status < 500) entry.sent = false;
        renderCard(entry);
        // An edit the tool refused: its fields are marked and described by the card's
        // error, and the first one takes focus to be fixed (focus went to the card).
        var inputs = entry.form === 'edit-form' && f.status === 422 ?
          entry.el.querySelectorAll('.card-form input') : [];
        var errorId = 'card-error-' + entry.card.id;
        entry.el.querySelector('.card-error').id = errorId;
        Array.prototype.forEach.call(inputs, function (input) {
          input.setAttribute('aria-invalid', 'true');
          input.setAttribute('aria-describedby', errorId);
          input.addEventListener('input', function () { input.removeAttribute('aria-invalid'); }, { once: true });
        });
        if (inputs.length) inputs[0].focus();
      });
      alertText(errorText(f));
      return;
    }
    if (req && req.kind === 'message') {
      state.awaitingThread = false;
      var where = f.detail && f.detail.thread_id;
      if (where && !state.threadId) {
        // A new thread whose message may be queued: it stays, and may yet run there.
        state.threadId = where;
        state.liveFrom = Math.min(state.liveFrom, state.lastSeq);
        writeLocation();
        T.setCurrent(where);
      }
      if (f.status === 503 || f.status === 429) {
        // Not taken, or not known to be: the text goes back in the box, to be sent
        // again under the same key (it cannot run twice).
        state.retry = { text: req.text, key: req.key, thread: state.threadId };
        if (!el.text.value.trim()) el.text.value = req.text;
        message = where && f.status === 503 ? t('composer.maybeQueued')
          : t('composer.notTaken', { msg: message });
      }
      el.composerError.textContent = message;
      renderComposer();
      return;
    }
    el.composerError.textContent = message;
  }

  function errorText(f) {
    // A tool's refusal may come in several languages (detail.localized): the person's.
    var localized = f.detail && f.detail.localized;
    var msg = (localized && I.label(localized)) || f.message || '';
    switch (f.error) {
      case 'already_decided': return t('err.already', { msg: msg });
      case 'stale_hash': return t('err.stale');
      case 'expired': return t('err.expired');
      case 'unknown_tool': return t('err.unknownTool');
      case 'not_owner':
      case 'forbidden': return t('err.forbidden', { msg: msg });
      case 'card_not_found':
      case 'not_found': return t('err.gone');
      case 'invalid_input':
      case 'tool_validation': return t('err.invalid', { msg: msg });
      case 'unauthenticated': return t('err.session');
      case 'workflow_thread': return t('composer.workflow');
      default: break;
    }
    if (f.status === 409) return t('err.conflict', { msg: msg });
    if (f.status === 410) return t('err.expired');
    if (f.status === 503) return t('err.busy');
    return msg || f.error || t('err.generic');
  }

  // ------------------------------------------------------------------ thread list

  function askThreads() {
    window.clearTimeout(state.threadsTimer);
    state.threadsTimer = null;
    if (!state.ready) return;
    var id = frameId();
    state.requests.set(id, { kind: 'threads' });
    send({ type: 'threads', id: id });
  }

  function askThreadsSoon() {
    // Changes come in bursts (a message, its card, the card's update): list once.
    if (state.threadsTimer) return;
    state.threadsTimer = window.setTimeout(askThreads, 250);
  }

  function onThreads(f) {
    state.requests.delete(f.id);
    var list = f.threads || [];
    T.show(list, state.threadId);
    var offer = state.offerWaiting && !state.threadId && !state.awaitingThread;
    state.offerWaiting = false;
    if (!offer) return;
    for (var i = 0; i < list.length; i++) { // most recently active first
      if (list[i].pending > 0) { openThread(list[i].id); return; }
    }
  }

  // ``push``: the person chose it (the list): Back goes to the one before.
  function openThread(threadId, push) {
    if (threadId === state.threadId) { scrollToEnd(); el.text.focus(); return; }
    if (state.threadId) state.seenThreads.add(state.threadId);
    state.threadId = threadId;
    state.awaitingThread = false;
    writeLocation(push);
    resetView();
    T.setCurrent(threadId);
    if (state.ready) {
      var id = frameId();
      state.requests.set(id, { kind: 'resume' });
      send({ type: 'resume', id: id, thread_id: threadId, after_seq: 0 });
    }
    el.text.focus();
  }

  // ------------------------------------------------------------------ the view model

  function resetView() {
    hideGuard();
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
          addNotice(t('run.failed', { error: data.error || t('run.failedDefault') }), 'error', ev);
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
    // Live events, and the last one of a replay (a reload, a reconnect): the newest
    // message is in view.
    if (live || ev.seq === state.liveFrom) scrollToEnd();
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
    // On a workflow's thread the "user" message is the agent step's prompt, written by
    // the workflow, not by the person (a newcomer probe: it said "You").
    var mine = role === 'user' && !isWorkflowThread(state.threadId);
    var who = make('span', 'msg-who',
      mine ? t('msg.you') : role === 'user' ? t('msg.workflow') : t('msg.assistant'));
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

  function addToolNotice(message, ev) {
    // The sentence in the person's language; the tool's own words (meant for the
    // model, often in another language) only behind "details".
    var li = make('li', 'notice tool-error');
    li.dataset.seq = ev.seq;
    var box = make('details', 'tool-detail');
    box.appendChild(make('summary', '', t('notice.tool')));
    box.appendChild(make('p', 'tool-message', message));
    li.appendChild(box);
    insertItem(li);
  }

  function addToolErrors(data, ev) {
    // Tool results are for the model; show only the ones that failed before any card
    // (e.g. a customer that does not exist), so the person knows why nothing was proposed.
    var blocks = data.content || [];
    for (var i = 0; i < blocks.length; i++) {
      var b = blocks[i];
      if (b && b.is_error && typeof b.content === 'string' && b.content.indexOf('Confirmation card shown') !== 0) {
        addToolNotice(b.content, ev);
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
    var fresh = !entry;
    if (!entry) {
      entry = { card: card, el: null, busy: false, error: '', form: null };
      state.cards.set(card.id, entry);
      entry.el = buildCard(card);
      insertItem(entry.el);
    }
    entry.card = card;
    // A form still open (not sent) when the card left "pending" elsewhere: say that
    // what was typed in it was not sent, rather than let it vanish without a word.
    var dropped =
      card.status !== 'pending' && entry.form && !entry.busy && !entry.sent ? entry.form : null;
    if (card.status !== 'pending') {
      entry.busy = false;
      entry.form = null;
      dropDraft(card.id);
    }
    if (previous !== card.status) entry.error = '';
    if (dropped && previous === 'pending') {
      entry.dropped = t(
        (dropped === 'edit-form' ? 'form.droppedEdit' : 'form.droppedReject') +
          (card.status === 'expired' ? 'Expired' : '')
      );
    }
    renderCard(entry);
    if (fresh && card.status === 'pending') restoreDraft(entry);
    if (live) {
      if (!previous) {
        announce(t('announce.new', { summary: card.summary }));
      } else if (previous !== card.status && card.status !== 'executing') {
        // (not the passing "executing": one confirm read the whole summary three times)
        announce(t('announce.status', { status: statusLabel(card.status).toLowerCase(), summary: card.summary }));
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
    var title = make('h2', 'card-title', t('card.title'));
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
    actions.setAttribute('aria-label', t('card.decision'));
    var confirm = make('button', 'confirm', t('btn.confirm'));
    confirm.type = 'button';
    confirm.dataset.action = 'confirm';
    var reject = make('button', 'reject', t('btn.reject'));
    reject.type = 'button';
    reject.dataset.action = 'reject';
    var edit = make('button', 'edit', t('btn.edit'));
    edit.type = 'button';
    edit.dataset.action = 'edit';
    var again = make('button', 'again', t('btn.again'));
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

  // A card of the same tool shown after ``card`` (the request was made again).
  function laterCardOf(card) {
    var later = false;
    state.cards.forEach(function (other) {
      if (other.card.tool === card.tool && other.card.created_at > card.created_at) later = true;
    });
    return later;
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
    risk.textContent = t('risk.' + card.risk);
    risk.dataset.risk = card.risk;
    risk.title = t('risk.' + card.risk + '.title');
    var badge = art.querySelector('.badge.status');
    badge.textContent = statusLabel(status);
    badge.dataset.status = status;

    // The exact stored text, never reformatted, never HTML, and rendered as one
    // paragraph (no pre-wrap): a newline in it cannot draw a line of its own.
    art.querySelector('.card-summary').textContent = card.summary;
    renderImpact(art.querySelector('.impact'), card);
    renderOutcome(art.querySelector('.outcome'), card);
    // (a form's text that was not sent stays said while the card moves on: approved,
    // executing, executed)
    art.querySelector('.card-error').textContent = entry.error || entry.dropped || '';

    var online = !!state.ready;
    var pending = status === 'pending';
    var expired = status === 'expired';
    var actions = art.querySelector('.actions');
    actions.hidden = !(pending || expired);
    var canDecide = pending && online && !entry.busy;
    // Named with its summary: every card and its buttons sounded the same to a screen
    // reader ("Confirmation", "Decision", "Confirm").
    actions.setAttribute('aria-label', t('card.decision') + ': ' + card.summary);
    art.setAttribute('aria-label', t('card.title') + ': ' + card.summary);
    art.querySelector('.card-title').textContent = t('card.title');
    // One action per intent: with the reject form open its own button is the Reject;
    // with the edit form open, Confirm would approve the old values, so it waits.
    var confirmBtn = actions.querySelector('[data-action=confirm]');
    confirmBtn.textContent = t('btn.confirm');
    confirmBtn.disabled = !canDecide || entry.form === 'edit-form';
    // An expired card offers only "Propose again": nothing else can be done with it.
    confirmBtn.hidden = expired;
    var rejectBtn = actions.querySelector('[data-action=reject]');
    rejectBtn.textContent = t('btn.reject');
    rejectBtn.hidden = expired || entry.form === 'reject-form';
    rejectBtn.disabled = !canDecide;
    var editBtn = actions.querySelector('[data-action=edit]');
    editBtn.textContent = t('btn.edit');
    editBtn.hidden =
      expired || !(card.editable && card.editable.length) || entry.form === 'edit-form';
    editBtn.disabled = !canDecide;
    // Once: proposed again (or a later card of the same tool), the conversation has
    // moved on, and another click made one more pending charge (a first-hour probe).
    var moved = expired && (entry.againSent || laterCardOf(card));
    if (expired) actions.hidden = moved;
    var again = actions.querySelector('[data-action=again]');
    again.textContent = t('btn.again');
    again.hidden = !expired || moved;
    again.disabled = !online;

    var formBox = art.querySelector('.card-form');
    if (!pending || !entry.form) {
      formBox.textContent = '';
    } else {
      formBox.querySelectorAll('input, button, textarea').forEach(function (n) {
        n.disabled = entry.busy || !online;
      });
    }
    art.querySelector('.progress').textContent = entry.busy ? t('progress.sending') : '';
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
    if (typeof impact.amount_cents === 'number') row(t('impact.amount'), I.money(impact.amount_cents, impact.currency || 'BRL'));
    else if (impact.amount !== undefined) row(t('impact.amount'), impact.amount);
    if (impact.target !== undefined) row(t('impact.target'), impact.target);
    if (impact.reversible !== undefined) {
      row(t('impact.reversible'), impact.reversible ? t('impact.yes') : t('impact.no'));
    }
    if (impact.side_effects && impact.side_effects.length) {
      row(t('impact.sideEffects'), impact.side_effects.join('; '));
    }
    if (card.status === 'pending' && card.expires_at) {
      row(t('impact.expires'), I.expiry(card.expires_at));
    }
  }

  function renderOutcome(box, card) {
    box.textContent = '';
    var status = card.status;
    var result = card.result || {};
    var decided = V.decided(card);
    function line(text, cls) { box.appendChild(make('p', cls || 'outcome-line', text)); }
    if (status === 'executed') {
      V.renderResult(box, card);
      line(t('out.approved', { decided: decided }), 'outcome-line decided');
    } else if (status === 'rejected') {
      line(t('out.rejected', { decided: decided }), 'outcome-line decided');
      if (card.reason) line(t('out.reason', { reason: card.reason }), 'reason');
    } else if (status === 'expired') {
      line(t('out.expired'));
    } else if (status === 'superseded') {
      line(t('out.superseded'));
    } else if (status === 'modified') {
      line(t('out.modified', { decided: decided }), 'outcome-line decided');
      if (card.superseded_by) {
        var a = make('a', 'new-card-link', t('out.newCard'));
        a.href = '#card-' + card.superseded_by;
        a.addEventListener('click', function (ev) {
          ev.preventDefault();
          var target = document.getElementById('card-' + card.superseded_by);
          if (target) { target.scrollIntoView({ block: 'center' }); target.focus(); }
        });
        box.appendChild(a);
      }
    } else if (status === 'invalidated') {
      line(t('out.invalidated', { decided: decided, reason: I.label(result.reason) || t('out.invalidatedDefault') }), 'outcome-line decided');
      var changes = result.changes || [];
      if (changes.length) {
        var ul = make('ul', 'changes');
        changes.forEach(function (c) {
          ul.appendChild(make('li', '', t('out.change', {
            field: c.field || '?', approved: valueText(c.approved), current: valueText(c.current)
          })));
        });
        box.appendChild(ul);
      }
    } else if (status === 'failed') {
      line(t('out.failed', { error: result.error || t('out.failedDefault') }));
    } else if (status === 'approved') {
      line(t('out.running', { decided: decided }), 'outcome-line decided');
    } else if (status === 'executing') {
      line(t('out.executing', { decided: decided }), 'outcome-line decided');
    }
    if (card.needs_reconciliation) line(t('out.reconcile'), 'warn');
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
      if (entry.againSent) return;
      // With the tool's own fields (a description): the summary alone made a card
      // without them (a first-hour walkthrough).
      var fields = (entry.card.impact && entry.card.impact.fields) || [];
      var said = [entry.card.summary].concat(fields.filter(function (f) {
        return f && typeof f.label === 'string' && typeof f.value === 'string' && f.value;
      }).map(function (f) { return f.label + ': ' + f.value; })).join(' · ');
      var text = t('again.text', { summary: said });
      if (pendingCards().length > 0) {
        // Other cards wait: sending it would replace them, so the composer asks first,
        // as for any message typed under them (the button went around the question).
        el.text.value = text;
        state.againOf = { card: cardId, text: text };
        submitComposer();
        el.text.focus();
        return;
      }
      entry.againSent = sendMessage(text);
      renderCard(entry);
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
    dropDraft(card.id); // sent: a reload must not reopen it as unsent
    // ... nor the card say it was not sent when it is decided (an error answer or a
    // dropped socket clears `busy` before the card's update comes)
    entry.sent = true;
    // Disable at once: a second click finds the buttons disabled and the card busy. The
    // focus goes to the card itself (a disabled button drops it to the page's start, and a
    // keyboard user lost their place).
    if (entry.el.contains(document.activeElement)) entry.el.querySelector('article.card').focus();
    entry.busy = true;
    entry.error = '';
    renderCard(entry);
    state.requests.set(id, { kind: 'resolve', cardIds: [card.id] });
    if (!send(frame)) {
      state.requests.delete(id);
      entry.busy = false;
      entry.error = t('err.notConnected');
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
    renderPending();
    return form;
  }

  function formButtons(form, submitText, submitClass, entry, kind) {
    var row = make('div', 'form-buttons');
    var ok = make('button', submitClass, submitText);
    ok.type = 'submit';
    var cancel = make('button', 'ghost', t('btn.cancel'));
    cancel.type = 'button';
    cancel.addEventListener('click', function () {
      entry.form = null;
      dropDraft(entry.card.id);
      renderCard(entry);
      renderPending();
      var back = entry.el.querySelector('[data-action=' + (kind === 'reject-form' ? 'reject' : 'edit') + ']');
      if (back && !back.hidden) back.focus();
    });
    row.appendChild(ok);
    row.appendChild(cancel);
    form.appendChild(row);
    form.addEventListener('keydown', function (ev) {
      if (ev.key === 'Escape') { ev.preventDefault(); cancel.click(); }
    });
  }

  // ------------------------------------------------------------------ drafts
  // An open form's text is kept in the tab (sessionStorage) while it is typed: a
  // reload, a language switch (which rebuilds the view) or a reconnect reopens it as
  // it was. Dropped when sent and decided, cancelled, or once the card is not pending.

  var DRAFT = 'signoff.draft.';

  function readDraft(cardId) {
    try {
      var d = JSON.parse(window.sessionStorage.getItem(DRAFT + cardId) || 'null');
      return d && (d.kind === 'edit-form' || d.kind === 'reject-form') ? d : null;
    } catch (e) { return null; }
  }

  function keepDraft(cardId, kind, values) {
    try { window.sessionStorage.setItem(DRAFT + cardId, JSON.stringify({ kind: kind, values: values })); } catch (e) { /* full or off */ }
  }

  function dropDraft(cardId) {
    try { window.sessionStorage.removeItem(DRAFT + cardId); } catch (e) { /* off */ }
  }

  function restoreDraft(entry) {
    var d = readDraft(entry.card.id);
    if (!d || entry.form) return;
    if (d.kind === 'reject-form') openRejectForm(entry, d.values || {}, false);
    else if (entry.card.editable && entry.card.editable.length) openEditForm(entry, d.values || {}, false);
  }

  function openRejectForm(entry, values, focus) {
    var form = formShell(entry, 'reject-form', t('form.reject'));
    var fid = 'reason-' + entry.card.id;
    var label = make('label', '', t('form.reason'));
    label.htmlFor = fid;
    var input = make('input');
    input.id = fid;
    input.name = 'reason';
    input.type = 'text';
    input.maxLength = 2000;
    input.autocomplete = 'off';
    if (values && typeof values.reason === 'string') input.value = values.reason;
    form.appendChild(label);
    form.appendChild(input);
    formButtons(form, t('btn.reject'), 'reject', entry, 'reject-form');
    renderCard(entry);
    keepDraft(entry.card.id, 'reject-form', { reason: input.value });
    input.addEventListener('input', function () {
      keepDraft(entry.card.id, 'reject-form', { reason: input.value });
    });
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (entry.busy) return;
      var reason = input.value.trim();
      resolve(entry, 'reject', reason ? { reason: reason } : {});
    });
    if (focus !== false) input.focus();
  }

  function prefill(card, field) {
    var args = card.args_snapshot || {};
    var impact = card.impact || {};
    if (args[field] !== undefined && args[field] !== null && typeof args[field] !== 'object') {
      return String(args[field]);
    }
    var cents = args[field + '_cents'];
    if (cents === undefined && field === 'amount') cents = impact.amount_cents;
    // Written as the page's language writes it ("150,00" / "150.00"): an English page
    // prefilled "149,00", which a dollar tool read as 14900.
    if (typeof cents === 'number') {
      return new Intl.NumberFormat(I.locale(), { minimumFractionDigits: 2, maximumFractionDigits: 2, useGrouping: false }).format(cents / 100);
    }
    return '';
  }

  function openEditForm(entry, values, focus) {
    var card = entry.card;
    var form = formShell(entry, 'edit-form', t('form.edit'));
    var initial = {};
    var inputs = {};
    (card.editable || []).forEach(function (field) {
      var fid = 'edit-' + field + '-' + card.id;
      var label = make('label', '', fieldLabel(field, card));
      label.htmlFor = fid;
      var input = make('input');
      input.id = fid;
      input.name = field;
      input.type = field === 'email' ? 'email' : 'text';
      if (field === 'amount') input.inputMode = 'decimal';
      input.autocomplete = 'off';
      input.value = initial[field] = prefill(card, field);
      if (values && typeof values[field] === 'string') input.value = values[field];
      inputs[field] = input;
      form.appendChild(label);
      form.appendChild(input);
    });
    var note = make('p', 'form-note', t('form.editNote'));
    form.appendChild(note);
    formButtons(form, t('form.editSubmit'), 'edit', entry, 'edit-form');
    renderCard(entry);
    function typed() {
      var out = {};
      Object.keys(inputs).forEach(function (field) { out[field] = inputs[field].value; });
      return out;
    }
    keepDraft(card.id, 'edit-form', typed());
    form.addEventListener('input', function () { keepDraft(card.id, 'edit-form', typed()); });
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (entry.busy) return;
      var edits = {};
      var any = false;
      Object.keys(inputs).forEach(function (field) {
        // An emptied field is a change too (a description cleared; an amount emptied is
        // refused by the tool with its own words, not "change a field first")
        var value = inputs[field].value.trim();
        if (value !== initial[field]) { edits[field] = value; any = true; }
      });
      if (!any) {
        entry.error = t('form.noChange');
        renderCard(entry);
        return;
      }
      resolve(entry, 'edit', { edits: edits });
    });
    var first = form.querySelector('input');
    if (first && focus !== false) { first.focus(); first.select(); }
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
    el.skipCards.hidden = n === 0;
    // A message now would replace them (design note 17); a workflow thread takes none.
    el.composerHint.hidden = n === 0 || isWorkflowThread(state.threadId);
    if (el.guard && !el.guard.hidden) {
      if (n === 0) hideGuard();
      else el.guardText.textContent = n === 1 ? t('guard.one') : t('guard.many', { n: n });
    }
    el.pendingText.textContent = n === 1 ? t('pending.one') : t('pending.many', { n: n });
    var busy = pending.some(function (e) { return e.busy; });
    // A card with its edit form open is not confirmed as it stands, one by one or all
    // together: "Confirm all" waits too, as the card's own Confirm does; so it does while
    // a reject form is open (the person is saying no to that one).
    var editing = pending.some(function (e) { return !!e.form; });
    var batch = n > 1;
    el.confirmAll.hidden = !batch || !!state.batchIds;
    el.rejectAll.hidden = !batch;
    el.confirmAll.disabled = busy || editing || !state.ready;
    // Why "Confirm all" waits, where it is seen (it was greyed out without a word).
    if (batch && editing && !busy) el.pendingText.textContent += ' · ' + t('pending.formOpen');
    el.rejectAll.disabled = busy || !state.ready || !!state.batchIds;
    if (el.batchGo) el.batchGo.disabled = !state.ready;
    el.confirmAll.textContent = t('pending.confirmAll', { n: n });
    el.rejectAll.textContent = t('pending.rejectAll', { n: n });
    // The question lists what it would confirm: once that changes (a card decided
    // elsewhere, a new one), or a form opens, it is asked again.
    if (state.batchIds) {
      var now = pending.map(function (e) { return e.card.id; }).sort().join(' ');
      if (now !== state.batchIds.slice().sort().join(' ') || editing || busy) closeBatchCheck();
    }
  }

  // "Confirm all" asks first, naming each card (a first-hour walkthrough: three Pix
  // charges ran on one click, with nothing between the click and the money moving).
  function openBatchCheck() {
    var pending = pendingCards();
    if (pending.length < 2) return;
    state.batchIds = pending.map(function (e) { return e.card.id; });
    el.batchCheckText.textContent = t('batch.check', { n: pending.length });
    el.batchCheckList.textContent = '';
    pending.forEach(function (e) {
      var li = document.createElement('li');
      li.textContent = e.card.summary;
      el.batchCheckList.appendChild(li);
    });
    el.batchGo.textContent = t('batch.go', { n: pending.length });
    el.batchCancel.textContent = t('batch.cancel');
    el.batchCheck.hidden = false;
    el.confirmAll.hidden = true;
    el.rejectAll.disabled = true;  // a double click's second half landed on it (narrow screens)
    // The question takes the focus, not "Yes": a second Enter (or a key held down)
    // confirmed every card before the list could be read (a review).
    el.batchCheckText.focus();
  }

  function closeBatchCheck() {
    var wasOpen = !!state.batchIds;
    state.batchIds = null;
    el.batchCheck.hidden = true;
    if (wasOpen) {
      el.confirmAll.hidden = pendingCards().length < 2;
      el.rejectAll.disabled = !state.ready;
    }
  }

  function batch(decision, only) {
    // One resolve frame per card on this page's socket, as each card's own buttons send:
    // the cards then say they were decided in the chat (the HTTP batch endpoint made
    // them "through the API"), and each answer lands on its own card. ``only``: the
    // cards the question listed.
    var all = pendingCards().filter(function (e) { return !only || only.indexOf(e.card.id) >= 0; });
    var editing = all.some(function (e) { return !!e.form; });
    if (decision === 'approve' && editing) return;
    all.filter(function (e) { return !e.busy; }).forEach(function (e) {
      // A reason typed in a card's open reject form goes with that card's rejection
      // ("Reject all" sent none, and the text was dropped without a word).
      var typed = e.form === 'reject-form' ? e.el.querySelector('.card-form input[name=reason]') : null;
      var reason = decision === 'reject' && typed ? typed.value.trim() : '';
      resolve(e, decision, reason ? { reason: reason } : {});
    });
    renderPending();
  }

  // ------------------------------------------------------------------ composer

  function renderThinking() {
    var streaming = false;
    state.streams.forEach(function (st) { if (!st.el.hidden) streaming = true; });
    var working = !!state.activeRun && !streaming &&
      !pendingCards().some(function (e) { return e.card.run_id === state.activeRun; });
    if (state.notice && (!working || state.notice.run !== state.activeRun)) state.notice = null;
    el.thinking.textContent = state.notice ? t('thinking') + ' ' + t(state.notice.key) : t('thinking');
    el.thinking.hidden = !working;
  }

  // The server refuses longer messages (gateway/service.py MAX_TEXT). The box takes any
  // length and says so: a maxlength cut a pasted text at 8000 without a word, and the end
  // (often the request itself) was sent as if it were the whole message.
  var MAX_TEXT = 8000;

  function chars(text) { return Array.from(text).length; }  // code points, as the server counts

  function tooLong() {
    return chars(el.text.value.trim()) > MAX_TEXT;
  }

  // A workflow run's agent steps talk on a thread of their own (its id is a version-8
  // UUID, runtime/workflows/agent_step.py): its cards are decided here like any other,
  // but it takes no messages (the server answers 409 workflow_thread).
  function isWorkflowThread(id) {
    return /^[0-9a-f]{8}-[0-9a-f]{4}-8/i.test(id || '');
  }

  function renderComposer() {
    var over = tooLong();
    var workflow = isWorkflowThread(state.threadId);
    el.send.disabled = !state.ready || state.awaitingThread || over || workflow;
    el.text.disabled = workflow;
    var said = el.composerError.dataset.tooLong === '1';
    if (workflow) {
      el.composerError.textContent = t('composer.workflow');
      el.composerError.dataset.workflow = '1';
      return;
    }
    if (el.composerError.dataset.workflow === '1') {
      el.composerError.textContent = '';
      delete el.composerError.dataset.workflow;
    }
    if (over) {
      el.composerError.textContent = t('composer.tooLong', {
        n: chars(el.text.value.trim()), max: MAX_TEXT
      });
      el.composerError.dataset.tooLong = '1';
    } else if (said) {
      el.composerError.textContent = '';
      delete el.composerError.dataset.tooLong;
    }
  }

  // A message sent under waiting cards replaces them (design note 17): the composer says
  // so first and sends it once the person chose to, here or in a new chat (a person who
  // opened the chat on another device landed under a waiting card, and their first words
  // replaced it; a typed correction did too, where Edit was meant).
  function submitComposer() {
    var text = el.text.value.trim();
    if (!text) return;
    var waiting = isWorkflowThread(state.threadId) ? 0 : pendingCards().length;
    // (a message sent again under its key, in its thread, is the same message: it
    // replaces nothing. One whose first send named no thread asks like any other once a
    // thread is open: a review found it sent unasked into a thread opened meanwhile,
    // replacing its cards; in the thread the first send made it asks only if that send
    // ran, and the key keeps it from running twice)
    var again = state.retry && state.retry.text === text && state.retry.thread === state.threadId;
    if (waiting > 0 && state.confirmed !== text && !again) {
      state.guarded = text;
      el.guardText.textContent = waiting === 1 ? t('guard.one') : t('guard.many', { n: waiting });
      el.guard.hidden = false;
      return;
    }
    hideGuard();
    if (sendMessage(text)) el.text.value = '';
  }

  function hideGuard() {
    state.guarded = null;
    state.confirmed = null;
    if (el.guard) el.guard.hidden = true;
  }

  function sendMessage(text) {
    text = (text || '').trim();
    if (!text) return false;
    if (state.awaitingThread) return false;
    if (chars(text) > MAX_TEXT) { renderComposer(); return false; }
    state.offerWaiting = false; // the person chose this conversation
    var id = frameId();
    // The message's own key: sent again after an unanswered try (the same text), it
    // runs at most once on the server.
    var key = (state.retry && state.retry.text === text) ? state.retry.key : messageKey();
    state.retry = null;
    var frame = { type: 'message', id: id, text: text, idempotency_key: key };
    if (state.threadId) frame.thread_id = state.threadId;
    else state.awaitingThread = true;
    state.requests.set(id, { kind: 'message', text: text, key: key });
    el.composerError.textContent = '';
    if (!send(frame)) {
      state.requests.delete(id);
      state.awaitingThread = false;
      el.composerError.textContent = t('composer.offline');
      return false;
    }
    // Sent after the question, a "Propose again" counts as that card's (a second press
    // proposed the same card twice once the first had replaced the waiting ones: a review)
    if (state.againOf && state.againOf.text === text) {
      var from = state.cards.get(state.againOf.card);
      if (from) { from.againSent = true; renderCard(from); }
      state.againOf = null;
    }
    renderComposer();
    return true;
  }

  // ------------------------------------------------------------------ language

  function switchLanguage(tag) {
    I.set(tag);
    el.lang.value = I.lang;
    // Everything the page wrote is rebuilt in the new language: the static labels
    // (I.apply), the connection line, and the view, replayed from the server's log.
    setConn(state.conn.kind, state.conn.key, state.conn.vars);
    renderEmpty();
    if (state.user) el.who.textContent = t('who', { user: state.user });
    T.render();
    if (state.threadId && state.ready) {
      var id = frameId();
      state.requests.set(id, { kind: 'resume' });
      send({ type: 'resume', id: id, thread_id: state.threadId, after_seq: 0 });
    } else {
      renderAllCards();
      renderPending();
    }
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
    el.skipCards = $('skip-cards');
    el.batchCheck = $('batch-check');
    el.batchCheckText = $('batch-check-text');
    el.batchCheckList = $('batch-check-list');
    el.batchGo = $('batch-go');
    el.batchCancel = $('batch-cancel');
    el.rejectAll = $('reject-all');
    el.transcript = $('transcript');
    el.empty = $('empty');
    el.thinking = $('thinking');
    el.composer = $('composer');
    el.composerHint = $('composer-hint');
    el.guard = $('replace-guard');
    el.guardText = $('replace-guard-text');
    el.guardSend = $('guard-send');
    el.guardNew = $('guard-new');
    el.text = $('text');
    el.send = $('send');
    el.composerError = $('composer-error');
    el.announcer = $('announcer');
    el.alerts = $('alerts');
    el.threads = $('threads');
    el.threadsToggle = $('threads-toggle');
    el.lang = $('lang');

    I.apply(document);
    I.langs.forEach(function (l) {
      var opt = make('option', '', l.name);
      opt.value = l.tag;
      opt.lang = l.tag;
      el.lang.appendChild(opt);
    });
    el.lang.value = I.lang;
    el.lang.addEventListener('change', function () { switchLanguage(el.lang.value); });
    T.init({
      nav: el.threads,
      list: $('thread-list'),
      none: $('threads-none'),
      toggle: el.threadsToggle,
      toggleBadge: $('threads-toggle-badge'),
      onOpen: function (id) { openThread(id, true); }
    });

    el.loginForm.addEventListener('submit', function (ev) {
      ev.preventDefault();
      var token = el.tokenInput.value.trim();
      if (!token) { el.loginError.textContent = t('login.empty'); return; }
      store(TOKEN_KEY, token);
      state.token = token;
      el.tokenInput.value = '';
      el.loginError.textContent = '';
      state.attempt = 0;
      connect();
    });
    el.logout.addEventListener('click', signOut);
    el.newChat.addEventListener('click', function () {
      state.offerWaiting = false;
      if (state.threadId) state.seenThreads.add(state.threadId);
      state.threadId = null;
      state.awaitingThread = false;
        writeLocation();
      resetView();
      T.setCurrent(null);
      el.empty.hidden = false;
      el.text.focus();
    });
    el.confirmAll.addEventListener('click', openBatchCheck);
    // A keyboard user reached a card's Confirm through the header and every conversation
    // of the list (22 Tabs with 18 conversations: a first-hour walkthrough).
    el.skipCards.addEventListener('click', function (ev) {
      ev.preventDefault();
      var first = pendingCards()[0];
      if (first) first.el.querySelector('article.card').focus();
    });
    el.batchGo.addEventListener('click', function () {
      var ids = state.batchIds;
      closeBatchCheck();
      if (ids) batch('approve', ids);
    });
    el.batchCancel.addEventListener('click', function () {
      closeBatchCheck();
      el.confirmAll.focus();
    });
    el.batchCheck.addEventListener('keydown', function (ev) {
      if (ev.key === 'Escape') { closeBatchCheck(); el.confirmAll.focus(); }
    });
    el.rejectAll.addEventListener('click', function () { batch('reject'); });
    el.composer.addEventListener('submit', function (ev) {
      ev.preventDefault();
      submitComposer();
    });
    el.text.addEventListener('input', function () {
      if (state.guarded !== el.text.value.trim()) hideGuard();
      // emptied: what is typed next is a new message, under a key of its own
      if (!el.text.value.trim()) state.retry = null;
      // changed: no longer that card's "Propose again" (a review: a later send of the
      // same words marked the card proposed again)
      if (state.againOf && state.againOf.text !== el.text.value.trim()) state.againOf = null;
      renderComposer();
    });
    el.text.addEventListener('keydown', function (ev) {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        if (!el.send.disabled) submitComposer();
      }
    });
    el.guardSend.addEventListener('click', function () {
      state.confirmed = el.text.value.trim();
      submitComposer();
      el.text.focus();
    });
    el.guardNew.addEventListener('click', function () {
      var text = el.text.value;
      hideGuard();
      el.newChat.click();
      el.text.value = text;
      if (sendMessage(text)) el.text.value = '';
    });
    window.addEventListener('popstate', function () {
      var thread = new URL(window.location.href).searchParams.get('thread');
      if (thread && state.token) openThread(thread, false);
    });
    window.addEventListener('online', function () {
      if (!state.ws && state.token) { state.attempt = 0; connect(); }
    });
    // The browser knows the network is gone: a socket it stalls still looks open, so the
    // page said "Online" and a decision sat at "Sending…" (a first-hour probe). Let the
    // socket go as if it had closed and say so; 'online' connects again.
    window.addEventListener('offline', function () {
      if (!state.ws) return;
      lose(state.ws);
      setConn('offline', 'conn.noNetwork');
    });
    // A sign-in link opened in this loaded tab changes only the fragment: take it the way
    // a page load does (and so out of the address bar and the history).
    window.addEventListener('hashchange', function () {
      if (/(^|[#&])token=/.test(location.hash)) location.reload();
    });

    readLocation();
    resetView();
    if (state.token) connect();
    else showLogin('');
    if (state.linkRefused) {
      var notice = t('login.linkRefused', state.linkRefused);
      el.composerError.textContent = notice;
      alertText(notice);
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
