/* signoff chat page: the thread list (most recently active first, a badge for the cards
 * waiting in each). The list is read over the WebSocket (`threads` frame, the same as
 * GET /v1/threads) and read again when the server says `threads_changed`; each line is
 * a real link (?thread=<id>), so opening it in a new tab or sharing it works too.
 */
(function () {
  'use strict';

  var I = window.SignoffI18n;
  var make = window.SignoffViews.make;

  var el = {};
  var threads = [];
  var current = null;
  var onOpen = null;

  function init(opts) {
    el.nav = opts.nav;
    el.list = opts.list;
    el.none = opts.none;
    el.toggle = opts.toggle;
    el.toggleBadge = opts.toggleBadge;
    onOpen = opts.onOpen;
    el.nav.addEventListener('keydown', function (ev) {
      if (ev.key === 'Escape' && el.nav.classList.contains('open')) {
        setOpen(false);
        el.toggle.focus();
      }
    });
    el.toggle.addEventListener('click', function () {
      var open = el.toggle.getAttribute('aria-expanded') !== 'true';
      setOpen(open);
      if (open) {
        var first = el.list.querySelector('a[aria-current]') || el.list.querySelector('a');
        if (first) first.focus();
      }
    });
  }

  function setOpen(open) {
    el.toggle.setAttribute('aria-expanded', open ? 'true' : 'false');
    el.nav.classList.toggle('open', open);
  }

  function show(list, currentId) {
    threads = Array.isArray(list) ? list : [];
    current = currentId;
    render();
  }

  function setCurrent(threadId) {
    current = threadId;
    render();
  }

  function render() {
    if (!el.list) return;
    el.list.textContent = '';
    var waiting = 0;
    threads.forEach(function (t) {
      waiting += t.pending || 0;
      var li = make('li', 'thread');
      var a = make('a', 'thread-link');
      a.href = '?thread=' + encodeURIComponent(t.id);
      a.dataset.threadId = t.id;
      if (t.id === current) a.setAttribute('aria-current', 'page');
      a.appendChild(make('span', 'thread-title', t.title || I.t('threads.untitled')));
      var meta = make('span', 'thread-meta');
      var time = make('time', 'thread-time', I.when(t.updated_at));
      time.dateTime = t.updated_at || '';
      meta.appendChild(time);
      if (t.pending > 0) {
        meta.appendChild(make('span', 'badge thread-badge', I.t('threads.pending', { n: t.pending })));
      }
      a.appendChild(meta);
      a.addEventListener('click', function (ev) {
        if (ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return; // new tab
        ev.preventDefault();
        setOpen(false);
        if (onOpen) onOpen(t.id);
      });
      li.appendChild(a);
      el.list.appendChild(li);
    });
    el.none.hidden = threads.length > 0;
    el.toggleBadge.textContent = waiting > 0 ? String(waiting) : '';
    el.toggleBadge.hidden = waiting === 0;
  }

  window.SignoffThreads = { init: init, show: show, setCurrent: setCurrent, render: render, setOpen: setOpen };
})();
