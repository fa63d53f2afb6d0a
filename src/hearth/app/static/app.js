// hearth: a little progressive enhancement. Every form works without this file (plain POST +
// redirect); with it, chat replies stream in and the analyst panel fills in as each analyst answers.
"use strict";

async function readEvents(response, onEvent) {
  // Minimal SSE reader over fetch (EventSource cannot POST).
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      onEvent(event, data ? JSON.parse(data) : {});
    }
  }
}

async function postStream(form, body) {
  const response = await fetch(form.action, {
    method: "POST", body, credentials: "same-origin",
    headers: { "Accept": "text/event-stream", "X-CSRF-Token": form.elements.csrf.value },
  });
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const j = await response.json();
      detail = j.detail || j.error || detail;
      if (typeof detail !== "string") detail = JSON.stringify(detail);
    } catch (e) { /* not JSON */ }
    throw new Error(detail);
  }
  return response;
}

function bubble(list, role, text) {
  const li = document.createElement("li");
  li.className = "msg " + role;
  const p = document.createElement("p");
  p.textContent = text;
  li.appendChild(p);
  list.appendChild(li);
  reveal(li);
  return li;
}

function setText(p, text, what) {
  // a saved text the server could not open (a damaged row, sent as null in a replayed answer) is said so, as the
  // page itself says it
  if (text === null || text === undefined) {
    p.className = "error"; p.textContent = "This " + what + " could not be read: its stored text does not open.";
  } else {
    p.textContent = text;
  }
}

function reveal(el) {
  // bring a message that is new or grew (streamed text, the panel's readings) into view: all of it when it
  // fits the window, else its start. Scrolled to only once, when it was empty, a reply grew out of sight.
  const r = el.getBoundingClientRect();
  if (r.top >= 0 && r.bottom <= window.innerHeight) return;
  el.scrollIntoView({ block: r.height <= window.innerHeight ? "end" : "start" });
}

function refocus(box, button) {
  // disabling the focused Send button drops the focus to <body> (a keyboard user's next keys went nowhere):
  // give it to the message box, unless the user has put it somewhere else meanwhile
  const active = document.activeElement;
  if (!active || active === document.body || active === button) box.focus({ preventScroll: true });
}

function addMemories(memories) {
  let list = document.getElementById("memories");
  if (!memories.length) return;
  if (!list) {
    const empty = document.getElementById("no-memories");
    list = document.createElement("ul");
    list.className = "list"; list.id = "memories";
    if (empty) empty.replaceWith(list); else return;
  }
  for (const text of memories) {
    const li = document.createElement("li");
    li.textContent = text;
    list.appendChild(li);
  }
}

function updateStage(data) {
  // the stage pill follows each reply: its label, and the totals its tooltip shows (as the page renders it)
  const stage = document.getElementById("stage");
  if (!stage) return;
  if (data.stage) stage.textContent = data.stage;
  if (data.stage_key) stage.dataset.stage = data.stage_key;
  if (Number.isInteger(data.affection) && Number.isInteger(data.trust)) {
    stage.title = "affection " + data.affection + ", trust " + data.trust;
  }
}

function submissionId() {
  // 32 hex digits from the browser's CSPRNG (crypto.randomUUID exists only on HTTPS and localhost pages)
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function streamTurns(form, list, error, lost, start) {
  // a message form whose reply streams in (chat, rehearsal): the user's and the reply's bubbles stay pending
  // until "done"; "delta" text is appended to the reply; `start(mine, reply)` gives the handler of every other
  // event for this turn. An "error" event (nothing was saved), or a stream that ends before "done" (`lost`: the
  // server still finishes the turn, so it may be saved), removes both bubbles, shows the error, and gives the
  // text back to the box.
  // Each message goes with an id of its own; sending the same text again after a failure reuses that send's id,
  // so a turn the server saved although the page never heard back comes back (a "done" that is `replayed`)
  // instead of being saved twice.
  let unanswered = null;  // {text, id} of the last send whose turn the page did not see saved
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const box = form.elements.message;
    const text = box.value.trim();
    if (!text) return;
    const body = new URLSearchParams(new FormData(form));  // before the box is emptied
    const id = unanswered && unanswered.text === text ? unanswered.id : submissionId();
    body.set("submission_id", id);
    unanswered = { text, id };
    const button = form.querySelector("button");
    button.disabled = true;
    error.hidden = true;
    const mine = bubble(list, "user pending", text);
    const reply = bubble(list, "companion pending", "");
    box.value = "";
    const onEvent = start(mine, reply);
    let finished = false;
    try {
      const response = await postStream(form, body);
      await readEvents(response, (event, data) => {
        if (event === "delta") {
          reply.querySelector("p").textContent += data.text;
          reveal(reply);
        } else if (event === "error") {
          throw new Error(data.message);
        } else {
          if (event === "done") {
            finished = true; unanswered = null;
            mine.classList.remove("pending"); reply.classList.remove("pending");
          }
          onEvent(event, data);
          if (reply.isConnected) reveal(reply);
        }
      });
      if (!finished) throw new Error(lost);
    } catch (e) {
      mine.remove(); reply.remove();
      box.value = text;
      error.textContent = e.message; error.hidden = false;
    } finally {
      button.disabled = false;
      refocus(box, button);
    }
  });
}

