"""Clipped surrogate, k3 KL and loss aggregation (docs/grpo_reference.md, steps 8–10). Pure functions.

Shapes: ``(N, T)`` per-token tensors for a micro-batch of N rows, ``advantages (N,)``.
Every aggregator has the same signature and divides by *step-level* totals (rows, tokens),
so summing the micro-batch losses of one optimizer step gives the full-batch loss whatever the
split: gradient accumulation never changes the gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepTotals:
    """Normalisers fixed for a whole optimizer step, before it is split into micro-batches."""

    rows: int  # N of the step
    tokens: float  # Σ completion_mask over the step
    max_completion_length: int
    # dapo's normaliser: the generation round's tokens per optimizer step it feeds (TRL divides by
    # the generation batch's tokens, rescaled to one step); None: ``tokens``, a one-step round.
    round_tokens_per_step: float | None = None


@dataclass(frozen=True)
class PolicyLossTerms:
    per_token_loss: torch.Tensor  # (N, T) before masking
    # Importance ratio ρ after the dual-clip cap (what clip metrics count): (N, T) per token, or
    # (N, 1) at sequence level, one weight per completion.
    ratio: torch.Tensor
    kl: torch.Tensor | None  # (N, T) k3 KL, None when beta == 0


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π‖π_ref), ≥ 0 per token: ``exp(d) − d − 1``, ``d = ref − logp``."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def _token_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``(N, T)`` → ``(N, T)``: each token its own ratio (PPO/GRPO)."""
    return log_ratio


def _sequence_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``(N, T)`` → ``(N, 1)``: the mean log-ratio over the completion's tokens (GSPO), so the weight
    is the geometric mean of its token ratios; a row with no tokens gets weight 1."""
    if mask is None:
        raise ValueError("importance_sampling_level 'sequence' needs the completion mask")
    m = mask.to(log_ratio.dtype)
    return ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)


IMPORTANCE_SAMPLING_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
    "token": _token_log_weights,
    "sequence": _sequence_log_weights,
}


def policy_loss_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    *,
    importance_sampling_level: str = "token",
    mask: torch.Tensor | None = None,
) -> PolicyLossTerms:
    """Per-token ``ℓ = −min(ρ·A, clip(ρ)·A) + β·ρ·kl``.

    ``importance_sampling_level`` (a key of :data:`IMPORTANCE_SAMPLING_LEVELS`) says whether ρ is
    per token or per completion (GSPO, which needs ``mask (N, T)``); a completion's ρ is broadcast
    to its tokens. With ``delta`` set the unclipped ratio is capped at ``delta`` (dual clip) so a
    very negative advantage cannot pull an already-unlikely token without bound. The KL term is
    multiplied by ρ (TRL's default bias correction; ρ = 1 on-policy but it still carries gradient).
    """
    try:
        log_weights = IMPORTANCE_SAMPLING_LEVELS[importance_sampling_level]
    except KeyError:
        valid = ", ".join(IMPORTANCE_SAMPLING_LEVELS)
        level = importance_sampling_level
        raise ValueError(f"unknown importance_sampling_level '{level}'; valid: {valid}") from None
    adv = advantages.unsqueeze(1)
    ratio = torch.exp(log_weights(logprobs - old_logprobs, mask))
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    capped = torch.clamp(ratio, max=delta) if delta is not None else ratio
    per_token_loss = (-torch.min(capped * adv, clipped * adv)).expand_as(logprobs)
    kl = None
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta != 0 needs ref_logprobs")
        kl = k3_kl(logprobs, ref_logprobs) * ratio
        per_token_loss = per_token_loss + beta * kl
    return PolicyLossTerms(per_token_loss, capped, kl)


def _grpo(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """Sequence mean, then mean over the step's rows."""
    per_row = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_row.sum() / totals.rows


def _token_mean(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """Token mean over the step (bnpo)."""
    return (loss * mask).sum() / max(totals.tokens, 1.0)


def _dapo(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """Token sum over the generation round's tokens per step: the step's token mean when a round
    is one step; with a round of k steps every step shares one normaliser, as in TRL."""
    tokens = totals.tokens if totals.round_tokens_per_step is None else totals.round_tokens_per_step
    return (loss * mask).sum() / max(tokens, 1.0)


def _dr_grpo(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """Constant normaliser N·L_max: no length bias."""
    return (loss * mask).sum() / (totals.rows * totals.max_completion_length)


Aggregator = Callable[[torch.Tensor, torch.Tensor, StepTotals], torch.Tensor]

AGGREGATORS: dict[str, Aggregator] = {
    "grpo": _grpo,
    "bnpo": _token_mean,
    "dr_grpo": _dr_grpo,
    "dapo": _dapo,
}


def aggregate_loss(loss_type: str, per_token_loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals):
    """This micro-batch's share of the step loss, for ``loss_type`` in :data:`AGGREGATORS`."""
    try:
        aggregator = AGGREGATORS[loss_type]
    except KeyError:
        raise ValueError(f"unknown loss_type '{loss_type}'; valid: {', '.join(AGGREGATORS)}") from None
    return aggregator(per_token_loss, mask.to(per_token_loss.dtype), totals)


@dataclass(frozen=True)
class ClipCounts:
    """Counts of clipped ratios out of ``units`` counted (masked tokens, or rows at sequence
    level); summed over micro-batches, divided at the end."""

    low: float
    high: float
    region: float
    units: float


def clip_counts(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> ClipCounts:
    """Ratios that left the trust region in the direction the advantage pushes them. A ``(N, T)``
    ratio counts masked tokens; a ``(N, 1)`` sequence-level ratio counts completions, as TRL does,
    so a long completion does not weigh more than a short one in the fraction."""
    adv = advantages.unsqueeze(1)
    counted = mask.bool() if ratio.size(-1) == mask.size(-1) else torch.ones_like(ratio, dtype=torch.bool)
    low = (ratio < 1.0 - epsilon_low) & (adv < 0) & counted
    high = (ratio > 1.0 + epsilon_high) & (adv > 0) & counted
    return ClipCounts(float(low.sum()), float(high.sum()), float((low | high).sum()), float(counted.sum()))


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values.detach() * mask).sum())
