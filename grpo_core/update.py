"""One optimizer step over an :class:`Experience` (GRPO_REFERENCE steps 6–11).

The step is split into ``gradient_accumulation_steps`` equal micro-batches of rows. Loss
normalisers are fixed for the whole step (:class:`StepTotals`), so the accumulated gradient is
the full-batch gradient whatever the split.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from grpo_core.components import RunComponents
from grpo_core.errors import NonFiniteLossError
from grpo_core.experience import Experience
from grpo_core.logprobs import completion_logprobs
from grpo_core.losses import StepTotals, aggregate_loss, clip_counts, masked_sum, policy_loss_terms


@dataclass
class _Sums:
    """Token-weighted sums over micro-batches; divided once at the end of the step."""

    loss: float = 0.0
    policy_loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    clip_region: float = 0.0


def micro_batches(num_rows: int, accumulation_steps: int) -> list[slice]:
    size = num_rows // accumulation_steps
    return [slice(start, start + size) for start in range(0, num_rows, size)]


def accumulate_gradients(c: RunComponents, exp: Experience) -> dict[str, float]:
    """Forward + backward over every micro-batch; returns the step's loss and token metrics.

    Raises :class:`NonFiniteLossError` (gradients cleared) when a micro-batch loss is NaN/inf.
    """
    cfg = c.spec.grpo
    mask = exp.loss_mask
    totals = StepTotals(
        rows=mask.size(0), tokens=float(mask.sum()), max_completion_length=cfg.max_completion_length
    )
    sums = _Sums()
    width = exp.rollout.completion_ids.size(1)
    for rows in micro_batches(mask.size(0), cfg.gradient_accumulation_steps):
        part = exp.rollout.select(rows)
        with c.autocast():
            logprobs, entropy = completion_logprobs(
                c.models.policy,
                part.input_ids,
                part.attention_mask,
                width,
                cfg.temperature,
                with_entropy=True,
            )
        old = exp.old_logprobs[rows] if exp.old_logprobs is not None else logprobs.detach()
        ref = exp.ref_logprobs[rows] if exp.ref_logprobs is not None else None
        adv, m = exp.advantages[rows], mask[rows].float()
        terms = policy_loss_terms(
            logprobs, old, adv, cfg.epsilon_low, cfg.clip_high, cfg.delta, cfg.beta, ref
        )
        loss = aggregate_loss(cfg.loss_type, terms.per_token_loss, m, totals)
        if not torch.isfinite(loss):
            c.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"loss is {loss.item()} at a micro-batch of rows {rows.start}..{rows.stop - 1}"
            )
        loss.backward()
        sums.loss += loss.item()
        surrogate = terms.per_token_loss.detach() - (
            cfg.beta * terms.kl.detach() if terms.kl is not None else 0.0
        )
        sums.policy_loss += aggregate_loss(cfg.loss_type, surrogate, m, totals).item()
        sums.entropy += masked_sum(entropy, m)
        if terms.kl is not None:
            sums.kl += masked_sum(terms.kl, m)
        clipped = clip_counts(terms.ratio.detach(), adv, m, cfg.epsilon_low, cfg.clip_high)
        sums.clip_low, sums.clip_high = sums.clip_low + clipped.low, sums.clip_high + clipped.high
        sums.clip_region += clipped.region
    return _step_metrics(sums, max(totals.tokens, 1.0), cfg.beta != 0.0)


def _step_metrics(sums: _Sums, tokens: float, with_kl: bool) -> dict[str, float]:
    metrics = {
        "loss": sums.loss,
        "policy_loss": sums.policy_loss,
        "entropy": sums.entropy / tokens,
        "clip_ratio/low_mean": sums.clip_low / tokens,
        "clip_ratio/high_mean": sums.clip_high / tokens,
        "clip_ratio/region_mean": sums.clip_region / tokens,
    }
    if with_kl:
        metrics["kl"] = sums.kl / tokens
    return metrics


def optimizer_step(c: RunComponents, exp: Experience) -> dict[str, float]:
    """Accumulate, clip, step. ``grad_norm`` is the norm before clipping."""
    started = time.perf_counter()
    c.optimizer.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(c, exp)
    params = [p for p in c.models.policy.parameters() if p.requires_grad]
    max_norm = c.spec.grpo.max_grad_norm if c.spec.grpo.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if not math.isfinite(grad_norm):
        c.optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLossError(f"gradient norm is {grad_norm}; the step was not applied")
    metrics["learning_rate"] = c.scheduler.get_last_lr()[0]
    c.optimizer.step()
    c.scheduler.step()
    metrics["grad_norm"] = grad_norm
    metrics["timing/update"] = time.perf_counter() - started
    return metrics