function moodTag(mood) {
  // a reply's mood as the pages show it (the companion's in chat, the person's in a rehearsal)
  const tag = document.createElement("span");
  tag.className = "mood"; tag.textContent = mood;
  return tag;
}

function setupChat(form) {
  const list = document.getElementById("messages");
  const error = document.getElementById("chat-error");
  list.addEventListener("click", (ev) => {  // a tapped suggestion becomes the next message draft
    if (ev.target.classList.contains("suggestion")) {
      form.elements.message.value = ev.target.textContent;
      form.elements.message.focus();
    }
  });
  const lost = "The connection closed before the reply arrived. It may still be saved: sending it again shows it, without saving it twice.";
  streamTurns(form, list, error, lost, (mine, reply) => (event, data) => {
    if (event !== "done") return;
    setText(reply.querySelector("p"), data.message, "message");
    reply.dataset.id = data.reply_id;
    mine.dataset.id = data.user_message_id;
    if (data.mood) reply.appendChild(moodTag(data.mood));
    updateStage(data);
    addMemories(data.memories || []);
    document.querySelectorAll("#messages .suggestions").forEach((n) => n.remove());
    if ((data.suggested_actions || []).length) {
      const box = document.createElement("div");
      box.className = "suggestions";
      for (const text of data.suggested_actions) {
        const b = document.createElement("button");
        b.type = "button"; b.className = "suggestion"; b.textContent = text; box.appendChild(b);
      }
      reply.appendChild(box);
    }
  });
}

function setupPanel(form) {
  // Each situation goes with an id of its own; asking again with the same text after a failure reuses that ask's
  // id, so a panel the server saved although the page never heard back comes back (a "done" that is `replayed`,
  // with the saved readings) instead of the analysts being asked again and the situation saved twice.
  const panel = document.getElementById("live-panel");
  let unanswered = null;  // {text, id} of the last ask whose panel the page did not see saved
  const reset = () => {
    for (const li of panel.querySelectorAll("li")) {
      li.className = "reading pending";
      li.querySelector("p").className = "muted";  // an unreadable reading shown before made it "error"
      li.querySelector("p").textContent = "thinking…";
      li.querySelectorAll(".advice, .risk").forEach((n) => n.remove());
    }
  };
  const show = (data) => {
    const li = panel.querySelector(`[data-analyst="${data.analyst}"]`);
    li.className = "reading " + (data.ok ? "ok" : "failed");
    if (data.reading === null) {  // a saved reading that does not open (replayed)
      setText(li.querySelector("p"), null, "reading");
      return;
    }
    const risk = document.createElement("span");
    risk.className = "risk " + (data.ok ? data.risk : "high");
    risk.textContent = data.ok ? "risk: " + data.risk : "failed";
    li.querySelector("h4").appendChild(risk);
    li.querySelector("p").textContent = data.ok ? data.reading : "This analyst did not answer. " + data.error;
    if (data.ok) {
      const advice = document.createElement("p");
      advice.className = "advice"; advice.textContent = data.advice; li.appendChild(advice);
    }
  };
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const text = form.elements.situation.value.trim();
    const body = new URLSearchParams(new FormData(form));
    const id = unanswered && unanswered.text === text ? unanswered.id : submissionId();
    body.set("submission_id", id);
    unanswered = { text, id };
    const button = form.querySelector("button");
    button.disabled = true;
    panel.hidden = false;
    document.getElementById("panel-error").hidden = true;
    delete panel.dataset.saved; delete panel.dataset.error;
    let saved = false;
    reset();
    try {
      const response = await postStream(form, body);
      await readEvents(response, (event, data) => {
        if (event === "reading") {
          show(data);
        } else if (event === "done") {
          saved = true; unanswered = null;
          if (data.replayed) {  // an earlier ask of this text saved the panel: show that one, not this one's
            reset();
            for (const r of data.readings || []) show(r);
          }
          panel.dataset.saved = data.situation_id;
          form.elements.situation.value = "";
        } else if (event === "error") {
          throw new Error(data.message);
        }
      });
      if (!saved) throw new Error("The connection closed before the panel arrived. It may still be saved: asking again shows it, without saving it twice.");
    } catch (e) {
      panel.dataset.error = e.message;
      const error = document.getElementById("panel-error");
      error.textContent = e.message; error.hidden = false;  // the situation text stays in the box
    } finally {
      button.disabled = false;
      refocus(form.elements.situation, button);
    }
  });
}

