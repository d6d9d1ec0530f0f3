"""What a prompt row must hold: one rule for the spec's inline rows (checked at submit) and for
rows read from a file or the hub (checked when the job loads them). Torch-free.

A prompt is a non-blank string or a non-empty list of chat messages ``{"role", "content"}`` with
a role chat templates know (``system``, ``user``, ``assistant``) and string content. OpenAI's
training files (what teams leaving its fine-tuning bring) also write a ``developer`` role and
content as a list of text parts (``[{"type": "text", "text": ...}]``): both are taken and read as
the chat templates know them (:func:`chat_prompt`: ``developer`` is ``system``, parts are joined),
so the rest of the core sees one shape. Columns that share a name with an argument every reward
receives would shadow it, so they are refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["MESSAGE_ROLES", "RESERVED_COLUMNS", "chat_prompt", "prompt_problem", "reward_column_names",
           "reward_columns", "reserved_in"]

# The inputs score_completions passes every reward besides the dataset's columns.
RESERVED_COLUMNS = frozenset({"completions", "prompts", "raw_completions", "prompt_messages",
                              "completion_messages", "environment_reward"})
MESSAGE_ROLES = ("system", "user", "assistant")


# OpenAI's names, read as the chat templates' ones.
_ROLE_ALIASES = {"developer": "system"}
_TEXT_PART_TYPES = ("text", "input_text")


def _content_problem(content: Any) -> str | None:
    if isinstance(content, str):
        return None
    if not isinstance(content, list) or not content:
        return "a message whose content is not a string (or a non-empty list of text parts)"
    for part in content:
        if not (isinstance(part, dict) and part.get("type") in _TEXT_PART_TYPES
                and isinstance(part.get("text"), str)):
            return "a message with a content part that is not {'type': 'text', 'text': str}"
    return None


def _message_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return f"a message that is {type(item).__name__}, not a {{'role', 'content'}} object"
    role = item.get("role")
    if role not in MESSAGE_ROLES and role not in _ROLE_ALIASES:
        known = ", ".join((*MESSAGE_ROLES, *_ROLE_ALIASES))
        return f"a message whose role is {role!r:.40}, not one of {known}"
    return _content_problem(item.get("content"))


def chat_prompt(value: Any) -> Any:
    """A usable prompt as the core reads it: text as it is; messages with OpenAI's ``developer``
    as ``system`` and text parts joined into one string (other keys of a message are kept)."""
    if not isinstance(value, list):
        return value
    messages = []
    for message in value:
        content = message["content"]
        if isinstance(content, list):
            content = "".join(part["text"] for part in content)
        role = _ROLE_ALIASES.get(message["role"], message["role"])
        messages.append({**message, "role": role, "content": content})
    return messages


def prompt_problem(value: Any) -> str | None:
    """None for a usable prompt, else what is wrong with it (``"an empty list"``...)."""
    if isinstance(value, str):
        return None if value.strip() else "a blank string"
    if isinstance(value, list):
        if not value:
            return "an empty list"
        return next(filter(None, map(_message_problem, value)), None)
    return type(value).__name__


def reserved_in(columns: Iterable[str]) -> list[str]:
    """The reserved names among ``columns``, sorted."""
    return sorted(RESERVED_COLUMNS.intersection(columns))


def reward_column_names(rows: Iterable[dict[str, Any]], prompt_field: str) -> set[str]:
    """Columns a reward may ask for by name: every key of ``rows`` but the prompt
    (:func:`reward_columns`)."""
    return reward_columns((key for row in rows for key in row), prompt_field)


def reward_columns(columns: Iterable[Any], prompt_field: str) -> set[str]:
    """Of a dataset's ``columns``, those a reward may ask for by name: all but the prompt (a
    ``prompt`` column is dropped too when ``prompt_field`` names another, see
    :mod:`grpo_core.io.prompt_data`). For inline rows and an uploaded file's recorded columns alike."""
    return {str(column) for column in columns if column not in (prompt_field, "prompt")}
