"""One generation round: sample, decode, score, select groups, compute advantages and the
log-probs that stay fixed while it is trained on (reference, and the generating policy's when
the round feeds more than one optimizer step)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import torch

from grpo_core.algorithm.advantages import combine_rewards, compute_advantages, group_std
from grpo_core.algorithm.completion_text import DecodedCompletion
from grpo_core.algorithm.episodes import AgentSetup, episode_metrics, sample_rows
from grpo_core.algorithm.randomness import row_keys
from grpo_core.algorithm.rollout import (
    GenerationStopped,
    Rollout,
    SamplingOptions,
    concat_rollouts,
    micro_batches,
    tokenize_prompts,
)
from grpo_core.algorithm.shared_prompts import rollout_logprobs
from grpo_core.io.model_loading import PolicyAndReference
from grpo_core.io.prompt_data import PromptSampler, PromptSet
from grpo_core.parallel.distributed import Ranks
from grpo_core.parallel.placement import Placement
from grpo_core.rewards import BoundReward, RowFailure, score_completions
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.run_spec import ReasoningSpec

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
    # The step's trained groups (all ranks'), as indices into every group it sampled, round by
    # round in draw order: which ones drop_zero_std_groups kept.
    selected_groups: list[int] = field(default_factory=list)
    # This rank's reward calls that went over their budget (their rows are NaN), by reward name.
    reward_timeouts: list[str] = field(default_factory=list)
    # This rank's rewards whose service could not be reached (name -> why), and rows a service
    # left unscored (name -> rows).
    reward_unavailable: dict[str, str] = field(default_factory=dict)
    reward_unscored: dict[str, int] = field(default_factory=dict)
    # This rank's rows scored for the step (every round's) and, per reward that said why rows
    # failed, how many did and the first one (:mod:`grpo_core.run.reward_failures` reports them).
    reward_rows: int = 0
    reward_failures: dict[str, RowFailure] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    # dapo's normaliser: the generation round's loss tokens (all ranks) per optimizer step it
    # feeds, TRL's num_items_in_batch·gradient_accumulation_steps/steps_per_generation. None (a
    # checkpoint from before generation rounds): the step's own loss tokens, the same thing then.
    round_tokens_per_step: float | None = None
    # (N,) each row's dataset columns but the prompt, as the samples show them (PromptSet.sample_columns)
    columns: list[dict[str, Any]] = field(default_factory=list)
    # (N,) why a reward left the row unscored, where it said (Scores.row_errors); None: scored
    errors: list[str | None] = field(default_factory=list)
    # (N,) each multi-turn episode's turns, tool calls and messages (grpo_core.algorithm.episodes);
    # empty dicts for single-turn rows
    episodes: list[dict[str, Any]] = field(default_factory=list)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A pending experience a checkpoint of an earlier version holds lacks the fields added
        since: they take their defaults, so such a checkpoint still resumes."""
        for known in fields(self):
            if known.name not in state:
                if known.default_factory is not MISSING:
                    state[known.name] = known.default_factory()
                elif known.default is not MISSING:
                    state[known.name] = known.default
        self.__dict__.update(state)

    def step_part(self, index: int, steps: int) -> Experience:
        """The rows optimizer step ``index`` of the ``steps`` a generation round feeds trains on.
        A rank holds its share of every step's prompts, step by step (:func:`_round_positions`),
        so step ``index`` is its ``index``-th contiguous slice."""
        if steps == 1:
            return self
        size, groups = len(self.decoded) // steps, len(self.selected_groups) // steps
        rows = slice(index * size, (index + 1) * size)

        def part(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[rows]

        return replace(
            self,
            rollout=self.rollout.select(rows),
            prompts=self.prompts[rows],
            columns=self.columns[rows],
            errors=self.errors[rows],
            episodes=self.episodes[rows],
            decoded=self.decoded[rows],
            rewards_per_func=self.rewards_per_func[rows],
            rewards=self.rewards[rows],
            advantages=self.advantages[rows],
            is_std_zero=self.is_std_zero[rows],
            loss_mask=self.loss_mask[rows],
            ref_logprobs=part(self.ref_logprobs),
            old_logprobs=part(self.old_logprobs),
            selected_groups=self.selected_groups[index * groups : (index + 1) * groups],
            metrics=dict(self.metrics),
        )


@dataclass
class _Rows:
    """Whole groups' rows with everything a row carries: what a rank keeps, and what it sends
    to the rank that trains a group it sampled."""

    rollout: Rollout
    prompts: list[str]  # (N,)
    decoded: list[DecodedCompletion]  # (N,)
    scores: torch.Tensor  # (N, F) per reward function, on the CPU
    columns: list[dict[str, Any]]  # (N,) the dataset row's columns but the prompt
    errors: list[str | None]  # (N,) why a reward left the row unscored, where it said
    episodes: list[dict[str, Any]]  # (N,) a multi-turn episode's record; {} for a single-turn row

    def group_on_cpu(self, index: int, g: int) -> _Rows:
        """Group ``index``'s G rows, with tensors on the CPU: rows cross ranks pickled."""
        rows = slice(index * g, (index + 1) * g)
        rollout = self.rollout.select(rows).to("cpu")
        return _Rows(rollout, self.prompts[rows], self.decoded[rows], self.scores[rows], self.columns[rows],
                     self.errors[rows], self.episodes[rows])

    @staticmethod
    def concat(parts: list[_Rows], pad_id: int) -> _Rows:
        return _Rows(
            concat_rollouts([p.rollout for p in parts], pad_id),
            [prompt for p in parts for prompt in p.prompts],
            [d for p in parts for d in p.decoded],
            torch.cat([p.scores for p in parts]),
            [row for p in parts for row in p.columns],
            [error for p in parts for error in p.errors],
            [episode for p in parts for episode in p.episodes],
        )


@dataclass
class _Groups:
    """Candidate groups from one or more sampling rounds, before selection.

    ``rounds`` holds this rank's share of each round; ``informative`` has a flag for every group
    of every rank, in the 1-process order (round by round, each in draw order), so all ranks take
    the same decisions from it."""

    rounds: list[_Rows] = field(default_factory=list)
    informative: list[bool] = field(default_factory=list)
    truncated_prompts: int = 0
    prompt_count: int = 0
    generation_seconds: float = 0.0
    reward_seconds: float = 0.0
    reward_timeouts: list[str] = field(default_factory=list)
    reward_unavailable: dict[str, str] = field(default_factory=dict)
    reward_unscored: dict[str, int] = field(default_factory=dict)
    reward_rows: int = 0
    reward_failures: dict[str, RowFailure] = field(default_factory=dict)


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
    should_stop: Callable[[], bool] | None = None  # asked inside the decode loop
    agent: AgentSetup | None = None  # multi-turn episodes with tools; None: one completion per row

    @property
    def weights(self) -> torch.Tensor:
        return torch.tensor([r.weight for r in self.rewards], dtype=torch.float32)


def _round_positions(count: int, steps: int, ranks: Ranks) -> list[int]:
    """Which of a round's ``count`` draws this rank samples: its share of each of the ``steps``
    optimizer steps' prompts, step by step, so every step the round feeds is spread over all
    ranks exactly as a round of one step is."""
    per_step = count // steps
    share = ranks.share(per_step)
    return [step * per_step + i for step in range(steps) for i in range(share.start, share.stop)]


def _sample_round(gen: _Generation, groups: _Groups) -> None:
    cfg, g = gen.config, gen.config.num_generations
    first_draw = gen.sampler.draws_taken
    # Every rank draws the whole batch (so samplers stay in step) and keeps whole groups, keyed
    # by their global serials: they sample exactly what the 1-process run samples.
    drawn = gen.sampler.next_indices()
    positions = _round_positions(len(drawn), cfg.round_steps, gen.placement.ranks)
    indices = [drawn[p] for p in positions]
    draws = torch.tensor([first_draw + p for p in positions], dtype=torch.long, device=gen.placement.device)
    texts = [gen.prompts.texts[i] for i in indices]
    started = time.perf_counter()
    prompt_batch = tokenize_prompts(gen.tokenizer, texts, cfg.max_prompt_length, gen.placement.device)
    options = SamplingOptions(cfg.max_completion_length, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p,
                              cfg.repetition_penalty)
    stopped = None
    with gen.placement.autocast():
        try:
            sampled = sample_rows(
                gen.policy, prompt_batch, [gen.prompts.rows[i] for i in indices], g, gen.eos_ids,
                gen.tokenizer, options, row_keys(cfg.seed, draws, g), gen.agent, gen.reasoning,
                gen.should_stop,
            )
        except GenerationStopped as inside:
            stopped = inside
    # Ranks that can stop inside their loops agree after them: a rank whose loop ended before the
    # stop flag went up stops with the others rather than meet them in another collective.
    agree = gen.should_stop is not None and gen.placement.ranks.world_size > 1
    if (gen.placement.ranks.any(stopped is not None) if agree else stopped is not None):
        raise stopped or GenerationStopped(sampled.rollout.completion_ids.size(1))
    scoring = time.perf_counter()
    groups.generation_seconds += scoring - started
    rollout, decoded, episodes = sampled.rollout, sampled.decoded, sampled.episodes
    row_prompts = [t for t in texts for _ in range(g)]
    scored = score_completions(
        gen.rewards,
        [d.answer for d in decoded],
        row_prompts,
        gen.prompts.reward_columns(indices, g),
        raw_completions=[d.text for d in decoded],
        prompt_messages=gen.prompts.prompt_messages(indices, g),
        **sampled.scoring_inputs(),
    )
    groups.reward_seconds += time.perf_counter() - scoring
    groups.reward_timeouts += scored.timed_out
    groups.reward_unavailable.update(scored.unavailable)
    for name, rows in scored.unscored.items():
        groups.reward_unscored[name] = groups.reward_unscored.get(name, 0) + rows
    groups.reward_rows += len(decoded)
    for name, failure in scored.failures.items():
        earlier = groups.reward_failures.get(name)
        groups.reward_failures[name] = earlier.merged(failure) if earlier else failure
    scores = torch.tensor(scored.matrix, dtype=torch.float32).reshape(len(decoded), len(gen.rewards))
    groups.rounds.append(_Rows(rollout, row_prompts, decoded, scores, gen.prompts.sample_columns(indices, g),
                               scored.row_errors(len(decoded)), episodes))
    spread = torch.nan_to_num(group_std(combine_rewards(scores, gen.weights), g), nan=0.0)
    has_signal = ~torch.isclose(spread, torch.tensor(0.0))
    # Every rank learns every rank's flags, so all decide alike whether to resample and what to keep.
    groups.informative += gen.placement.ranks.gather_rows(has_signal.long()).bool().tolist()
    groups.truncated_prompts += prompt_batch.num_truncated
    groups.prompt_count += len(indices)


def _select_groups(informative: list[bool], b: int) -> list[int]:
    """Indices (into ``informative``'s order) of the B groups to train on: groups with reward
    variance first, in sampling order, then zero-variance groups to fill the batch if the
    resampling cap was reached; returned in sampling order."""
    flags = torch.tensor(informative)
    order = torch.cat([flags.nonzero().flatten(), (~flags).nonzero().flatten()])
    return order[:b].sort().values.tolist()


def _take_selected(groups: _Groups, selected: list[int], g: int, pad_id: int, ranks: Ranks) -> _Rows:
    """This rank's rows of the selected groups: rank r trains the r-th contiguous share of
    ``selected``, as with no resampling, wherever each group was sampled. Each rank sends the
    groups it sampled to the ranks that train them (with one rank, it keeps them all)."""
    share = len(selected) // ranks.world_size
    outgoing: list[list[tuple[int, _Rows]]] = [[] for _ in range(ranks.world_size)]
    for position, index in enumerate(selected):
        round_index, in_round = divmod(index, len(selected))  # a round draws B = len(selected)
        sampled_by, local = divmod(in_round, share)
        if sampled_by == ranks.rank:
            rows = groups.rounds[round_index].group_on_cpu(local, g)
            outgoing[position // share].append((position, rows))
    arrived = sorted((item for part in ranks.exchange_objects(outgoing) for item in part), key=lambda i: i[0])
    return _Rows.concat([rows for _, rows in arrived], pad_id)


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
    should_stop: Callable[[], bool] | None = None,
    agent: AgentSetup | None = None,
) -> Experience:
    """Draw ``config.prompts_per_round`` prompts from ``sampler``, sample, score and prepare them
    for the ``config.round_steps · config.num_iterations`` optimizer steps they feed (advantages
    are computed over the whole round, as TRL computes them over its generation batch).
    ``should_stop``: see :func:`sample_completions` (its yes raises ``GenerationStopped``, with
    ``sampler`` already past the round's draws)."""
    gen = _Generation(models.policy, tokenizer, prompts, sampler, rewards, eos_ids, config, reasoning,
                      placement, should_stop, agent)
    ranks = placement.ranks
    g, b = config.num_generations, config.prompts_per_round
    groups = _Groups()
    _sample_round(gen, groups)
    extra_rounds = 0
    if config.drop_zero_std_groups:
        while sum(groups.informative) < b and extra_rounds < config.max_resample_batches:
            _sample_round(gen, groups)
            extra_rounds += 1
    selected = _select_groups(groups.informative, b)
    # One round (no resampling) selects every group, each already on the rank that trains it:
    # regrouping would only copy the batch to the CPU and back on every step.
    if len(groups.rounds) == 1:
        rows = groups.rounds[0]
    else:
        rows = _take_selected(groups, selected, g, tokenizer.pad_token_id, ranks)
    rollout = rows.rollout.to(placement.device)
    combined = combine_rewards(rows.scores, gen.weights)
    step_rewards = ranks.gather_rows(combined) if config.scale_rewards == "batch" else None
    adv = compute_advantages(combined, g, config.scale_rewards, step_rewards)
    loss_mask = rollout.sampled_mask  # a multi-turn trajectory's observations are not the model's
    if config.mask_truncated_completions:
        loss_mask = loss_mask * (~rollout.is_truncated).unsqueeze(1).long()
    exp = Experience(
        rollout=rollout,
        prompts=rows.prompts,
        columns=rows.columns,
        errors=rows.errors,
        episodes=rows.episodes,
        decoded=rows.decoded,
        rewards_per_func=rows.scores,
        rewards=combined,
        advantages=adv.advantages.to(placement.device),
        is_std_zero=adv.is_std_zero,
        loss_mask=loss_mask,
        selected_groups=selected,
        reward_timeouts=groups.reward_timeouts,
        reward_unavailable=groups.reward_unavailable,
        reward_unscored=groups.reward_unscored,
        reward_rows=groups.reward_rows,
        reward_failures=groups.reward_failures,
    )
    exp.round_tokens_per_step = ranks.sum([float(loss_mask.sum())])[0] / config.round_steps
    exp.metrics["timing/generation"] = groups.generation_seconds
    exp.metrics["timing/reward"] = groups.reward_seconds
    dynamic = config.drop_zero_std_groups
    exp.metrics.update(_sampling_metrics(groups, extra_rounds, dynamic, ranks))
    if agent is not None:
        exp.metrics.update(episode_metrics(rows.episodes, ranks))
    started = time.perf_counter()
    exp.ref_logprobs, exp.old_logprobs = fixed_logprobs(models, rollout, config, placement)
    exp.metrics["timing/ref"] = time.perf_counter() - started
    return exp


def _sampling_metrics(groups: _Groups, extra_rounds: int, dynamic: bool, ranks: Ranks) -> dict[str, Any]:
    truncated, count = ranks.sum([groups.truncated_prompts, groups.prompt_count])
    metrics: dict[str, Any] = {"prompts/truncated_ratio": truncated / max(1.0, count)}
    if dynamic:
        metrics["dynamic_sampling/informative_groups"] = sum(groups.informative)
        metrics["dynamic_sampling/extra_batches"] = extra_rounds
    return metrics


@torch.no_grad()
def fixed_logprobs(
    models: PolicyAndReference, rollout: Rollout, config: GRPOConfig, placement: Placement
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(ref_logprobs, old_logprobs)``, each ``(N, T)``: the reference's when ``beta != 0`` and
    the generating policy's when the round feeds more than one optimizer step (TRL's rule: the
    later steps see a policy that has moved); None where not needed."""
    ref = old = None
    if config.beta != 0.0:
        with models.reference_model() as reference:
            ref = _logprobs_in_chunks(reference, rollout, config, placement)
    if config.num_iterations * config.round_steps > 1:
        old = _logprobs_in_chunks(models.policy, rollout, config, placement)
    return ref, old


def _logprobs_in_chunks(
    model: torch.nn.Module, rollout: Rollout, config: GRPOConfig, placement: Placement
) -> torch.Tensor:
    """Micro-batch by micro-batch, as the update runs (a round of k steps is k·accumulation
    micro-batches, the same rows each step's update takes), so it never needs more memory than that."""
    was_training = model.training
    model.eval()
    parts = []
    chunks = config.gradient_accumulation_steps * config.round_steps
    try:
        for rows in micro_batches(rollout.completion_ids.size(0), chunks):
            part = rollout.select(rows)
            with placement.autocast():
                logp, _ = rollout_logprobs(model, part, config.temperature)
            parts.append(logp)
    finally:
        model.train(was_training)
    return torch.cat(parts)
