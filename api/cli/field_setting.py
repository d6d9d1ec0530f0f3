"""``--set PATH=VALUE`` for ``grpo submit`` and ``grpo clone``: change a spec's fields without a
file. PATH is dotted (``grpo.learning_rate``); a part that is a whole number indexes a list
(``rewards.0.weight``). VALUE is read as YAML (``true``, ``null``, ``[a, b]``, ``{k: v}``; empty:
null), except that bare text in JSON's number grammar is a number: YAML 1.1, which PyYAML reads,
wants a dot in a float and would read ``2e-6`` as a string (quoted, ``"'2e-6'"``, it stays one).
As in a spec file, ``yes``/``no``/``on``/``off`` are booleans: quote a string that reads as one.

A key the spec does not have yet is added (the service then names a field it does not know in
its 422); a list index past the end, or a path through a number or a string, is refused here.
Pure: no I/O, the caller's data is never changed in place."""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?P<fraction>\.[0-9]+)?(?P<exponent>[eE][+-]?[0-9]+)?")


class FieldSettingError(ValueError):
    """A ``--set`` that cannot apply; the message names it."""


def parse_setting(text: str) -> tuple[list[str], Any]:
    """``"grpo.learning_rate=2e-6"`` → ``(["grpo", "learning_rate"], 2e-06)``."""
    path, equals, raw = text.partition("=")
    parts = path.strip().split(".")
    if not equals or not all(parts):
        raise FieldSettingError(f"'{text}' is not PATH=VALUE (e.g. grpo.learning_rate=2e-6)")
    return parts, parse_value(raw)


def parse_value(raw: str) -> Any:
    # Only the bare text: a quoted '2e-6' stays the string the user quoted it to be.
    if number := _JSON_NUMBER.fullmatch(raw.strip()):
        whole = number["fraction"] is None and number["exponent"] is None
        return int(raw) if whole else float(raw)
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise FieldSettingError(f"'{raw}' is not a YAML value: {error}") from None


def with_settings(spec: dict[str, Any], settings: list[str]) -> dict[str, Any]:
    """A copy of ``spec`` with each ``PATH=VALUE`` of ``settings`` applied in order."""
    changed = copy.deepcopy(spec)
    for text in settings:
        parts, value = parse_setting(text)
        _set(changed, parts, value, text)
    return changed


def _set(data: dict[str, Any], parts: list[str], value: Any, text: str) -> None:
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise FieldSettingError(f"{text}: {where} is not an index of a list of {len(node)}")
            key: Any = int(part)
        elif isinstance(node, dict):
            key = part
            if not last and node.get(key) is None:
                node[key] = {}  # a new (or null) nested field: the service says whether it knows it
        else:
            parent = ".".join(parts[:depth])
            raise FieldSettingError(f"{text}: {parent} is {node!r}, which has no field {part}")
        if last:
            node[key] = value
        else:
            node = node[key]
