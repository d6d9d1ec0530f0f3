"""One generation batch: sample, decode, score, select groups, compute advantages and the
log-probs that stay fixed during the update (reference, and old policy when mu > 1)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_core.advantages import combine_rewards, compute_advantages, group_std
from grpo_core.components import RunComponents
from grpo_core.decoding import DecodedCompletion, decode_and_strip_padding
from grpo_core.logprobs import completion_logprobs
from grpo_core.rewards import score_completions
from grpo_core.rollout import Rollout, concat_rollouts, sample_completions, tokenize_prompts


@dataclass
class Experience:
    """A scored generation batch of N = B·G rows, grouped by prompt."""

    rollout: Rollout
    prompts: list[str]  # (N,) rendered prompt of each row
    decoded: list[DecodedCompletion]  # (N,)
    rewards_per_func: torch.Tensor  # (N, F), NaN = not applicable
    rewards: torch.Tensor  # (N,), NaN = unscorable
    advantages: torch.Tensor  # (N,)
    is_std_zero: torch.Tensor  # (N,)
    ref_logprobs: torch.Tensor | None = None  # (N, T)
    old_logprobs: torch.Tensor | None = None  # (N, T)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.rollout.completion_mask


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


def _sample_round(c: RunComponents, groups: _Groups) -> None:
    cfg = c.spec.grpo
    indices = c.sampler.next_indices()
    texts = [c.prompt_texts[i] for i in indices]
    started = time.perf_counter()
    prompt_batch = tokenize_prompts(c.tokenizer, texts, cfg.max_prompt_length, c.device)
    with c.autocast():
        rollout = sample_completions(
            c.models.policy,
            prompt_batch,
            cfg.num_generations,
            cfg.max_completion_length,
            c.eos_ids,
            c.tokenizer.pad_token_id,
            cfg.temperature,
            cfg.top_k,
            cfg.top_p,
        )
    scoring = time.perf_counter()
    groups.generation_seconds += scoring - started
    decoded = decode_and_strip_padding(
        rollout.completion_ids, rollout.completion_mask, c.tokenizer, c.spec.reasoning
    )
    row_prompts = [t for t in texts for _ in range(cfg.num_generations)]
    columns = _reward_columns(c, indices, decoded)
    matrix = score_completions(c.rewards, [d.answer for d in decoded], row_prompts, columns)
    groups.reward_seconds += time.perf_counter() - scoring
    groups.rollouts.append(rollout)
    groups.prompts += row_prompts
    groups.decoded += decoded
    groups.scores.append(torch.tensor(matrix, dtype=torch.float32).reshape(len(decoded), len(c.rewards)))
    groups.truncated_prompts += prompt_batch.num_truncated
    groups.prompt_count += len(indices)


def _reward_columns(
    c: RunComponents, indices: list[int], decoded: list[DecodedCompletion]
) -> dict[str, list]:
    """Every dataset column, repeated per completion, plus the raw text for format rewards."""
    g = c.spec.grpo.num_generations
    names = sorted({k for i in indices for k in c.rows[i] if k != "prompt"})
    columns: dict[str, list] = {
        name: [c.rows[i].get(name) for i in indices for _ in range(g)] for name in names
    }
    columns["raw_completions"] = [d.text for d in decoded]
    return columns


def _select_groups(groups: _Groups, weights: torch.Tensor, g: int, b: int) -> tuple[torch.Tensor, int]:
    """Indices of the B groups to train on: groups with reward variance first, in sampling order,
    then zero-variance groups to fill the batch if the resampling cap was reached."""
    rewards = combine_rewards(torch.cat(groups.scores), weights)
    informative = ~torch.isclose(torch.nan_to_num(group_std(rewards, g), nan=0.0), torch.tensor(0.0))
    order = torch.cat([informative.nonzero().flatten(), (~informative).nonzero().flatten()])
    return order[:b].sort().values, int(informative.sum())


def make_experience(c: RunComponents) -> Experience:
    cfg = c.spec.grpo
    g, b = cfg.num_generations, cfg.prompts_per_step
    weights = torch.tensor([r.weight for r in c.rewards], dtype=torch.float32)
    groups = _Groups()
    _sample_round(c, groups)
    extra_rounds = 0
    if cfg.drop_zero_std_groups:
        while _select_groups(groups, weights, g, b)[1] < b and extra_rounds < cfg.max_resample_batches:
            _sample_round(c, groups)
            extra_rounds += 1
    chosen, informative = _select_groups(groups, weights, g, b)
    rows = (chosen.unsqueeze(1) * g + torch.arange(g)).flatten()
    rollout = concat_rollouts(groups.rollouts, c.tokenizer.pad_token_id).select(rows.to(c.device))
    scores = torch.cat(groups.scores)[rows]
    rewards = combine_rewards(scores, weights)
    adv = compute_advantages(rewards, g, cfg.scale_rewards)
    exp = Experience(
        rollout=rollout,
        prompts=[groups.prompts[i] for i in rows.tolist()],
        decoded=[groups.decoded[i] for i in rows.tolist()],
        rewards_per_func=scores,
        rewards=rewards,
        advantages=adv.advantages.to(c.device),
        is_std_zero=adv.is_std_zero,
    )
    if cfg.mask_truncated_completions:
        rollout.completion_mask = rollout.completion_mask * (~rollout.is_truncated).unsqueeze(1).long()
    exp.metrics["timing/generation"] = groups.generation_seconds
    exp.metrics["timing/reward"] = groups.reward_seconds
    exp.metrics.update(_sampling_metrics(groups, informative, extra_rounds, cfg.drop_zero_std_groups))
    _fixed_logprobs(c, exp)
    return exp


def _sampling_metrics(groups: _Groups, informative: int, extra_rounds: int, dynamic: bool) -> dict[str, Any]:
    metrics: dict[str, Any] = {
        "prompts/truncated_ratio": groups.truncated_prompts / max(1, groups.prompt_count)
    }
    if dynamic:
        metrics["dynamic_sampling/informative_groups"] = informative
        metrics["dynamic_sampling/extra_batches"] = extra_rounds
    return metrics


@torch.no_grad()
def _fixed_logprobs(c: RunComponents, exp: Experience) -> None:
    """Reference log-probs (beta != 0) and, for mu > 1, the old policy's, micro-batch by micro-batch."""
    cfg = c.spec.grpo
    started = time.perf_counter()
    if cfg.beta != 0.0:
        with c.models.reference_model() as reference:
            exp.ref_logprobs = _logprobs_in_chunks(c, reference, exp.rollout)
    if cfg.num_iterations > 1:
        exp.old_logprobs = _logprobs_in_chunks(c, c.models.policy, exp.rollout)
    exp.metrics["timing/ref"] = time.perf_counter() - started


def _logprobs_in_chunks(c: RunComponents, model: torch.nn.Module, rollout: Rollout) -> torch.Tensor:
    n = rollout.completion_ids.size(0)
    size = n // c.spec.grpo.gradient_accumulation_steps
    was_training = model.training
    model.eval()
    parts = []
    try:
        for start in range(0, n, size):
            part = rollout.select(slice(start, start + size))
            with c.autocast():
                logp, _ = completion_logprobs(
                    model,
                    part.input_ids,
                    part.attention_mask,
                    part.completion_ids.size(1),
                    c.spec.grpo.temperature,
                )
            parts.append(logp)
    finally:
        model.train(was_training)
    return torch.cat(parts)
