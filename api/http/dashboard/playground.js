// "Chat with this model" on a job's page: a conversation with the job's final model (job:ID) or
// one of its checkpoints (job:ID@STEP), sent to POST /v1/chat/completions with stream: true and
// shown as the answer streams in. The service starts (or reuses) the team's serving job of that
// model; the first answer waits for it to load, the next ones do not.

import {authHeaders, refusal} from "./api.js";
import {el, fill} from "./dom.js";

export const MAX_TOKENS = 256;

// Server-sent events read so far: the JSON payload of each complete `data:` line, and the text
// left over (an event not finished yet). `[DONE]` ends the stream; comment lines (`: ...`, the
// service's keep-alive while the model is silent) are skipped.
export function readEvents(buffer) {
  const events = [];
  let done = false;
  const parts = buffer.split("\n\n");
  const rest = parts.pop();
  for (const part of parts) {
    for (const line of part.split("\n")) {
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") done = true;
      else if (data) events.push(JSON.parse(data));
    }
  }
  return {events, rest, done};
}

// The text an event adds to the answer, or an Error when the service failed mid-stream.
export function deltaOf(event) {
  if (event.error) return new Error(event.error.message || "the service failed mid-answer");
  const choice = (event.choices || [])[0];
  return (choice && choice.delta && choice.delta.content) || "";
}

// The request body for `messages` (the conversation so far) under `system`.
export function chatBody(model, system, messages) {
  const head = system.trim() ? [{role: "system", content: system.trim()}] : [];
  return {model, messages: [...head, ...messages], stream: true, max_tokens: MAX_TOKENS};
}

async function* streamedText(body) {
  const response = await fetch("/v1/chat/completions", {method: "POST",
    headers: {...authHeaders(), "Content-Type": "application/json", Accept: "text/event-stream"},
    body: JSON.stringify(body)});
  if (!response.ok) throw refusal(response.status, await response.json().catch(() => null));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    const read = readEvents(buffer + decoder.decode(value, {stream: true}));
    buffer = read.rest;
    for (const event of read.events) {
      const delta = deltaOf(event);
      if (delta instanceof Error) throw delta;
      if (delta) yield delta;
    }
    if (read.done) return;
  }
}

export function mountPlayground(container, job) {
  const model = el("input", {name: "playground-model", value: `job:${job.id}`, size: 24,
    title: "job:ID (the final model) or job:ID@STEP (a checkpoint)"});
  const system = el("input", {name: "playground-system", placeholder: "System message (optional)", size: 50});
  const log = el("div", {className: "conversation playground-log", role: "log"});
  const input = el("textarea", {name: "playground-input", rows: 2, cols: 80, placeholder: "Your message"});
  const status = el("p", {className: "hint", role: "status"});
  const send = el("button", {type: "button", onclick: () => ask()}, "Send");
  const clear = el("button", {type: "button", onclick: () => { messages.length = 0; fill(log); }}, "Clear");
  const messages = [];
  container.append(el("div", {className: "toolbar"}, "Model ", model, " ", system), log, input,
    el("div", {className: "toolbar"}, send, clear), status);

  function bubble(role, text) {
    const body = el("div", {className: "content"}, text);
    log.append(el("div", {className: `message ${role}`, dataset: {role}}, el("div", {className: "role"}, role), body));
    return body;
  }

  async function ask() {
    const text = input.value.trim();
    if (!text) return;
    messages.push({role: "user", content: text});
    bubble("user", text);
    input.value = "";
    const answer = bubble("assistant", "");
    send.disabled = true;
    status.textContent = "Waiting for the model (its serving job may be starting)…";
    let reply = "";
    try {
      for await (const delta of streamedText(chatBody(model.value.trim(), system.value, messages))) {
        reply += delta;
        answer.textContent = reply;
        status.textContent = "";
      }
      messages.push({role: "assistant", content: reply});
      status.textContent = "";
    } catch (error) {
      messages.pop();  // the question goes unanswered: it is not part of the next request
      answer.closest(".message").classList.add("failed");
      status.textContent = `No answer: ${error.message}`;
    } finally {
      send.disabled = false;
    }
  }
}
