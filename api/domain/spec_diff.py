"""Where job specs differ: each spec flattened to dotted paths (``grpo.learning_rate``; a list's
items by index, ``rewards.0.name``), then the paths whose values are not all the same. A path
one spec lacks counts as ``None`` there; :func:`within_budget` keeps as many of them as fit in a
byte budget. Pure: the compare route and its tests feed it stored specs."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of nested dicts and lists by dotted path. An empty dict or list is a leaf itself,
    so ``{}`` against a missing field still shows as a difference."""
    if isinstance(value, Mapping) and value:
        items = ((str(key), item) for key, item in value.items())
    elif isinstance(value, list) and value:
        items = ((str(index), item) for index, item in enumerate(value))
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in items:
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else key))
    return flat


def spec_differences(specs: Mapping[int, Any]) -> list[dict[str, Any]]:
    """``[{field, values: {job_id: value}}]`` for every path whose values differ between the
    specs (keyed by job id), in path order."""
    flat = {job_id: flatten(spec) for job_id, spec in specs.items()}
    paths = sorted(set().union(*flat.values())) if flat else []
    differences = []
    for path in paths:
        values = {job_id: leaves.get(path) for job_id, leaves in flat.items()}
        if len({_comparable(value) for value in values.values()}) > 1:
            differences.append({"field": path, "values": values})
    return differences


def _comparable(value: Any) -> Any:
    """A hashable stand-in: ``1`` and ``1.0`` are the same number, but ``True`` is not ``1`` and
    ``"1"`` is not ``1`` (a spec means them differently)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (type(value).__name__, repr(value))
    return ("number", float(value))


def within_budget(differences: Iterable[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int]:
    """``(kept, left out)``: the differences in order, each kept while its JSON (as the answer
    writes it) fits in the bytes ``budget`` has left; one that does not fit is left out and
    counted, and a smaller one after it may still fit (a huge prompt list does not hide a
    changed learning rate further on)."""
    kept: list[dict[str, Any]] = []
    left_out, room = 0, budget
    for row in differences:
        size = len(json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str).encode())
        if size > room:
            left_out += 1
            continue
        kept.append(row)
        room -= size + 1  # the comma between rows
    return kept, left_out
