"""OpenAI grader objects as entries of a spec's ``rewards:`` list.

A team coming from OpenAI's reinforcement fine-tuning already has its grader written as OpenAI's
JSON (``{"type": "string_check", "name": ..., "input": ..., "reference": ..., "operation": ...}``).
Rather than a second way of scoring, each grader type is a reward of the registry under the same
name, whose ``args`` are the grader's own fields: :func:`rewards_from_openai_grader` only drops
what names or labels the grader (``type``, ``name``) and what only OpenAI's evals read
(``pass_threshold``). So a field keeps its name and its place: ``rewards.N.args.FIELD`` of the
result is ``FIELD`` of the grader object (``graders.a.operation`` inside a ``multi``), and an
error the reward's args model reports at submit points back into the grader as it was written.

``python`` keeps ``source`` (and this service's own limits, ``timeout_seconds``, ``memory_mb``...,
when given); OpenAI's ``image_tag`` is accepted with any value and ignored: our graders run in
one sandbox image, the sandbox's Python with the standard library. A ``multi``'s ``graders`` stay
OpenAI objects inside its args (the ``multi`` reward converts each with
:func:`openai_grader_reward`); one may not be a ``multi`` itself, as in OpenAI's API.

Only the shape is checked here: an object, a known ``type``, a ``multi``'s ``graders`` an object
of grader objects. This module is in the spec layer, which knows no reward: the fields are the
rewards' args models' to check, when the spec is validated. Nothing is executed; torch-free.
"""

from __future__ import annotations

import copy
from typing import Any

from grpo_core.errors import SpecError

__all__ = ["OPENAI_GRADER_TYPES", "openai_grader_names", "openai_grader_reward", "rewards_from_openai_grader"]

# Each maps to the reward of the same name in the registry.
OPENAI_GRADER_TYPES = ("string_check", "text_similarity", "python", "score_model", "label_model", "multi")
_NOT_ARGS = frozenset({"type", "name", "pass_threshold"})  # what labels a grader, or only evals read
_IGNORED = {"python": frozenset({"image_tag"})}  # accepted for compatibility, no meaning here


def openai_grader_names() -> list[str]:
    """The grader ``type`` values :func:`rewards_from_openai_grader` accepts."""
    return list(OPENAI_GRADER_TYPES)


def _type_of(grader: Any, nested: bool) -> str:
    if not isinstance(grader, dict):
        raise SpecError("", f"a grader must be an object with a 'type', not {type(grader).__name__}")
    kind = grader.get("type")
    allowed = ", ".join(name for name in OPENAI_GRADER_TYPES if not (nested and name == "multi"))
    if kind is None:
        raise SpecError("type", f"a grader needs a 'type': one of {allowed}")
    if not isinstance(kind, str) or kind not in OPENAI_GRADER_TYPES:
        raise SpecError("type", f"unknown grader type {kind!r:.60}; one of {allowed}")
    if nested and kind == "multi":
        raise SpecError("type", "a multi grader's graders cannot be multi graders themselves")
    return kind


def _check_graders(graders: Any) -> None:
    """A multi's ``graders``: an object of grader objects, each of a type a multi may hold."""
    if not isinstance(graders, dict) or not graders:
        raise SpecError("graders", "must be an object of named graders ({name: grader}), at least one")
    for name, grader in graders.items():
        try:
            openai_grader_reward(grader, nested=True)
        except SpecError as exc:
            raise SpecError(_join("graders", str(name), exc.field), exc.reason) from None


def _join(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def openai_grader_reward(grader: Any, *, nested: bool = False) -> dict[str, Any]:
    """One OpenAI grader object as one ``rewards:`` entry ``{"name", "args"}``. ``nested``: it
    is one of a ``multi``'s graders (so not a ``multi``). A :class:`SpecError` whose ``field`` is
    the path inside the grader ("" for the grader itself) when it cannot be converted."""
    kind = _type_of(grader, nested)
    if kind == "multi" and "graders" in grader:
        _check_graders(grader["graders"])
    dropped = _NOT_ARGS | _IGNORED.get(kind, frozenset())
    # A copy: the caller's object (a request body) stays theirs, and the spec's args stay ours.
    args = {key: copy.deepcopy(value) for key, value in grader.items() if key not in dropped}
    return {"name": kind, "args": args}


def rewards_from_openai_grader(grader: Any) -> list[dict[str, Any]]:
    """The ``rewards:`` entries that score as ``grader`` does: one entry, the reward named after
    its type, with the grader's fields as ``args`` (see the module's docstring). Raises
    :class:`SpecError` with the path inside the grader (``type``, ``graders.a.type``) when it is
    not a grader object of a known type."""
    return [openai_grader_reward(grader)]
