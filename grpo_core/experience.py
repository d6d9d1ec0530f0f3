"""One generation batch: sample, decode, score, select groups, compute advantages and the
log-probs that stay fixed during the update (reference, and old policy when mu > 1)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from grpo_core.advantages import combine_rewards, compute_advantages, group_std
from grpo_core.config import GRPOConfig
from grpo_core.data import PromptSampler, PromptSet
from grpo_core.decoding import DecodedCompletion, decode_and_strip_padding
from grpo_core.distributed import Ranks
from grpo_core.logprobs import completion_logprobs
from grpo_core.models import PolicyAndReference
from grpo_core.placement import Placement
from grpo_core.randomness import row_keys
from grpo_core.rewards import BoundReward, score_completions
from grpo_core.rollout import (
    Rollout,
    SamplingOptions,
    concat_rollouts,
    micro_batches,
    sample_completions,
    tokenize_prompts,
)
from grpo_core.spec import ReasoningSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class Experience:
    """A scored generation batch of N = B·G rows, grouped by prompt.

    ``loss_mask`` is the rollout's ``completion_mask`` less the rows the loss ignores
    (truncated ones with ``mask_truncated_completions``); the rollout's own mask stays the
    completions as sampled, which lengths and token counts are measured on.
    """

    rollout: Rollout
    prompts: list[str]  # (N,) rendered prompt of each row
    decoded: list[DecodedCompletion]  # (N,)
    rewards_per_func: torch.Tensor  # (N, F), NaN = not applicable
    rewards: torch.Tensor  # (N,), NaN = unscorable
    advantages: torch.Tensor  # (N,)
    is_std_zero: torch.Tensor  # (N,)
    loss_mask: torch.Tensor  # (N, T)
    ref_logprobs: torch.Tensor | None = None  # (N, T)
    old_logprobs: torch.Tensor | None = None  # (N, T)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Groups:
    """Candidate groups from one or more sampling rounds, before selection."""

    rollouts: list[Rollout] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    decoded: list[DecodedCompletion] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)
    truncated_prompts: int = 0
    prompt_count: int = 0
    generation_seconds: float = 0.0
    reward_seconds: float = 0.0


@dataclass(frozen=True)
class _Generation:
    """What one sampling round uses, fixed for the whole batch."""

    policy: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    prompts: PromptSet
    sampler: PromptSampler
    rewards: list[BoundReward]
    eos_ids: torch.Tensor
    config: GRPOConfig
    reasoning: ReasoningSpec
    placement: Placement


def _sample_round(gen: _Generation, groups: _Groups) -> None:
    cfg, g = gen.config, gen.config.num_generations
    first_draw = gen.sampler.draws_taken
    # Every rank draws the whole batch (so samplers stay in step) and keeps its whole groups,
    # keyed by their global serials: they sample exactly what the 1-process run samples.
    drawn = gen.sampler.next_indices()
    share = gen.placement.ranks.share(len(drawn))
    indices = drawn[share]
    draws = torch.arange(first_draw + share.start, first_draw + share.stop, device=gen.placement.device)
    texts = [gen.prompts.texts[i] for i in indices]
    started = time.perf_counter()
    prompt_batch = tokenize_prompts(gen.tokenizer, texts, cfg.max_prompt_length, gen.placement.device)
    options = SamplingOptions(cfg.max_completion_length, cfg.temperature, cfg.top_k, cfg.top_p)
    with gen.placement.autocast():
        rollout = sample_completions(
            gen.policy, prompt_batch, g, gen.eos_ids, gen.tokenizer.pad_token_id, options,
            row_keys(cfg.seed, draws, g),
        )
    scoring = time.perf_counter()
    groups.generation_seconds += scoring - started
    decoded = decode_and_strip_padding(
        rollout.completion_ids, rollout.completion_mask, gen.tokenizer, gen.reasoning
    )
    row_prompts = [t for t in texts for _ in range(g)]
    matrix = score_completions(
        gen.rewards,
        [d.answer for d in decoded],
        row_prompts,
        gen.prompts.reward_columns(indices, g),
        raw_completions=[d.text for d in decoded],
    )
    groups.reward_seconds += time.perf_counter() - scoring
    groups.rollouts.append(rollout)
    groups.prompts += row_prompts
    groups.decoded += decoded
    groups.scores.append(torch.tensor(matrix, dtype=torch.float32).reshape(len(decoded), len(gen.rewards)))
    groups.truncated_prompts += prompt_batch.num_truncated
    groups.prompt_count += len(indices)


def _select_groups(groups: _Groups, weights: torch.Tensor, g: int, b: int) -> tuple[torch.Tensor, int]:
    """Indices of the B groups to train on: groups with reward variance first, in sampling order,
    then zero-variance groups to fill the batch if the resampling cap was reached."""
    rewards = combine_rewards(torch.cat(groups.scores), weights)
    informative = ~torch.isclose(torch.nan_to_num(group_std(rewards, g), nan=0.0), torch.tensor(0.0))
    order = torch.cat([informative.nonzero().flatten(), (~informative).nonzero().flatten()])
    return order[:b].sort().values, int(informative.sum())


def make_experience(
    *,
    models: PolicyAndReference,
    tokenizer: PreTrainedTokenizerBase,
    prompts: PromptSet,
    sampler: PromptSampler,
    rewards: list[BoundReward],
    eos_ids: torch.Tensor,
    config: GRPOConfig,
    reasoning: ReasoningSpec,
    placement: Placement,
) -> Experience:
    """Draw ``config.prompts_per_step`` prompts from ``sampler``, sample, score and prepare them
    for ``config.num_iterations`` optimizer steps."""
    gen = _Generation(
        models.policy, tokenizer, prompts, sampler, rewards, eos_ids, config, reasoning, placement
    )
    ranks = placement.ranks
    g, b = config.num_generations, config.prompts_per_step // ranks.world_size
    weights = torch.tensor([r.weight for r in rewards], dtype=torch.float32)
    groups = _Groups()
    _sample_round(gen, groups)
    extra_rounds = 0
    if config.drop_zero_std_groups:
        while _select_groups(groups, weights, g, b)[1] < b and extra_rounds < config.max_resample_batches:
            _sample_round(gen, groups)
            extra_rounds += 1
    chosen, informative = _select_groups(groups, weights, g, b)
    rows = (chosen.unsqueeze(1) * g + torch.arange(g)).flatten()
    rollout = concat_rollouts(groups.rollouts, tokenizer.pad_token_id).select(rows.to(placement.device))
    scores = torch.cat(groups.scores)[rows]
    combined = combine_rewards(scores, weights)
    step_rewards = ranks.gather_rows(combined) if config.scale_rewards == "batch" else None
    adv = compute_advantages(combined, g, config.scale_rewards, step_rewards)
    loss_mask = rollout.completion_mask
    if config.mask_truncated_completions:
        loss_mask = loss_mask * (~rollout.is_truncated).unsqueeze(1).long()
    exp = Experience(
        rollout=rollout,
        prompts=[groups.prompts[i] for i in rows.tolist()],
        decoded=[groups.decoded[i] for i in rows.tolist()],
        rewards_per_func=scores,
        rewards=combined,
        advantages=adv.advantages.to(placement.device),
        is_std_zero=adv.is_std_zero,
        loss_mask=loss_mask,
    )
    exp.metrics["timing/generation"] = groups.generation_seconds
    exp.metrics["timing/reward"] = groups.reward_seconds
    dynamic = config.drop_zero_std_groups
    exp.metrics.update(_sampling_metrics(groups, informative, extra_rounds, dynamic, ranks))
    started = time.perf_counter()
    exp.ref_logprobs, exp.old_logprobs = fixed_logprobs(models, rollout, config, placement)
    exp.metrics["timing/ref"] = time.perf_counter() - started
    return exp


def _sampling_metrics(
    groups: _Groups, informative: int, extra_rounds: int, dynamic: bool, ranks: Ranks
) -> dict[str, Any]:
    truncated, count = ranks.sum([groups.truncated_prompts, groups.prompt_count])
    metrics: dict[str, Any] = {"prompts/truncated_ratio": truncated / max(1.0, count)}
    if dynamic:
        metrics["dynamic_sampling/informative_groups"] = informative
        metrics["dynamic_sampling/extra_batches"] = extra_rounds
    return metrics


@torch.no_grad()
def fixed_logprobs(
    models: PolicyAndReference, rollout: Rollout, config: GRPOConfig, placement: Placement
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(ref_logprobs, old_logprobs)``, each ``(N, T)``: the reference's when ``beta != 0`` and
    the policy's before the update when ``num_iterations > 1``; None where not needed."""
    ref = old = None
    if config.beta != 0.0:
        with models.reference_model() as reference:
            ref = _logprobs_in_chunks(reference, rollout, config, placement)
    if config.num_iterations > 1:
        old = _logprobs_in_chunks(models.policy, rollout, config, placement)
    return ref, old


def _logprobs_in_chunks(
    model: torch.nn.Module, rollout: Rollout, config: GRPOConfig, placement: Placement
) -> torch.Tensor:
    """Micro-batch by micro-batch, as the update runs, so it never needs more memory than that."""
    was_training = model.training
    model.eval()
    parts = []
    try:
        for rows in micro_batches(rollout.completion_ids.size(0), config.gradient_accumulation_steps):
            part = rollout.select(rows)
            width = part.completion_ids.size(1)
            with placement.autocast():
                logp, _ = completion_logprobs(
                    model, part.input_ids, part.attention_mask, width, config.temperature
                )
            parts.append(logp)
    finally:
        model.train(was_training)
    return torch.cat(parts)