function readingItem(data) {
  const li = document.createElement("li");
  li.className = "reading " + (data.ok ? "ok" : "failed");
  li.dataset.analyst = data.analyst;
  const h4 = document.createElement("h4");
  h4.textContent = data.title + " ";
  li.appendChild(h4);
  if (data.reading === null) {  // a saved reading that does not open (replayed)
    const p = document.createElement("p");
    setText(p, null, "reading");
    li.appendChild(p);
    return li;
  }
  const risk = document.createElement("span");
  risk.className = "risk " + (data.ok ? data.risk : "high");
  risk.textContent = data.ok ? "risk: " + data.risk : "failed";
  h4.appendChild(risk);
  const p = document.createElement("p");
  if (data.ok) {
    p.textContent = data.reading;
    const advice = document.createElement("p");
    advice.className = "advice"; advice.textContent = data.advice;
    li.append(p, advice);
  } else {
    p.className = "muted"; p.textContent = "This analyst did not answer. " + data.error;
    li.appendChild(p);
  }
  return li;
}

function showCoaching(reply, data) {
  // a rehearsal reply's mood and the coaching hints for the user's next line, under the person's message as the
  // page renders them (written outside the role, so set apart from it); shown again for a replayed turn
  reply.querySelectorAll(":scope > .mood, :scope > .coaching").forEach((n) => n.remove());
  const added = [];
  if (data.mood) added.push(moodTag(data.mood));
  if ((data.suggested_actions || []).length) {
    const box = document.createElement("div");
    box.className = "coaching";
    const label = document.createElement("p");
    label.className = "coaching-label"; label.textContent = "Coaching for your next line:";
    const hints = document.createElement("ul");
    hints.className = "hints";
    for (const text of data.suggested_actions) {
      const li = document.createElement("li");
      li.textContent = text; hints.appendChild(li);
    }
    box.append(label, hints);
    added.push(box);
  }
  reply.querySelector("p").after(...added);
}

function setupRehearsal(form) {
  // the agent's reply streams in, then the panel's readings arrive one by one; a failure is shown here
  // and the text goes back into the box (nothing was saved; or, after the reply, the exchange was saved and only
  // the panel's readings were not: the error says so, and saying it again shows the saved exchange)
  const list = document.getElementById("turns");
  const error = document.getElementById("rehearsal-error");
  const lost = "The connection closed before the turn arrived. It may still be saved: saying it again shows it, without saving it twice.";
  streamTurns(form, list, error, lost, (mine, reply) => {
    let details = null, ul = null, got = 0, ok = 0;
    const addReading = (data) => {
      if (!details) {
        details = document.createElement("details");
        details.className = "panel-details"; details.open = true;
        details.appendChild(document.createElement("summary"));
        ul = document.createElement("ul"); ul.className = "panel";
        details.appendChild(ul);
        reply.appendChild(details);
      }
      got += 1; if (data.ok) ok += 1;
      details.querySelector("summary").textContent = "Panel (" + ok + "/" + got + ")";
      ul.appendChild(readingItem(data));
    };
    return (event, data) => {
      if (event === "reply") {
        reply.querySelector("p").textContent = data.message;
        showCoaching(reply, data);
      } else if (event === "reading") {
        addReading(data);
      } else if (event === "done") {
        reply.dataset.id = data.turn_id;
        if (data.replayed) {  // an earlier send of this text saved the turn: show that one, not this one's
          setText(reply.querySelector("p"), data.message, "turn");
          showCoaching(reply, data);
          if (details) details.remove();
          details = null; got = 0; ok = 0;
          for (const r of data.readings || []) addReading(r);
        }
      }
    };
  });
}

document.addEventListener("DOMContentLoaded", () => {
  // "Go back" on the error page: the previous page when there is one (the CSP refuses javascript: links, so
  // this is a listener), else the link's own target (home)
  for (const link of document.querySelectorAll("a[data-back]")) {
    link.addEventListener("click", (ev) => {
      if (history.length > 1) { ev.preventDefault(); history.back(); }
    });
  }
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (ev) => { if (!confirm(form.dataset.confirm)) ev.preventDefault(); });
  }
  for (const form of document.querySelectorAll("form[data-busy]")) {
    form.addEventListener("submit", () => {
      const button = form.querySelector("button");
      button.disabled = true;
      button.textContent = form.dataset.busy;
    });
  }
  const chat = document.querySelector('form[data-stream="chat"]');
  if (chat) setupChat(chat);
  const panel = document.querySelector('form[data-stream="panel"]');
  if (panel) setupPanel(panel);
  const rehearsal = document.querySelector('form[data-stream="rehearsal"]');
  if (rehearsal) setupRehearsal(rehearsal);
  const bottom = document.getElementById("bottom");
  if (bottom && location.hash === "#bottom") bottom.scrollIntoView();
});
