// The chat page of `ember serve`: conversations kept in the browser (localStorage), replies
// streamed from POST /v1/chat/completions as server-sent events, a Stop button that aborts the
// request (the server then drops the sequence from its batch). Everything the model or the user
// wrote is put on the page with textContent, never parsed as HTML.
'use strict';

(() => {
  const STORE = 'ember-chat.v1';
  const $ = (id) => document.getElementById(id);
  const el = {
    messages: $('messages'), prompt: $('prompt'), send: $('send'), stop: $('stop'),
    composer: $('composer'), history: $('history'), newChat: $('new-chat'), model: $('model'),
    status: $('status'), system: $('system'), temperature: $('temperature'), topP: $('top-p'),
    maxTokens: $('max-tokens'), apiKey: $('api-key'),
  };

  let state = load();
  let modelId = null;
  let controller = null; // the AbortController of the reply being streamed

  function load() {
    try {
      const s = JSON.parse(localStorage.getItem(STORE) || 'null');
      if (s && Array.isArray(s.conversations)) return s;
    } catch (e) { /* a broken store starts over */ }
    return { conversations: [], current: null, settings: {} };
  }

  function save() {
    try { localStorage.setItem(STORE, JSON.stringify(state)); } catch (e) { /* full or off */ }
  }

  function current() {
    let c = state.conversations.find((x) => x.id === state.current);
    if (!c) {
      c = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: 'New chat', messages: [] };
      state.conversations.unshift(c);
      state.current = c.id;
    }
    return c;
  }

  // ---- rendering (text only) ----------------------------------------------------------------

  function bubble(role, text, note, noteIsError) {
    const div = document.createElement('div');
    div.className = `msg ${role}`;
    const who = document.createElement('div');
    who.className = 'who';
    who.textContent = role === 'user' ? 'You' : role === 'assistant' ? 'Model' : 'System';
    const body = document.createElement('div');
    body.className = 'text';
    body.textContent = text;
    const foot = document.createElement('div');
    foot.className = noteIsError ? 'note error' : 'note';
    foot.textContent = note || '';
    foot.hidden = !note;
    div.append(who, body, foot);
    el.messages.append(div);
    return { div, body, foot };
  }

  function scrollDown() {
    el.messages.scrollTop = el.messages.scrollHeight;
  }

  function renderMessages() {
    el.messages.replaceChildren();
    for (const m of current().messages) bubble(m.role, m.content, m.note, m.error);
    scrollDown();
  }

  function renderHistory() {
    el.history.replaceChildren();
    for (const c of state.conversations) {
      const li = document.createElement('li');
      if (c.id === state.current) li.className = 'current';
      const open = document.createElement('button');
      open.type = 'button';
      open.className = 'open';
      open.textContent = c.title;
      open.title = c.title;
      open.addEventListener('click', () => {
        if (controller) return;
        state.current = c.id;
        save();
        renderAll();
      });
      const del = document.createElement('button');
      del.type = 'button';
      del.className = 'delete';
      del.textContent = '\u00d7';
      del.setAttribute('aria-label', `Delete "${c.title}"`);
      del.addEventListener('click', () => {
        if (controller) return;
        state.conversations = state.conversations.filter((x) => x !== c);
        if (state.current === c.id) state.current = null;
        save();
        renderAll();
      });
      li.append(open, del);
      el.history.append(li);
    }
  }

  function renderAll() {
    current();
    renderHistory();
    renderMessages();
  }

  function setBusy(busy) {
    el.send.disabled = busy;
    el.stop.hidden = !busy;
    el.newChat.disabled = busy;
  }

  // ---- settings -----------------------------------------------------------------------------

  const SETTINGS = ['system', 'temperature', 'topP', 'maxTokens', 'apiKey'];

  function restoreSettings() {
    for (const k of SETTINGS) if (state.settings[k] !== undefined) el[k].value = state.settings[k];
    for (const k of SETTINGS) {
      el[k].addEventListener('change', () => {
        state.settings[k] = el[k].value;
        save();
      });
    }
  }

  function headers() {
    const h = { 'Content-Type': 'application/json' };
    const key = el.apiKey.value.trim();
    if (key) h.Authorization = `Bearer ${key}`;
    return h;
  }

  function number(input, fallback) {
    const v = Number(input.value);
    return input.value !== '' && Number.isFinite(v) ? v : fallback;
  }

  async function fetchModel() {
    try {
      const res = await fetch('/v1/models', { headers: headers() });
      const body = await res.json();
      if (res.ok && body.data && body.data[0]) {
        modelId = body.data[0].id;
        el.model.textContent = modelId;
      } else if (body.error) {
        el.model.textContent = body.error.message;
      }
    } catch (e) {
      el.model.textContent = 'the server cannot be reached';
    }
  }

  // ---- a reply ------------------------------------------------------------------------------

  // Reads server-sent events from a fetch response, calling onData with each event's data.
  async function readEvents(res, onData) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
        const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (data && onData(data) === false) return;
      }
    }
  }

  async function send(text) {
    const conv = current();
    if (!conv.messages.length) conv.title = text.length > 40 ? `${text.slice(0, 40)}\u2026` : text;
    conv.messages.push({ role: 'user', content: text });
    bubble('user', text);
    const reply = { role: 'assistant', content: '' };
    conv.messages.push(reply);
    const view = bubble('assistant', '');
    view.body.classList.add('streaming');
    renderHistory();
    scrollDown();
    save();

    const messages = [];
    const system = el.system.value.trim();
    if (system) messages.push({ role: 'system', content: system });
    for (const m of conv.messages.slice(0, -1)) messages.push({ role: m.role, content: m.content });
    const request = {
      messages,
      stream: true,
      stream_options: { include_usage: true },
      temperature: number(el.temperature, 0.8),
      top_p: number(el.topP, 0.95),
      max_tokens: Math.max(1, Math.round(number(el.maxTokens, 256))),
    };
    if (modelId) request.model = modelId;

    controller = new AbortController();
    setBusy(true);
    el.status.textContent = 'generating\u2026';
    try {
      const res = await fetch('/v1/chat/completions', {
        method: 'POST', headers: headers(), body: JSON.stringify(request), signal: controller.signal,
      });
      if (!res.ok) {
        const body = await res.json().catch(() => null);
        throw new Error(body && body.error ? body.error.message : `HTTP ${res.status}`);
      }
      await readEvents(res, (data) => {
        if (data === '[DONE]') return false;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const choice = chunk.choices && chunk.choices[0];
        const delta = choice && choice.delta && choice.delta.content;
        if (delta) {
          reply.content += delta;
          view.body.textContent = reply.content;
          scrollDown();
        }
        if (choice && choice.finish_reason) reply.finish = choice.finish_reason;
        if (chunk.usage) {
          el.status.textContent = `${chunk.usage.completion_tokens} tokens ` +
            `(${chunk.usage.prompt_tokens} in the prompt)`;
        }
        return true;
      });
      if (reply.finish === 'length') reply.note = 'cut at the token limit';
      if (el.status.textContent === 'generating\u2026') el.status.textContent = 'done';
    } catch (e) {
      if (e.name === 'AbortError') {
        reply.note = 'stopped';
        el.status.textContent = 'stopped';
      } else {
        reply.note = e.message;
        reply.error = true;
        el.status.textContent = 'error';
      }
    } finally {
      controller = null;
      setBusy(false);
      view.body.classList.remove('streaming');
      view.foot.textContent = reply.note || '';
      view.foot.className = reply.error ? 'note error' : 'note';
      view.foot.hidden = !reply.note;
      save();
      el.prompt.focus();
    }
  }

  // ---- wiring -------------------------------------------------------------------------------

  el.composer.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = el.prompt.value.trim();
    if (!text || controller) return;
    el.prompt.value = '';
    send(text);
  });

  el.prompt.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      el.composer.requestSubmit();
    }
  });

  el.stop.addEventListener('click', () => {
    if (controller) controller.abort();
  });

  el.newChat.addEventListener('click', () => {
    if (controller) return;
    state.current = null;
    save();
    renderAll();
    el.prompt.focus();
  });

  restoreSettings();
  renderAll();
  fetchModel();
  el.prompt.focus();
})();
