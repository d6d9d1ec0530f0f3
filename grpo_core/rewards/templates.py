"""OpenAI's grader templates: ``{{sample.output_text}}``, ``{{sample.output_json.answer}}``,
``{{item.reference_answer}}`` and the like, rendered for one scored row.

A template is text with references in double braces (spaces inside the braces allowed). A
reference names a namespace and a path of keys:

- ``sample``: what the model produced for the row: ``output_text`` (its answer, reasoning parsed
  off), ``output_json`` (that text parsed as JSON, a fenced ```json block accepted; null when it is
  not JSON) and, for a multi-turn episode, ``messages``;
- ``item``: the dataset row, its columns by name (``prompt`` as the dataset gave it).

A string value is inserted as it is; any other value as its JSON. A reference to a key the row
does not have makes the row unscorable for that grader (:class:`MissingValue`), as a grader
reading a column the row lacks could not score it. A null value counts as missing: a row of a
dataset whose rows differ in their columns reads null in the columns it lacks (as the other
rewards see it), and a completion that is no JSON has a null ``output_json``.

Nothing here runs code: a template is only text with paths, checked when the spec is
(:func:`check_template`), so a team's grader JSON can be taken from any source.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "MAX_TEMPLATE_CHARS",
    "OUTPUT_TEXT",
    "MissingValue",
    "check_template",
    "item_columns",
    "render",
    "sample_of",
]

MAX_TEMPLATE_CHARS = 20_000
OUTPUT_TEXT = "{{sample.output_text}}"  # the answer: OpenAI's usual input, our graders' default
_REFERENCE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_PATH = re.compile(r"(sample|item)((?:\.[A-Za-z0-9_\-]+)+)")
_SAMPLE_KEYS = frozenset({"output_text", "output_json", "messages"})
_FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\n(.*?)\n?[ \t]*```\s*\Z", re.DOTALL | re.IGNORECASE)


class MissingValue(LookupError):
    """A template referenced a key the row does not have."""


def _references(template: str) -> Iterator[tuple[str, list[str]]]:
    for match in _REFERENCE.finditer(template):
        path = _PATH.fullmatch(match.group(1))
        if path is None:
            raise ValueError(f"'{{{{{match.group(1)}}}}}' is not a reference: use {{{{sample.KEY}}}} or "
                             "{{item.COLUMN}} (keys joined with dots)")
        yield path.group(1), path.group(2).lstrip(".").split(".")


def check_template(template: str) -> str:
    """``template`` when every reference in it is well formed; a ValueError saying which is not."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"at most {MAX_TEMPLATE_CHARS} characters")
    for namespace, keys in _references(template):
        if namespace == "sample" and keys[0] not in _SAMPLE_KEYS:
            raise ValueError(f"'sample.{keys[0]}' is not a sample field; one of: "
                             + ", ".join(sorted(_SAMPLE_KEYS)))
        if namespace == "sample" and keys[0] == "output_text" and len(keys) > 1:
            # A string has no keys: the reference could never resolve, on any row.
            raise ValueError(f"'sample.{'.'.join(keys)}': output_text is text and has no keys "
                             "(sample.output_json.KEY reads a key of the answer's JSON)")
    return template


def item_columns(*templates: str) -> list[str]:
    """The dataset columns the templates read (``item.COLUMN...``), in first-seen order."""
    seen: dict[str, None] = {}
    for template in templates:
        for namespace, keys in _references(template):
            if namespace == "item":
                seen.setdefault(keys[0], None)
    return list(seen)


def _json_of(text: str) -> Any:
    fenced = _FENCE.match(text)
    try:
        return json.loads(fenced.group(1) if fenced else text)
    except (ValueError, RecursionError):  # a model's text may nest deeper than the parser goes
        return None


def sample_of(output_text: str, messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``sample`` a row's templates see, from the completion's text (and its conversation)."""
    sample: dict[str, Any] = {"output_text": output_text, "output_json": _json_of(output_text)}
    if messages is not None:
        sample["messages"] = messages
    return sample


def _lookup(value: Any, namespace: str, keys: list[str]) -> Any:
    for depth, key in enumerate(keys):
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list | tuple) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise MissingValue(f"{namespace}.{'.'.join(keys[:depth + 1])} is not in this row")
    if value is None:
        raise MissingValue(f"{namespace}.{'.'.join(keys)} is null in this row")
    return value


def _as_text(value: Any) -> str:
    # default=str: a dataset's values may be what JSON has no type for (a Parquet date).
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def render(template: str, sample: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    """``template`` with each reference replaced by the row's value (:class:`MissingValue` when the
    row lacks one)."""
    scopes = {"sample": sample, "item": item}

    def value(match: re.Match[str]) -> str:
        path = _PATH.fullmatch(match.group(1))
        if path is None:  # check_template refused it when the spec was read
            raise ValueError(f"'{match.group(0)}' is not a reference")
        namespace = path.group(1)
        return _as_text(_lookup(scopes[namespace], namespace, path.group(2).lstrip(".").split(".")))

    return _REFERENCE.sub(value, template)
