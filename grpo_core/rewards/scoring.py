"""Run bound rewards over a batch and check what they return.

Reward functions may come from plugins, so their output is not trusted: a wrong length, a string or
a bool is an error naming the reward (a bool usually means a forgotten ``float()`` and a silently
coerced 0/1 would hide it); inf and NaN become "not applicable" rather than poisoning the group
statistics. Each function gets its own copies of the inputs so one cannot alter what the next sees.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from grpo_core.errors import GRPOError
from grpo_core.oom import out_of_memory_error
from grpo_core.rewards.registry import BoundReward

__all__ = ["RESERVED_COLUMNS", "score_completions"]

# The inputs :func:`score_completions` passes every reward besides the dataset's columns; a column
# of the same name would shadow one of them.
RESERVED_COLUMNS = frozenset({"completions", "prompts", "raw_completions"})


def _check_inputs(n: int, prompts: list[str], columns: dict[str, list[Any]]) -> None:
    """Caller mistakes (misaligned batches) are ValueErrors: no reward is at fault."""
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions; repeat each prompt per completion")
    for name, values in columns.items():
        if name in RESERVED_COLUMNS:
            raise ValueError(f"column '{name}' clashes with the reward function argument of that name")
        if len(values) != n:
            raise ValueError(f"column '{name}' has {len(values)} values for {n} completions")


def _to_score(name: str, index: int, value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GRPOError(
            f"reward '{name}' returned {type(value).__name__} {value!r:.40} at index {index}; "
            "expected a number or None",
            code="reward_error",
        )
    try:
        score = float(value)
    except OverflowError:  # an int too large for a float is as unusable as inf
        return math.nan
    return score if math.isfinite(score) else math.nan


def _checked(name: str, values: Any, n: int) -> list[float]:
    if not isinstance(values, Sequence) and callable(getattr(values, "tolist", None)):
        values = values.tolist()  # numpy arrays and tensors from plugins; no import needed
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise GRPOError(
            f"reward '{name}' returned {type(values).__name__}, not a list of {n} values", code="reward_error"
        )
    if len(values) != n:
        message = f"reward '{name}' returned {len(values)} values for {n} completions"
        raise GRPOError(message, code="reward_error")
    return [_to_score(name, index, value) for index, value in enumerate(values)]


def score_completions(
    rewards: list[BoundReward],
    completions: list[str],
    prompts: list[str],
    columns: dict[str, list[Any]],
    raw_completions: list[str] | None = None,
) -> list[list[float]]:
    """An N x F matrix (row per completion, column per reward); NaN where a reward returned None.

    ``completions`` are the answers rewards score, ``raw_completions`` the whole texts (reasoning
    included; the answers when not given) for format rewards, ``columns`` every dataset column
    aligned with the completions. All of them are passed to every reward as keywords.
    """
    n = len(completions)
    _check_inputs(n, prompts, columns)
    raw = list(completions) if raw_completions is None else list(raw_completions)
    if len(raw) != n:
        raise ValueError(f"{len(raw)} raw completions for {n} completions")
    columns = {**columns, "raw_completions": raw}
    matrix = [[math.nan] * len(rewards) for _ in range(n)]
    for j, reward in enumerate(rewards):
        try:
            values = reward.fn(list(completions), list(prompts), **{k: list(v) for k, v in columns.items()})
        except Exception as exc:
            # A reward that runs a model may run out of memory: the job's size, not the reward's bug.
            raise out_of_memory_error(exc) or GRPOError(
                f"reward '{reward.name}' raised {type(exc).__name__}: {exc}", code="reward_error"
            ) from exc
        for row, score in enumerate(_checked(reward.name, values, n)):
            matrix[row][j] = score
    return matrix
