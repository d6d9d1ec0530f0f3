// The dashboard's conversation lines (api/http/dashboard/conversation.js) for an episode's messages
// as grpo_core's sample rows carry them.

import assert from "node:assert/strict";
import {test} from "node:test";

import {conversationLines} from "../../api/http/dashboard/conversation.js";

test("an assistant turn shows its calls, a tool message its tool's name and result", () => {
  const messages = [
    {role: "assistant", content: "", tool_calls: [{type: "function", function: {name: "add", arguments: {a: 2, b: 3}}}]},
    {role: "tool", name: "add", content: "5"},
    {role: "assistant", content: "5"},
  ];
  assert.deepEqual(conversationLines(messages), [
    {role: "assistant", label: "assistant", text: '→ add({"a":2,"b":3})'},
    {role: "tool", label: "tool add", text: "5"},
    {role: "assistant", label: "assistant", text: "5"},
  ]);
});

test("a single-turn row has no conversation; a long result is cut", () => {
  assert.deepEqual(conversationLines(undefined), []);
  const [line] = conversationLines([{role: "tool", name: "t", content: "x".repeat(2500)}]);
  assert.equal(line.text.length, 2001);
  assert.ok(line.text.endsWith("…"));
});

test("an environment's turn shows the reward its step gave; an observation is a user line", () => {
  const messages = [
    {role: "assistant", content: "3", reward: 0.1},
    {role: "user", content: "No: higher."},
    {role: "assistant", content: "7", reward: 1},
    {role: "assistant", content: "cut short", reward: null},
  ];
  assert.deepEqual(conversationLines(messages), [
    {role: "assistant", label: "assistant · reward 0.1", text: "3"},
    {role: "user", label: "user", text: "No: higher."},
    {role: "assistant", label: "assistant · reward 1", text: "7"},
    {role: "assistant", label: "assistant", text: "cut short"},
  ]);
});
