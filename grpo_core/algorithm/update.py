"""One optimizer step over an :class:`Experience` (docs/grpo_reference.md, steps 6–11).

The step is split into ``gradient_accumulation_steps`` equal micro-batches of rows. Loss
normalisers are fixed for the whole step (:class:`StepTotals`), so the accumulated gradient is
the full-batch gradient whatever the split.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields

import torch

from grpo_core.algorithm.experience import Experience
from grpo_core.algorithm.losses import StepTotals, aggregate_loss, clip_counts, masked_sum, policy_loss_terms
from grpo_core.algorithm.rollout import micro_batches
from grpo_core.algorithm.shared_prompts import rollout_logprobs
from grpo_core.errors import NonFiniteLossError
from grpo_core.parallel.distributed import Ranks
from grpo_core.parallel.placement import Placement
from grpo_core.parallel.sharding import clip_gradients, reduce_gradients
from grpo_core.spec.grpo_config import GRPOConfig


@dataclass
class StepSums:
    """Token-weighted sums over a step's micro-batches; divided once, by :meth:`metrics`."""

    loss: float = 0.0
    policy_loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    clip_region: float = 0.0
    clip_units: float = 0.0  # what the clip counts are out of: masked tokens, or rows (sequence level)

    def across(self, ranks: Ranks) -> StepSums:
        """The whole step's sums: each rank's sums added up (its loss is already its share)."""
        names = [f.name for f in fields(self)]
        return StepSums(**dict(zip(names, ranks.sum([getattr(self, n) for n in names]), strict=True)))

    def metrics(self, tokens: float, with_kl: bool) -> dict[str, float]:
        """The step's metrics (TRL's names) over its ``tokens`` loss tokens."""
        tokens, units = max(tokens, 1.0), max(self.clip_units, 1.0)
        metrics = {
            "loss": self.loss,
            "policy_loss": self.policy_loss,
            "entropy": self.entropy / tokens,
            "clip_ratio/low_mean": self.clip_low / units,
            "clip_ratio/high_mean": self.clip_high / units,
            "clip_ratio/region_mean": self.clip_region / units,
        }
        if with_kl:
            metrics["kl"] = self.kl / tokens
        return metrics


def micro_batch_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    totals: StepTotals,
    config: GRPOConfig,
    sums: StepSums,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """This micro-batch's share of the step loss (to call ``backward`` on); adds its metric sums
    to ``sums``. Per-token tensors are ``(n, T)`` for the micro-batch's n rows, ``advantages (n,)``.
    """
    m = mask.float()
    terms = policy_loss_terms(
        logprobs, old_logprobs, advantages, config.epsilon_low, config.clip_high, config.delta, config.beta,
        ref_logprobs, importance_sampling_level=config.importance_sampling_level, mask=m,
    )
    loss = aggregate_loss(config.loss_type, terms.per_token_loss, m, totals)
    sums.loss += loss.item()
    kl = terms.kl.detach() if terms.kl is not None else None
    surrogate = terms.per_token_loss.detach() - (config.beta * kl if kl is not None else 0.0)
    sums.policy_loss += aggregate_loss(config.loss_type, surrogate, m, totals).item()
    if entropy is not None:
        sums.entropy += masked_sum(entropy, m)
    if kl is not None:
        sums.kl += masked_sum(kl, m)
    clipped = clip_counts(terms.ratio.detach(), advantages, m, config.epsilon_low, config.clip_high)
    sums.clip_low += clipped.low
    sums.clip_high += clipped.high
    sums.clip_region += clipped.region
    sums.clip_units += clipped.units
    return loss


def accumulate_gradients(
    *, policy: torch.nn.Module, experience: Experience, config: GRPOConfig, placement: Placement
) -> dict[str, float]:
    """Forward + backward over every micro-batch; returns the step's loss and token metrics.

    Raises :class:`NonFiniteLossError` (gradients cleared) when a micro-batch loss is NaN/inf.
    """
    exp, mask = experience, experience.loss_mask
    # Normalisers over the whole step on every rank, so each rank's loss is its share of the
    # 1-process loss and summing the ranks' gradients gives the 1-process gradient.
    rows, tokens = placement.ranks.sum([mask.size(0), float(mask.sum())])
    totals = StepTotals(
        rows=int(rows), tokens=tokens, max_completion_length=config.max_completion_length,
        round_tokens_per_step=exp.round_tokens_per_step,
    )
    sums = StepSums()
    for rows in micro_batches(mask.size(0), config.gradient_accumulation_steps):
        part = exp.rollout.select(rows)
        with placement.autocast():
            logprobs, entropy = rollout_logprobs(policy, part, config.temperature, with_entropy=True)
        old = exp.old_logprobs[rows] if exp.old_logprobs is not None else logprobs.detach()
        ref = exp.ref_logprobs[rows] if exp.ref_logprobs is not None else None
        adv = exp.advantages[rows]
        loss = micro_batch_loss(logprobs, old, adv, mask[rows], totals, config, sums, ref, entropy)
        if not torch.isfinite(loss):
            policy.zero_grad(set_to_none=True)
            where = f"a micro-batch of rows {rows.start}..{rows.stop - 1}"
            raise NonFiniteLossError(f"loss is {loss.item()} at {where}")
        loss.backward()
    return sums.across(placement.ranks).metrics(totals.tokens, config.beta != 0.0)


def optimizer_step(
    *,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    experience: Experience,
    config: GRPOConfig,
    placement: Placement,
) -> dict[str, float]:
    """Accumulate, clip, step. ``grad_norm`` is the norm before clipping."""
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(policy=policy, experience=experience, config=config, placement=placement)
    params = [p for p in policy.parameters() if p.requires_grad]
    reduce_gradients(policy, params, placement.ranks)  # before clipping: the norm is the whole step's
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = clip_gradients(params, max_norm)
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLossError(f"gradient norm is {grad_norm}; the step was not applied")
    metrics["learning_rate"] = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    metrics["grad_norm"] = grad_norm
    metrics["timing/update"] = time.perf_counter() - started
    return metrics
