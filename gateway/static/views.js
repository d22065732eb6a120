/* signoff chat page: what a decided card says — the decision line (who, where, when)
 * and an executed card's result view.
 *
 * The view comes from the server with the executed card's event (`card.view`: the
 * tool's declared title and labelled fields, runtime/tools.py ResultView); values are
 * formatted here in the person's locale. All server text is set as textContent.
 */
(function () {
  'use strict';

  var I = window.SignoffI18n;

  function make(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  /* "by alice in the chat at 14:03" / "por alice no chat às 14:03". */
  function decided(card) {
    var parts = [];
    if (card.decided_by) parts.push(I.t('by', { who: card.decided_by }));
    if (card.channel) {
      var where = I.t('where.' + card.channel);
      parts.push(where === 'where.' + card.channel ? card.channel : where);
    }
    if (card.decided_at) parts.push(I.t('at', { time: I.time(card.decided_at) }));
    return parts.join(' ');
  }

  function plain(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }

  function formatted(field) {
    var v = field.value;
    switch (field.format) {
      case 'money_cents': return I.money(v, field.currency || 'BRL');
      case 'number': return I.number(v);
      case 'datetime': return I.dateTime(v) || plain(v);
      case 'date': return I.date(v) || plain(v);
      default: return plain(v);
    }
  }

  function copyButton(text, label) {
    var btn = make('button', 'copy ghost', I.t('btn.copy'));
    btn.type = 'button';
    btn.setAttribute('aria-label', I.t('btn.copy') + ': ' + label);
    btn.addEventListener('click', function () {
      function done() {
        btn.textContent = I.t('btn.copied');
        window.setTimeout(function () { btn.textContent = I.t('btn.copy'); }, 2000);
      }
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(text).then(done, function () { selectText(btn); });
      } else {
        selectText(btn);
      }
    });
    return btn;
  }

  function selectText(btn) {
    var code = btn.parentNode && btn.parentNode.querySelector('code');
    if (!code || !window.getSelection) return;
    var range = document.createRange();
    range.selectNodeContents(code);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }

  /* The executed result: "Cobrança Pix criada · R$ 150,00" as a heading line, then each
   * other field as a labelled row (a code to copy with its button beside it). */
  function renderResult(box, card) {
    var view = card.view;
    var result = card.result || {};
    if (!view || !Array.isArray(view.fields)) {
      view = {
        title: '',
        fields: Object.keys(result).map(function (k) {
          return { label: k.replace(/_/g, ' '), format: 'text', value: result[k] };
        })
      };
    }
    var title = I.label(view.title) || I.t('out.executedTitle');
    var head = make('p', 'result-line');
    head.appendChild(make('strong', 'result-title', title));
    var dl = make('dl', 'result');
    view.fields.forEach(function (f) {
      if (!f || f.value === undefined || f.value === null) return;
      var label = I.label(f.label);
      var text = formatted(f);
      if (f.format === 'money_cents') {
        head.appendChild(document.createTextNode(' · ' + text));
        return; // said once, in the line above
      }
      dl.appendChild(make('dt', '', label));
      var dd = make('dd', f.format === 'copy' ? 'copyable' : '');
      if (f.format === 'copy') {
        dd.appendChild(make('code', '', text));
        dd.appendChild(document.createTextNode(' '));
        dd.appendChild(copyButton(text, label));
      } else dd.textContent = text;
      dl.appendChild(dd);
    });
    box.appendChild(head);
    if (dl.childElementCount) box.appendChild(dl);
  }

  window.SignoffViews = { decided: decided, renderResult: renderResult, plain: plain, make: make };
})();
