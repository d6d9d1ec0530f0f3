"""Where job specs differ: each spec flattened to dotted paths (``grpo.learning_rate``; a list's
items by index, ``rewards.0.name``), then the paths whose values are not all the same. A path
one spec lacks counts as ``None`` there. Pure: the compare route and its tests feed it stored
specs."""

from __future__ import annotations

from collections.abc import Mapping
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
