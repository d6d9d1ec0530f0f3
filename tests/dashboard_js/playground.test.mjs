// The playground's reading of a chat stream (api/http/dashboard/playground.js): server-sent events
// as the service sends them (a keep-alive comment, chunks split anywhere, [DONE]) and the
// request it builds. Run by `node --test tests/dashboard_js/` (tests/test_dashboard_js.py).

import assert from "node:assert/strict";
import {test} from "node:test";

import {MAX_TOKENS, chatBody, deltaOf, readEvents} from "../../api/http/dashboard/playground.js";

const chunk = (content) => JSON.stringify({object: "chat.completion.chunk", choices: [{index: 0, delta: {content}}]});

test("complete events are read, a partial one is kept for the next read", () => {
  const wire = `: waiting\n\ndata: ${chunk("Hel")}\n\ndata: ${chunk("lo")}\n\ndata: ${chunk("!")}`;
  const first = readEvents(wire);
  assert.deepEqual(first.events.map(deltaOf), ["Hel", "lo"]);
  assert.equal(first.done, false);
  const second = readEvents(first.rest + "\n\ndata: [DONE]\n\n");
  assert.deepEqual(second.events.map(deltaOf), ["!"]);
  assert.equal(second.done, true);
  assert.equal(second.rest, "");
});

test("a chunk with no content adds nothing; an error mid-stream is an Error", () => {
  assert.equal(deltaOf({choices: [{index: 0, delta: {role: "assistant"}}]}), "");
  assert.equal(deltaOf({choices: []}), "");  // the usage chunk
  const failed = deltaOf({error: {message: "the serving job was preempted"}});
  assert.ok(failed instanceof Error && failed.message.includes("preempted"));
});

test("the body carries the system message, the conversation and stream: true", () => {
  const body = chatBody("job:7@40", "  Be brief. ", [{role: "user", content: "hi"}]);
  assert.deepEqual(body, {model: "job:7@40", stream: true, max_tokens: MAX_TOKENS,
    messages: [{role: "system", content: "Be brief."}, {role: "user", content: "hi"}]});
  assert.deepEqual(chatBody("job:7", " ", []).messages, []);
});
