"""Evaluation during training (issue 25): the policy answers every eval prompt
``eval_num_generations`` times, without gradients, and the run's rewards score the answers.

Rank r of k takes the r-th contiguous share of the eval prompts and the results are gathered, so
every rank ends with the same rows in prompt order. A completion's randomness is keyed by
``(seed, "eval", step, prompt index, generation index)`` (:func:`eval_row_keys`) and greedy
decoding (``eval_temperature`` 0) has none, so the rows do not depend on the rank count, the
batch split or a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from grpo_core.algorithm.advantages import combine_rewards
from grpo_core.algorithm.episodes import AgentSetup, episode_metrics, sample_rows
from grpo_core.algorithm.eval_metrics import EvalRow, eval_metrics, eval_sample_rows
from grpo_core.algorithm.randomness import eval_row_keys
from grpo_core.algorithm.rollout import SamplingOptions, tokenize_prompts
from grpo_core.io.prompt_data import PromptSet
from grpo_core.parallel.placement import Placement
from grpo_core.rewards import BoundReward, score_completions
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.run_spec import ReasoningSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class EvalInputs:
    """What an evaluation uses, fixed for the run."""

    policy: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    prompts: PromptSet
    rewards: list[BoundReward]
    eos_ids: torch.Tensor
    config: GRPOConfig
    reasoning: ReasoningSpec
    placement: Placement
    agent: AgentSetup | None = None  # the spec's tools: eval episodes are multi-turn, as training's


@dataclass
class EvalResult:
    """The same on every rank: the step's eval metrics and its eval samples."""

    metrics: dict[str, Any]
    samples: list[dict[str, Any]]


def eval_sampling_options(config: GRPOConfig) -> SamplingOptions:
    """Greedy at ``eval_temperature`` 0; otherwise training's filters at the eval temperature."""
    if config.eval_temperature == 0:
        return SamplingOptions(config.max_completion_length, repetition_penalty=config.repetition_penalty,
                               greedy=True)
    return SamplingOptions(config.max_completion_length, config.eval_temperature, config.top_k, config.top_p,
                           config.min_p, config.repetition_penalty)


def prompts_per_batch(config: GRPOConfig, world_size: int) -> int:
    """Eval prompts one generation call takes on a rank: as many completions as a training step
    samples there, so evaluation needs no more memory than training's generation."""
    rows = max(1, config.prompts_per_step * config.num_generations // world_size)
    return max(1, rows // config.eval_num_generations)


def rank_batches(num_prompts: int, rank: int, world_size: int, batch: int) -> list[list[int]]:
    """Rank ``rank``'s eval prompt indices in batches. Every rank gets the same number of batches
    (a rank short of prompts gets empty ones): a sharded model's generation is a collective."""
    per_rank = math.ceil(num_prompts / world_size)
    mine = list(range(rank * per_rank, min(num_prompts, (rank + 1) * per_rank)))
    return [mine[start : start + batch] for start in range(0, max(1, per_rank), batch)]


@torch.no_grad()
def evaluate(inputs: EvalInputs, step: int) -> EvalResult:
    """Generate for every eval prompt, score, gather over the ranks and compute the metrics."""
    ranks, cfg = inputs.placement.ranks, inputs.config
    batch = prompts_per_batch(cfg, ranks.world_size)
    rows: list[EvalRow] = []
    for indices in rank_batches(len(inputs.prompts.texts), ranks.rank, ranks.world_size, batch):
        # An empty batch still generates (for prompt 0, then dropped) to keep a sharded model's
        # collectives in step with the other ranks.
        generated = _generate_and_score(inputs, indices or [0], step)
        rows += generated if indices else []
    every = [row for part in ranks.gather_objects(rows) for row in part]
    names = [reward.name for reward in inputs.rewards]
    metrics = eval_metrics(every, names, cfg.eval_pass_threshold)
    if inputs.agent is not None:  # every rank holds every row here: no collective
        episodes = episode_metrics([row.episode for row in every])
        metrics.update({f"eval_{name}": value for name, value in episodes.items()})
    return EvalResult(metrics, eval_sample_rows(every, names, step))


def _generate_and_score(inputs: EvalInputs, indices: list[int], step: int) -> list[EvalRow]:
    cfg, k, device = inputs.config, inputs.config.eval_num_generations, inputs.placement.device
    texts = [inputs.prompts.texts[i] for i in indices]
    prompt_batch = tokenize_prompts(inputs.tokenizer, texts, cfg.max_prompt_length, device)
    options = eval_sampling_options(cfg)
    keys = None if options.greedy else eval_row_keys(
        cfg.seed, step, torch.tensor(indices, dtype=torch.long, device=device), k)
    with inputs.placement.autocast():
        sampled = sample_rows(inputs.policy, prompt_batch, [inputs.prompts.rows[i] for i in indices], k,
                              inputs.eos_ids, inputs.tokenizer, options, keys, inputs.agent, inputs.reasoning)
    rollout, decoded, episodes = sampled.rollout, sampled.decoded, sampled.episodes
    row_prompts = [t for t in texts for _ in range(k)]
    scored = score_completions(
        inputs.rewards, [d.answer for d in decoded], row_prompts, inputs.prompts.reward_columns(indices, k),
        raw_completions=[d.text for d in decoded], prompt_messages=inputs.prompts.prompt_messages(indices, k),
        **sampled.scoring_inputs(),
    )
    scores = torch.tensor(scored.matrix, dtype=torch.float32).reshape(len(decoded), len(inputs.rewards))
    weights = torch.tensor([r.weight for r in inputs.rewards], dtype=torch.float32)
    combined = combine_rewards(scores, weights)
    lengths = rollout.sampled_mask.sum(dim=1).tolist()  # the model's tokens
    truncated = rollout.is_truncated.tolist()
    columns = inputs.prompts.sample_columns(indices, k)
    return [
        EvalRow(prompt_index=indices[i // k], generation=i % k, prompt=row_prompts[i], text=d.text,
                answer=d.answer, scores=scores[i].tolist(), reward=float(combined[i]), length=int(lengths[i]),
                truncated=bool(truncated[i]), columns=columns[i], episode=episodes[i])
        for i, d in enumerate(decoded)
    ]
