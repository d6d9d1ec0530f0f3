"""Rewards → advantages (docs/grpo_reference.md, steps 4–5). Pure tensor functions.

Shapes: N = B·G rows ordered group by group (rows ``g*G .. g*G+G-1`` share a prompt),
F reward functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Added to the std before dividing, as TRL does, so a near-constant group cannot blow up.
STD_EPSILON = 1e-4


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased standard deviation ignoring NaNs; NaN where fewer than two values remain."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    sq = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    var = torch.where(count > 1, sq * count / (count - 1).clamp(min=1), torch.full_like(sq, float("nan")))
    std = var.sqrt()
    if not keepdim:
        std = std.squeeze() if dim is None else std.squeeze(dim)
    return std


def combine_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(N, F)`` per-function scores (NaN = not applicable) → ``(N,)`` weighted sum.

    A row where every function returned NaN is unscorable: its reward stays NaN so it is
    excluded from group statistics instead of counting as a 0 reward.
    """
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    return rewards.masked_fill(unscorable, float("nan"))


@dataclass(frozen=True)
class Advantages:
    """``advantages (N,)`` with NaN replaced by 0; ``std (N,)`` the std each row was scaled by
    (group or batch), and ``is_std_zero (N,)`` the rows whose group carries no signal."""

    advantages: torch.Tensor
    std: torch.Tensor
    is_std_zero: torch.Tensor


def group_std(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``(N,)`` → ``(N//G,)`` nan-aware std of each group."""
    return nanstd(rewards.view(-1, num_generations), dim=1)


def _group_scale(
    rewards: torch.Tensor, num_generations: int, step_rewards: torch.Tensor | None = None
) -> torch.Tensor:
    return group_std(rewards, num_generations).repeat_interleave(num_generations)


def _batch_scale(rewards: torch.Tensor, num_generations: int, step_rewards: torch.Tensor) -> torch.Tensor:
    return nanstd(step_rewards).expand_as(rewards)


_SCALES: dict[str, Callable[[torch.Tensor, int, torch.Tensor], torch.Tensor]] = {
    "group": _group_scale,
    "batch": _batch_scale,
    "none": _group_scale,  # computed for the zero-std statistic only; not divided by
}


def compute_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str, step_rewards: torch.Tensor | None = None
) -> Advantages:
    """Group-relative advantages.

    ``A = (r − mean_g) / (std + 1e-4)`` with std the group's (``group``) or the batch's
    (``batch``) nan-aware std, or ``A = r − mean_g`` (``none``, Dr. GRPO). Unscorable rows
    (NaN reward) get ``A = 0``. ``step_rewards``: the whole step's rewards when ``rewards`` is
    one data-parallel rank's share of them, so the ``batch`` std is the step's (default: ``rewards``).
    """
    if scale_rewards not in _SCALES:
        raise ValueError(f"unknown scale_rewards '{scale_rewards}'; valid: {', '.join(_SCALES)}")
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(f"rewards must be (N,) with N divisible by G={num_generations}")
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
    std = _SCALES[scale_rewards](rewards, num_generations, rewards if step_rewards is None else step_rewards)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + STD_EPSILON)
    # Zero signal is a property of the group whatever the scaling: with ``batch`` a constant
    # group still has A = 0. (TRL tests the batch std here, which hides such groups.)
    own_group_std = std if scale_rewards != "batch" else _group_scale(rewards, num_generations)
    is_std_zero = torch.isclose(own_group_std, torch.zeros_like(own_group_std))
    return Advantages(torch.nan_to_num(advantages, nan=0.0), std, is_std_zero)
