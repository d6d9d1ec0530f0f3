// A multi-turn sample's conversation (grpo_core's episode `messages`) as lines a page can show:
// each assistant turn with the tool calls it made, each tool's result, in order. Pure, so Node
// tests it (tests/dashboard_js/conversation.test.mjs); samples.js turns the lines into elements.

const MAX_CHARS = 2000; // a long tool result is cut on screen (the API has it whole)

const cut = (text) => (text.length > MAX_CHARS ? `${text.slice(0, MAX_CHARS)}…` : text);

function callText(call) {
  const fn = call?.function || {};
  return `${fn.name ?? "?"}(${JSON.stringify(fn.arguments ?? {})})`;
}

// [{role, label, text}] for each message: role "assistant" (its content, then "→ name(args)" per
// call; an environment's turn labelled with the reward its step gave) or "tool" (labelled with
// the tool's name); other roles (an environment's observations: user) as they are.
export function conversationLines(messages) {
  if (!Array.isArray(messages)) return [];
  return messages.map((message) => {
    const role = String(message?.role ?? "?");
    const content = typeof message?.content === "string" ? message.content : JSON.stringify(message?.content ?? "");
    if (role === "tool") return {role, label: `tool ${message.name ?? ""}`.trim(), text: cut(content)};
    const calls = Array.isArray(message?.tool_calls) ? message.tool_calls.map((call) => `→ ${callText(call)}`) : [];
    const label = typeof message?.reward === "number" ? `${role} · reward ${message.reward}` : role;
    return {role, label, text: cut([content, ...calls].filter((part) => part !== "").join("\n"))};
  });
}
