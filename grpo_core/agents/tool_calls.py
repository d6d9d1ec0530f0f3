"""Tool calls read from a model's turn. The format is the one Hermes-style templates (Qwen 2.5/3,
Hermes, and this service's fallback for templates without tools: :mod:`grpo_core.agents.rendering`)
teach the model: a JSON object per call between ``<tool_call>`` and ``</tool_call>``::

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call>

``parameters`` is read as ``arguments`` (Llama 3.1's key), arguments given as a JSON string are
decoded, and a last block the turn ended inside (no closing tag: the turn stopped at EOS) still
counts. A block that is not such an object is a call that failed: its tool message says why, as a
tool's exception does, and it counts in ``tool_errors/frequency``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)
MAX_CALLS_PER_TURN = 8  # more in one turn are answered with an error, not run


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it: a tool's name and arguments, or why it cannot be run."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def as_message_call(self) -> dict[str, Any]:
        """The call as a chat message's ``tool_calls`` entry (what templates render)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block of ``text``, in order."""
    calls = [_call(match.group(1)) for match in _BLOCK.finditer(text)]
    for index in range(MAX_CALLS_PER_TURN, len(calls)):
        calls[index] = ToolCall(
            calls[index].name, error=f"more than {MAX_CALLS_PER_TURN} tool calls in one turn"
        )
    return calls


def content_without_calls(text: str) -> str:
    """The turn's text with its tool-call blocks taken out (the assistant message's content)."""
    return _BLOCK.sub("", text).strip()


def _call(body: str) -> ToolCall:
    try:
        value = json.loads(body.strip())
    except ValueError as exc:
        return ToolCall("unknown", error=f"the tool call is not valid JSON ({exc.msg})")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall("unknown", error='a tool call is a JSON object {"name": ..., "arguments": {...}}')
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(value["name"], error="the tool call's arguments are not a JSON object")
    return ToolCall(value["name"], arguments)
