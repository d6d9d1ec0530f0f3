"""Per-reward clipping and gating, applied to the scores before they are weighted and summed.

For each reward, in this order:

1. clip: a score outside ``[clip_min, clip_max]`` counts as the nearer bound;
2. gate (``gate_by: OTHER``): where OTHER's *raw* score (as it returned it, before OTHER's own
   clipping or gate) is above ``gate_threshold`` (default 0) the score is kept; where it is not,
   the score is 0, even where this reward could not score the row (the completion failed the
   gate, which is known); where OTHER could not score the row (NaN), neither can this reward
   (NaN: left out of the group statistics, advantage 0 when the whole row is unscorable).

Judging the gate on raw scores keeps the order of the rewards and chains of gates meaningless.
The shaped scores are what the weighted sum and the ``rewards/{name}/mean|std`` metrics see, so
the logged components add up to the logged ``reward``.
"""

from __future__ import annotations

import math

from grpo_core.rewards.reward_types import BoundReward

__all__ = ["shape_scores"]


def _clip(score: float, low: float | None, high: float | None) -> float:
    if math.isnan(score):
        return score
    if low is not None and score < low:
        return low
    if high is not None and score > high:
        return high
    return score


def shape_scores(matrix: list[list[float]], rewards: list[BoundReward]) -> list[list[float]]:
    """``matrix`` (N x F raw scores, NaN = unscorable, a column per reward of ``rewards``) clipped
    and gated as the module says; a new matrix, ``matrix`` is left as it was."""
    column = {reward.name: j for j, reward in enumerate(rewards)}
    unknown = [r.gate_by for r in rewards if r.gate_by is not None and r.gate_by not in column]
    if unknown:
        raise ValueError(f"gate_by '{unknown[0]}' names no reward here; rewards: {', '.join(column)}")
    shaped = []
    for raw in matrix:
        row = [_clip(score, r.clip_min, r.clip_max) for score, r in zip(raw, rewards, strict=True)]
        for j, reward in enumerate(rewards):
            if reward.gate_by is None:
                continue
            gate = raw[column[reward.gate_by]]
            if math.isnan(gate):
                row[j] = math.nan
            elif not gate > reward.gate_threshold:
                row[j] = 0.0
        shaped.append(row)
    return shaped
