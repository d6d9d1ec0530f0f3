"""How an episode's text is laid out for the model: the prompt with the tools it may call, and
the tokens of what comes back (tool results, an environment's observation) before its next turn.

With a chat template that renders tools (its source reads ``tools``, as Qwen's, Llama 3.1's and
Hermes' do), the tools go to it as ``tools=`` (their JSON schemas) and results as ``role: tool``
messages, so the model sees exactly the format it was tuned on. Other templates, and plain-text
prompts, get this service's documented fallback (docs/user_guide.md, "Tools"): the tools listed
as JSON in a system message (or before a text prompt), calls written as ``<tool_call>{...}</tool_call>``
and results given back inside ``<tool_response>...</tool_response>`` as a user message (or plain text).

Observation tokens are found as TRL finds them: render a short conversation that ends with an
assistant turn, then the same with the new messages and the generation prompt, and keep what
the second adds after the first's last end-of-turn token. Only those tokens are appended to a
trajectory; the model's own tokens are never re-rendered or re-tokenized.
"""

from __future__ import annotations

import json
from typing import Any

from grpo_core.agents.tool_calls import CLOSE, OPEN
from grpo_core.errors import SpecError
from grpo_core.spec.tool_schemas import ToolSet

RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def fallback_tools_text(tools: ToolSet) -> str:
    """The tools described for a model whose template cannot render them."""
    listing = "\n".join(json.dumps(schema) for schema in tools.schemas)
    return (
        f"You can call these tools:\n<tools>\n{listing}\n</tools>\n"
        f'To call a tool, write {OPEN}{{"name": <tool name>, "arguments": <its arguments as a JSON '
        f"object>}}{CLOSE}; its result comes back between {RESPONSE_OPEN} and {RESPONSE_CLOSE}. "
        "Answer without a tool call once you are done."
    )


class Conversations:
    """Prompts and observations for one tokenizer, one tool set (or none: an environment's
    episodes) and the spec's ``chat_template_kwargs``."""

    def __init__(
        self, tokenizer: Any, tools: ToolSet | None, template_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.tokenizer, self.tools = tokenizer, tools
        self.template_kwargs = dict(template_kwargs or {})
        template = getattr(tokenizer, "chat_template", None)
        self.has_template = bool(template)
        self.native_tools = tools is not None and isinstance(template, str) and "tools" in template

    def prompt_text(self, prompt: str | list[dict[str, Any]]) -> str:
        """The rendered prompt of a dataset row (text or messages), tools included."""
        if isinstance(prompt, str):
            return prompt if self.tools is None else f"{fallback_tools_text(self.tools)}\n\n{prompt}"
        if not self.has_template:
            raise SpecError("dataset.prompts", "chat-style prompts need a tokenizer with a chat template")
        messages = list(prompt)
        extra: dict[str, Any] = {}
        if self.native_tools:
            extra["tools"] = [dict(schema) for schema in self.tools.schemas]
        elif self.tools is not None:
            messages = _with_system(messages, fallback_tools_text(self.tools))
        return self._render(messages, add_generation_prompt=True, **extra)

    def tool_messages(self, results: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The messages that carry a turn's tool results (``(tool name, content)`` each)."""
        if self.native_tools:
            return [{"role": "tool", "name": name, "content": content} for name, content in results]
        body = "\n".join(f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}" for _, content in results)
        return [{"role": "user", "content": body}]

    def observation_ids(self, messages: list[dict[str, Any]], chat: bool) -> list[int]:
        """The tokens that follow the model's turn: ``messages`` (tool results, an observation as a
        user message) and the prompt of the model's next turn. ``chat``: the episode's prompt was
        messages; a text prompt's episode continues as plain text."""
        if not chat or not self.has_template:
            text = "\n" + "\n".join(str(m["content"]) for m in messages) + "\n"
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        calls = [
            {"type": "function", "function": {"name": m.get("name", "tool"), "arguments": {}}}
            for m in messages
            if m["role"] == "tool"
        ]
        before = [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": "" if calls else "x",
                **({"tool_calls": calls} if calls else {}),
            },
        ]
        prefix = self._render(before, add_generation_prompt=False)
        full = self._render(before + messages, add_generation_prompt=True)
        eos = getattr(self.tokenizer, "eos_token", None)
        if eos and eos in prefix:  # the turn ends at the model's EOS; what the template adds after it is ours
            prefix = prefix[: prefix.rindex(eos) + len(eos)]
        if not full.startswith(prefix):
            raise SpecError(
                "grpo.chat_template_kwargs",
                "the chat template renders a conversation's start "
                "differently once messages follow it: observations "
                "cannot be appended to a trajectory",
            )
        return self.tokenizer(full[len(prefix) :], add_special_tokens=False)["input_ids"]

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **extra: Any) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **extra,
                **self.template_kwargs,
            )
        except Exception as exc:  # a template may raise on roles or fields it does not support
            raise SpecError(
                "dataset.prompts", f"the chat template could not render a conversation: {exc}"
            ) from exc


def with_observation(prompt: str | list[dict[str, Any]], observation: str) -> str | list[dict[str, Any]]:
    """A dataset row's prompt with an environment's first observation added: at the end of the
    last user message (a new user message when the last is not the user's), or of a text prompt."""
    if isinstance(prompt, str):
        return f"{prompt}\n\n{observation}"
    messages = [dict(message) for message in prompt]
    if messages and messages[-1].get("role") == "user" and isinstance(messages[-1].get("content"), str):
        messages[-1]["content"] = f"{messages[-1]['content']}\n\n{observation}"
    else:
        messages.append({"role": "user", "content": observation})
    return messages


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
