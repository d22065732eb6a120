/* signoff chat page: workflow runs waiting on the signed-in person (human gates).
 *
 * Kept apart from app.js (its only hook there is the <script> tag in index.html). Each
 * run of the person's that is `awaiting_human` is shown above the conversation as a form
 * generated from the JSON schema persisted on its open interrupt; submitting it posts
 * `{payload}` to POST /v1/workflow-runs/{id}/resume. A refused payload (422) leaves the
 * run parked and the server's message is shown under the form. An agent step's gate
 * (its schema lists the pending cards under `x-signoff-cards`) gets one approve/reject
 * choice per card: the decision map.
 *
 * Text from the server is always set with textContent, never parsed as HTML.
 */
(function () {
  'use strict';

  var TOKEN_KEY = 'signoff.token';
  var POLL_MS = 3000;
  var CARDS_KEY = 'x-signoff-cards';
  var box = null;
  var shown = new Map(); // run id -> {form, interruptId}
  var timer = null;

  function make(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // The page's words in the person's language (i18n.js), English if it is not loaded.
  var I = window.SignoffI18n || null;
  var EN = {
    'gate.needed': 'Your decision is needed', 'gate.until': 'until {when}',
    'gate.submit': 'Submit', 'gate.refused': 'Refused ({status})',
    'gate.offline': 'Could not reach the server; try again.',
    'gate.sent': 'Sent: {workflow} goes on.', 'gate.yes': 'Yes', 'gate.no': 'No',
    'gate.approve': 'Approve', 'gate.reject': 'Reject', 'gate.edit': 'Edit and approve',
    'gate.region': 'Workflow decisions'
  };
  function tr(key, vars) {
    var text = I ? I.t(key, vars) : key;
    if (text === key) {
      text = EN[key] || key;
      Object.keys(vars || {}).forEach(function (k) { text = text.replace('{' + k + '}', vars[k]); });
    }
    return text;
  }
  function locale() { return I ? I.locale() : undefined; }

  function token() {
    try { return localStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
  }

  function api(method, path, body) {
    var t = token();
    if (!t) return Promise.reject(new Error('signed out'));
    var init = { method: method, headers: { Authorization: 'Bearer ' + t } };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (res) {
      return res.json().catch(function () { return {}; }).then(function (data) {
        return { ok: res.ok, status: res.status, data: data };
      });
    });
  }

  function container() {
    if (box) return box;
    var chat = document.getElementById('chat');
    if (!chat) return null;
    box = make('section', 'gates');
    box.id = 'gates';
    box.setAttribute('aria-label', tr('gate.region'));
    box.hidden = true;
    chat.insertBefore(box, chat.firstChild);
    return box;
  }

  // ------------------------------------------------------------------ the form

  function labelOf(name, prop) { return (prop && prop.title) || name.replace(/_/g, ' '); }

  function fieldId(runId, name) { return 'gate-' + runId + '-' + name.replace(/[^A-Za-z0-9_-]/g, '_'); }

  function addField(form, runId, name, prop, required) {
    var row = make('div', 'gate-field');
    var id = fieldId(runId, name);
    var type = prop.type;
    var input;
    if (type === 'boolean' && required) {
      // A required yes/no is asked, never defaulted: an unticked box sent `false` (a
      // rejection) for a person who only pressed Submit.
      var group = make('fieldset', 'gate-choice');
      group.appendChild(make('legend', null, labelOf(name, prop) + ' *'));
      [['true', tr('gate.yes')], ['false', tr('gate.no')]].forEach(function (pair) {
        var radio = make('input');
        radio.type = 'radio';
        radio.name = name;
        radio.value = pair[0];
        radio.required = true;
        radio.id = id + '-' + pair[0];
        radio.dataset.type = 'boolean-choice';
        var text = make('label', null, pair[1]);
        text.htmlFor = radio.id;
        group.appendChild(radio);
        group.appendChild(text);
      });
      row.appendChild(group);
      if (prop.description) row.appendChild(make('p', 'gate-help', prop.description));
      form.appendChild(row);
      return;
    } else if (type === 'boolean') {
      input = make('input');
      input.type = 'checkbox';
      input.checked = prop['default'] === true;
      row.classList.add('gate-check');
    } else if (Array.isArray(prop['enum'])) {
      input = make('select');
      prop['enum'].forEach(function (v) {
        var opt = make('option', null, v);
        opt.value = String(v);
        input.appendChild(opt);
      });
    } else {
      input = make('input');
      input.type = (type === 'integer' || type === 'number') ? 'number' : 'text';
      if (type === 'integer') input.step = '1';
      if (type === 'number') input.step = 'any';
      if (typeof prop.minimum === 'number') input.min = String(prop.minimum);
      if (typeof prop.maximum === 'number') input.max = String(prop.maximum);
      if (typeof prop.maxLength === 'number') input.maxLength = prop.maxLength;
      if (prop['default'] !== undefined && prop['default'] !== null) input.value = String(prop['default']);
    }
    input.id = id;
    input.name = name;
    input.dataset.type = type || 'string';
    if (required && type !== 'boolean') input.required = true;
    var label = make('label', null, labelOf(name, prop) + (required && type !== 'boolean' ? ' *' : ''));
    label.htmlFor = id;
    if (type === 'boolean') { row.appendChild(input); row.appendChild(label); }
    else { row.appendChild(label); row.appendChild(input); }
    if (prop.description) row.appendChild(make('p', 'gate-help', prop.description));
    form.appendChild(row);
  }

  function addCard(form, runId, card) {
    var row = make('fieldset', 'gate-card');
    row.dataset.cardId = card.id;
    row.appendChild(make('legend', null, card.summary));
    // The values the tool keeps apart from the summary (a note, an address): the
    // decision is on them too.
    var fields = card.impact && card.impact.fields;
    if (fields && typeof fields === 'object') {
      var dl = make('dl', 'gate-card-fields');
      (Array.isArray(fields) ? fields : Object.keys(fields).map(function (k) {
        return { label: k, value: fields[k] };
      })).forEach(function (f) {
        if (!f || typeof f.label !== 'string') return;
        dl.appendChild(make('dt', null, f.label));
        dl.appendChild(make('dd', null, String(f.value)));
      });
      if (dl.childNodes.length) row.appendChild(dl);
    }
    var editable = Array.isArray(card.editable) ? card.editable : [];
    var edits = make('div', 'gate-edits');
    edits.hidden = true;
    var choices = editable.length ? ['approve', 'reject', 'edit'] : ['approve', 'reject'];
    choices.forEach(function (choice) {
      var id = fieldId(runId, card.id + '-' + choice);
      var input = make('input');
      input.type = 'radio';
      input.name = card.id;
      input.value = choice;
      input.id = id;
      input.required = true;
      input.addEventListener('change', function () { edits.hidden = choice !== 'edit'; });
      var label = make('label', null, tr('gate.' + choice));
      label.htmlFor = id;
      row.appendChild(input);
      row.appendChild(label);
    });
    // An edit makes a new card from these values, which this decision also approves.
    editable.forEach(function (name) {
      var current = card.input ? card.input[name] : undefined;
      var field = make('div', 'gate-field');
      var id = fieldId(runId, card.id + '-edit-' + name);
      var input = make('input');
      input.type = typeof current === 'number' ? 'number' : 'text';
      if (typeof current === 'number') input.step = 'any';
      input.id = id;
      input.dataset.edit = name;
      input.dataset.type = typeof current === 'number' ? 'number' : 'string';
      if (current !== undefined && current !== null) input.value = String(current);
      var label = make('label', null, name.replace(/_/g, ' '));
      label.htmlFor = id;
      field.appendChild(label);
      field.appendChild(input);
      edits.appendChild(field);
    });
    if (editable.length) row.appendChild(edits);
    form.appendChild(row);
  }

  function payloadOf(form, schema) {
    var out = {};
    var cards = schema[CARDS_KEY];
    if (Array.isArray(cards)) {
      cards.forEach(function (card) {
        var picked = form.querySelector('input[name="' + CSS.escape(card.id) + '"]:checked');
        if (!picked) return;
        if (picked.value !== 'edit') { out[card.id] = picked.value === 'approve'; return; }
        var row = form.querySelector('fieldset[data-card-id="' + CSS.escape(card.id) + '"]');
        var edit = {};
        row.querySelectorAll('input[data-edit]').forEach(function (input) {
          if (input.value === '') return;
          edit[input.dataset.edit] = input.dataset.type === 'number' ? Number(input.value) : input.value;
        });
        out[card.id] = { edit: edit };
      });
      return out;
    }
    form.querySelectorAll('input, select').forEach(function (input) {
      if (!input.name || input.dataset.edit) return;
      var type = input.dataset.type;
      if (type === 'boolean-choice') { if (input.checked) out[input.name] = input.value === 'true'; return; }
      if (type === 'boolean') { out[input.name] = input.checked; return; }
      if (input.value === '') return; // optional and empty: the schema's default applies
      if (type === 'integer') out[input.name] = Number(input.value);
      else if (type === 'number') out[input.name] = Number(input.value);
      else out[input.name] = input.value;
    });
    return out;
  }

  function build(run, gate) {
    var form = make('form', 'gate');
    form.noValidate = false;
    form.dataset.runId = run.id;
    form.dataset.interruptId = gate.id;
    form.setAttribute('aria-label', run.workflow + ': ' + (gate.reason || gate.step_name));
    form.appendChild(make('h3', 'gate-title', gate.reason || tr('gate.needed')));
    var until = gate.deadline
      ? ' · ' + tr('gate.until', { when: new Date(gate.deadline).toLocaleString(locale()) })
      : '';
    form.appendChild(make('p', 'gate-meta', run.workflow + ' · ' + gate.step_name + until));
    var schema = gate.schema || {};
    if (Array.isArray(schema[CARDS_KEY])) {
      schema[CARDS_KEY].forEach(function (card) { addCard(form, run.id, card); });
    } else {
      var props = schema.properties || {};
      var required = schema.required || [];
      Object.keys(props).forEach(function (name) {
        addField(form, run.id, name, props[name], required.indexOf(name) >= 0);
      });
    }
    var error = make('p', 'form-error gate-error');
    error.setAttribute('role', 'alert');
    var submit = make('button', 'confirm', tr('gate.submit'));
    submit.type = 'submit';
    form.appendChild(submit);
    form.appendChild(error);
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (!form.reportValidity()) return;
      error.textContent = '';
      submit.disabled = true;
      api('POST', '/v1/workflow-runs/' + encodeURIComponent(run.id) + '/resume',
        { payload: payloadOf(form, schema) })
        .then(function (res) {
          if (res.ok) {
            remove(run.id);
            said(tr('gate.sent', { workflow: run.workflow }));
            return;
          }
          // A tool's refusal may come in several languages (detail.localized): the person's.
          var d = res.data || {};
          var localized = d.detail && d.detail.localized;
          var msg = (localized && I && I.label) ? I.label(localized) : '';
          error.textContent = msg || d.message || tr('gate.refused', { status: res.status });
          submit.disabled = false;
        })
        .catch(function () {
          error.textContent = tr('gate.offline');
          submit.disabled = false;
        });
    });
    return form;
  }

  // What a submit did, said under the gates for a while (the form itself is gone).
  function said(text) {
    var root = container();
    if (!root) return;
    var line = make('p', 'gate-sent', text);
    line.setAttribute('role', 'status');
    root.appendChild(line);
    root.hidden = false;
    window.setTimeout(function () {
      if (line.parentNode) line.parentNode.removeChild(line);
      if (box) box.hidden = shown.size === 0 && !box.querySelector('.gate-sent');
    }, 6000);
  }

  function remove(runId) {
    var entry = shown.get(runId);
    if (entry && entry.form.parentNode) entry.form.parentNode.removeChild(entry.form);
    shown.delete(runId);
    if (box) box.hidden = shown.size === 0 && !box.querySelector('.gate-sent');
  }

  // ------------------------------------------------------------------ polling

  function refresh() {
    var root = container();
    if (!root || !token()) return Promise.resolve();
    return api('GET', '/v1/workflow-runs?status=awaiting_human').then(function (res) {
      if (!res.ok) return;
      var runs = (res.data && res.data.runs) || [];
      var live = new Set(runs.map(function (r) { return r.id; }));
      shown.forEach(function (_, id) { if (!live.has(id)) remove(id); });
      return Promise.all(runs.map(function (run) {
        return api('GET', '/v1/workflow-runs/' + encodeURIComponent(run.id)).then(function (r) {
          var gate = r.ok && r.data ? r.data.gate : null;
          if (!gate || gate.kind !== 'human') { remove(run.id); return; }
          var entry = shown.get(run.id);
          if (entry && entry.interruptId === gate.id) return;
          if (entry) remove(run.id);
          var form = build(r.data.run || run, gate);
          root.appendChild(form);
          shown.set(run.id, { form: form, interruptId: gate.id });
          root.hidden = false;
        });
      }));
    }).catch(function () { /* offline or signed out: try again later */ });
  }

  function loop() {
    window.clearTimeout(timer);
    refresh().then(function () { timer = window.setTimeout(loop, POLL_MS); });
  }

  document.addEventListener('visibilitychange', function () {
    if (document.visibilityState === 'visible') loop();
  });
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', loop);
  else loop();
}());
