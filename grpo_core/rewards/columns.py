"""A dataset column as a reward reads it: present and one value per completion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["aligned_column"]


def aligned_column(columns: dict[str, Any], name: str, n: int) -> Sequence[Any]:
    """The column aligned with the completions; bind_rewards checked it exists, this guards the call."""
    if name not in columns:
        raise ValueError(f"dataset column '{name}' was not passed to the reward")
    if len(columns[name]) != n:
        raise ValueError(f"column '{name}' has {len(columns[name])} values for {n} completions")
    return columns[name]
