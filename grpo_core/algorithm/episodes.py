"""Multi-turn rollouts: every live episode of a round decodes its turn in one batch, then what
answers it comes back as tokens and the episode goes on to its next turn. With tools, a turn's
tool calls run (all episodes' together, in the sandbox) and their results come back; an episode
that answers without a call leaves the batch. With an environment, each turn is an action given
to the episode's own ``Environment`` (:mod:`grpo_core.agents.environment_runner`), whose
observation comes back and whose rewards add up to the episode's ``env_reward``; an episode leaves
when the environment says it is done or after ``max_turns``. Any episode also leaves when it runs
out of tokens.

A trajectory is kept as token ids, never as text: the tokens each turn sampled, then the
observation's tokens as :class:`~grpo_core.agents.rendering.Conversations` renders them. The
update therefore scores each model token in exactly the context it was sampled in, and
``model_mask`` tells the loss which tokens are the model's (docs/grpo_reference.md, "Episodes").

Randomness stays counter-based (:mod:`grpo_core.algorithm.randomness`): turn ``t`` of a row draws
with its row key folded with ``t``, so an episode depends on its prompt and key only, on any
number of ranks and after a resume, as a single-turn row does. Turn 0 uses the row key itself:
an episode that answers in one turn is the single-turn sample.

Budgets: ``max_completion_length`` counts the model's tokens of the whole episode;
``max_trajectory_length`` (default: the model's positions) counts the prompt, every turn and every
observation. A turn cut by either ends the episode as truncated (``mask_truncated_completions``
applies); an observation that would not fit ends it where it is, without the observation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from grpo_core.agents.environment_answers import Episodes
from grpo_core.agents.environment_runner import open_episodes
from grpo_core.agents.environment_setup import EnvironmentSetup
from grpo_core.agents.rendering import Conversations, with_observation
from grpo_core.agents.tool_calls import content_without_calls, parse_tool_calls
from grpo_core.agents.tool_runner import run_tool_calls
from grpo_core.algorithm.completion_text import DecodedCompletion, decode_and_strip_padding, split_reasoning
from grpo_core.algorithm.decoders import RowCache
from grpo_core.algorithm.randomness import absorb
from grpo_core.algorithm.rollout import (
    PromptBatch,
    Rollout,
    SamplingOptions,
    TurnCaches,
    left_padded,
    sample_completions,
    tokenize_prompts,
)
from grpo_core.parallel.distributed import SINGLE, Ranks
from grpo_core.rewards.sandbox import Limits
from grpo_core.spec.run_spec import ReasoningSpec
from grpo_core.spec.tool_schemas import ToolSet


@dataclass(frozen=True)
class AgentSetup:
    """What a job's episodes need besides the model: its tools and how they run, or its
    environment; the turn limit and the trajectory's bound."""

    conversations: Conversations
    tools: ToolSet | None
    tool_limits: Limits
    max_tool_calling_iterations: int | None
    max_trajectory_length: int
    environment: EnvironmentSetup | None = None
    max_prompt_length: int = 512  # a prompt that grew by an environment's first observation is cut to it


@dataclass
class _Episode:
    prompt: list[int]
    chat: bool
    tokens: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # 1 where the model sampled the token
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    env_reward: float = 0.0
    truncated: bool = False
    answer: DecodedCompletion | None = None

    def context(self) -> list[int]:
        return self.prompt + self.tokens

    def observe(self, observation: list[int], bound: int) -> bool:
        """Append what answered the turn (not the model's tokens), or, with no room for it and a
        turn after it within ``bound``, end the episode as truncated; whether it goes on."""
        if len(self.context()) + len(observation) >= bound:
            self.truncated = True
            return False
        self.tokens += observation
        self.sampled += [0] * len(observation)
        return True

    @property
    def model_tokens(self) -> int:
        return sum(self.sampled)


@dataclass(frozen=True)
class EpisodeStats:
    """Per row: turns the model took, tool calls it made, how many failed; its messages; and
    with an environment, the sum of its rewards (None without one)."""

    turns: list[int]
    tool_calls: list[int]
    tool_errors: list[int]
    messages: list[list[dict[str, Any]]]
    env_rewards: list[float] | None = None

    def rows(self) -> list[dict[str, Any]]:
        """Each row's record, as the step's samples show it and its metrics count it."""
        rows = [
            {"turns": t, "tool_calls": c, "tool_errors": e, "messages": m}
            for t, c, e, m in zip(self.turns, self.tool_calls, self.tool_errors, self.messages, strict=True)
        ]
        for row, reward in zip(rows, self.env_rewards or [], strict=False):
            row["env_reward"] = reward
        return rows


def episode_metrics(rows: list[dict[str, Any]], ranks: Ranks = SINGLE) -> dict[str, float]:
    """``turns/mean``, ``turns/max``, ``tool_calls/mean`` (per episode) and ``tool_errors/frequency``
    (failed calls over calls, 0 without calls) of the step's episodes, all ranks'; with an
    environment (its rows carry ``env_reward``, on every rank alike), ``env_reward/mean``."""
    turns, calls, errors, count, env = ranks.sum(
        [
            float(sum(r["turns"] for r in rows)),
            float(sum(r["tool_calls"] for r in rows)),
            float(sum(r["tool_errors"] for r in rows)),
            float(len(rows)),
            float(sum(r.get("env_reward", 0.0) for r in rows)),
        ]
    )
    [most] = ranks.max([float(max((r["turns"] for r in rows), default=0))])
    metrics = {
        "turns/mean": turns / max(1.0, count),
        "turns/max": most,
        "tool_calls/mean": calls / max(1.0, count),
        "tool_errors/frequency": errors / calls if calls else 0.0,
    }
    if any("env_reward" in r for r in rows):
        metrics["env_reward/mean"] = env / max(1.0, count)
    return metrics


@dataclass(frozen=True)
class SampledRows:
    """A round's rows however they were sampled: the rollout, each row's decoded text and answer,
    and each row's episode record (empty dicts for single-turn rows)."""

    rollout: Rollout
    decoded: list[DecodedCompletion]
    episodes: list[dict[str, Any]]

    def scoring_inputs(self) -> dict[str, list[Any]]:
        """What :func:`~grpo_core.rewards.scoring.score_completions` takes of the episodes: their
        messages and environment rewards (nothing for single-turn rows)."""
        if not any(self.episodes):
            return {}
        return {
            "completion_messages": [e.get("messages") for e in self.episodes],
            "environment_rewards": [e.get("env_reward") for e in self.episodes],
        }


def sample_rows(
    model: torch.nn.Module,
    prompts: PromptBatch,
    items: list[dict[str, Any]],
    num_generations: int,
    eos_ids: torch.Tensor,
    tokenizer: Any,
    options: SamplingOptions,
    keys: torch.Tensor | None,
    agent: AgentSetup | None,
    reasoning: ReasoningSpec,
    should_stop: Callable[[], bool] | None = None,
) -> SampledRows:
    """``G`` rows for each prompt of ``prompts``, ``items`` their dataset rows: one completion
    each, or with ``agent`` an episode each (:func:`sample_episodes`). What training and
    evaluation both sample with."""
    if agent is None:
        rollout = sample_completions(
            model, prompts, num_generations, eos_ids, tokenizer.pad_token_id, options, keys, should_stop
        )
        decoded = decode_and_strip_padding(
            rollout.completion_ids, rollout.completion_mask, tokenizer, reasoning
        )
        return SampledRows(rollout, decoded, [{} for _ in decoded])
    chat = [isinstance(item["prompt"], list) for item in items]
    rollout, decoded, stats = sample_episodes(
        model,
        prompts,
        chat,
        num_generations,
        eos_ids,
        tokenizer,
        options,
        keys,
        agent,
        reasoning,
        should_stop,
        items,
    )
    return SampledRows(rollout, decoded, stats.rows())


@torch.no_grad()
def sample_episodes(
    model: torch.nn.Module,
    prompts: PromptBatch,
    chat: list[bool],
    num_generations: int,
    eos_ids: torch.Tensor,
    tokenizer: Any,
    options: SamplingOptions,
    keys: torch.Tensor | None,
    setup: AgentSetup,
    reasoning: ReasoningSpec,
    should_stop: Callable[[], bool] | None = None,
    items: list[dict[str, Any]] | None = None,
) -> tuple[Rollout, list[DecodedCompletion], EpisodeStats]:
    """``G`` episodes for each prompt of ``prompts`` (B·G rows, grouped as a single-turn rollout):
    the rollout (``model_mask`` set), each row's decoded completion (``text`` the whole trajectory,
    ``answer`` the last turn's content without its tool calls) and the episodes' statistics.
    ``items``: each prompt's dataset row, what an environment's ``reset`` gets (its ``prompt`` is
    the one a first observation is added to); needed with an environment only."""
    pad = tokenizer.pad_token_id
    prompt_rows = [row[mask.bool()].tolist() for row, mask in zip(prompts.ids, prompts.mask, strict=True)]
    episodes = [
        _Episode(list(prompt_rows[i // num_generations]), chat[i // num_generations])
        for i in range(len(prompt_rows) * num_generations)
    ]
    environment = None
    if setup.environment is not None:
        if items is None:
            raise ValueError("an environment's episodes need their dataset rows (items)")
        environment = open_episodes(
            setup.environment, [items[i // num_generations] for i in range(len(episodes))]
        )
    try:
        if environment is not None:
            _add_first_observations(episodes, environment, items, num_generations, setup, tokenizer)
        _take_turns(
            model,
            episodes,
            eos_ids,
            tokenizer,
            options,
            keys,
            setup,
            reasoning,
            should_stop,
            environment,
            pad,
            prompts.ids.device,
        )
    finally:
        if environment is not None:
            environment.close()
    rollout = _rollout(episodes, prompts, num_generations, pad)
    whole = decode_and_strip_padding(
        rollout.completion_ids, rollout.completion_mask, tokenizer, ReasoningSpec(enabled=False)
    )
    decoded = [
        DecodedCompletion(text.text, answer.answer, answer.reasoning, answer.unclosed_reasoning)
        for text, answer in zip(
            whole, (e.answer or split_reasoning("", reasoning) for e in episodes), strict=True
        )
    ]
    stats = EpisodeStats(
        [e.turns for e in episodes],
        [e.tool_calls for e in episodes],
        [e.tool_errors for e in episodes],
        [e.messages for e in episodes],
        None if environment is None else [e.env_reward for e in episodes],
    )
    return rollout, decoded, stats


def _add_first_observations(
    episodes: list[_Episode],
    environment: Episodes,
    items: list[dict[str, Any]],
    g: int,
    setup: AgentSetup,
    tokenizer: Any,
) -> None:
    """Each episode whose ``reset`` returned an observation gets its prompt rendered again with
    the observation added (the last user message's, or the text's, end)."""
    for i, observation in enumerate(environment.first_observations):
        if observation is None:
            continue
        text = setup.conversations.prompt_text(with_observation(items[i // g]["prompt"], observation))
        episodes[i].prompt = (
            tokenize_prompts(tokenizer, [text], setup.max_prompt_length, torch.device("cpu")).ids[0].tolist()
        )


def _take_turns(
    model: torch.nn.Module,
    episodes: list[_Episode],
    eos_ids: torch.Tensor,
    tokenizer: Any,
    options: SamplingOptions,
    keys: torch.Tensor | None,
    setup: AgentSetup,
    reasoning: ReasoningSpec,
    should_stop: Callable[[], bool] | None,
    environment: Episodes | None,
    pad: int,
    device: torch.device,
) -> None:
    """The turn loop: all live episodes decode a turn together, then get their answers."""
    live = list(range(len(episodes)))
    turn = 0
    caches: dict[int, RowCache] = {}  # each live episode's KV cache from its last turn
    while live:
        budgets = {
            i: min(
                options.max_new_tokens - episodes[i].model_tokens,
                setup.max_trajectory_length - len(episodes[i].context()),
            )
            for i in live
        }
        for i in [i for i in live if budgets[i] <= 0]:
            episodes[i].truncated = True
        live = [i for i in live if budgets[i] > 0]
        if not live:
            break
        batch = left_padded([episodes[i].context() for i in live], pad, device)
        turn_keys = None if keys is None else (keys[live] if turn == 0 else absorb(keys[live], turn))
        turn_options = replace(options, max_new_tokens=max(budgets.values()))
        carried = TurnCaches()
        if live and all(i in caches for i in live):  # start from the caches: only the new tokens run
            held = [caches[i] for i in live]
            carried = TurnCaches(
                held, [episodes[i].context()[c.tokens :] for i, c in zip(live, held, strict=True)]
            )
        sampled = sample_completions(
            model, batch, 1, eos_ids, pad, turn_options, turn_keys, should_stop, turn=carried
        )
        caches = {live[row]: cache for row, cache in (carried.kept or {}).items()}
        decoded = decode_and_strip_padding(
            sampled.completion_ids, sampled.completion_mask, tokenizer, ReasoningSpec(enabled=False)
        )
        calling: list[tuple[int, list]] = []
        acting: list[int] = []
        for row, i in enumerate(live):
            episode, budget = episodes[i], budgets[i]
            length = int(sampled.completion_mask[row].sum())
            tokens = sampled.completion_ids[row, : min(length, budget)].tolist()
            ended = bool(torch.isin(torch.tensor(tokens[-1:]), eos_ids.cpu()).any()) if tokens else False
            episode.tokens += tokens
            episode.sampled += [1] * len(tokens)
            episode.turns += 1
            text = (
                decoded[row].text if length <= budget else tokenizer.decode(tokens, skip_special_tokens=True)
            )
            calls = parse_tool_calls(text) if setup.tools is not None else []
            episode.messages.append(
                {
                    "role": "assistant",
                    "content": content_without_calls(text) if calls else text,
                    **({"tool_calls": [c.as_message_call() for c in calls]} if calls else {}),
                    **({"reward": None} if environment is not None else {}),  # the step's, once it is taken
                }
            )
            episode.answer = split_reasoning(content_without_calls(text) if calls else text, reasoning)
            if not ended and length >= budget:  # cut by a budget: the episode ends unfinished
                episode.truncated = True
            elif environment is not None:
                acting.append(i)
            elif calls and (
                setup.max_tool_calling_iterations is None or turn < setup.max_tool_calling_iterations
            ):
                calling.append((i, calls))
        live = _observe(episodes, calling, setup)
        if environment is not None:
            live += _act(episodes, acting, environment, setup)
        turn += 1


def _act(
    episodes: list[_Episode],
    acting: list[int],
    environment: Episodes,
    setup: AgentSetup,
) -> list[int]:
    """Give every acting episode's turn (its answer) to its environment, all at once; add each
    turn's reward to the episode's and its observation to the trajectory. Returns the episodes
    that go on: not done, under ``max_turns``, and with room for the observation and a turn."""
    results = environment.step({i: episodes[i].answer.answer for i in acting}) if acting else {}
    going_on = []
    for i in acting:
        episode, result = episodes[i], results[i]
        episode.env_reward += result.reward or 0.0
        episode.messages[-1]["reward"] = result.reward
        if result.observation is not None:
            episode.messages.append({"role": "user", "content": result.observation})
        if result.done or episode.turns >= setup.environment.max_turns:
            environment.finish(i)
            continue
        message = {"role": "user", "content": result.observation or ""}
        observation = setup.conversations.observation_ids([message], episode.chat)
        if not episode.observe(observation, setup.max_trajectory_length):
            environment.finish(i)
            continue
        going_on.append(i)
    return sorted(going_on)


def _observe(episodes: list[_Episode], calling: list[tuple[int, list]], setup: AgentSetup) -> list[int]:
    """Run every calling episode's tool calls (all of them in one go), append each episode's
    results as observation tokens, and return the episodes that go on to another turn."""
    flat = [call for _, calls in calling for call in calls]
    results = run_tool_calls(setup.tools.sources, flat, setup.tool_limits) if flat else []
    going_on, at = [], 0
    for i, calls in calling:
        episode, mine = episodes[i], results[at : at + len(calls)]
        at += len(calls)
        episode.tool_calls += len(calls)
        episode.tool_errors += sum(result.failed for result in mine)
        messages = setup.conversations.tool_messages(
            [(c.name, r.content) for c, r in zip(calls, mine, strict=True)]
        )
        observation = setup.conversations.observation_ids(messages, episode.chat)
        episode.messages += [
            {"role": "tool", "name": c.name, "content": r.content} for c, r in zip(calls, mine, strict=True)
        ]
        if episode.observe(observation, setup.max_trajectory_length):
            going_on.append(i)
    return going_on


def _rollout(episodes: list[_Episode], prompts: PromptBatch, g: int, pad: int) -> Rollout:
    """The episodes as one rollout: each episode's prompt as sampled (left-padded; the group's
    own, or with an environment's first observation added), its trajectory after it
    (right-padded), its model tokens marked."""
    width = max(1, max(len(e.tokens) for e in episodes))
    n = len(episodes)
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    model = torch.zeros((n, width), dtype=torch.long)
    for row, episode in enumerate(episodes):
        ids[row, : len(episode.tokens)] = torch.tensor(episode.tokens, dtype=torch.long)
        mask[row, : len(episode.tokens)] = 1
        model[row, : len(episode.sampled)] = torch.tensor(episode.sampled, dtype=torch.long)
    device = prompts.ids.device
    truncated = torch.tensor([e.truncated for e in episodes], dtype=torch.bool)
    prompt = left_padded([e.prompt for e in episodes], pad, device)
    return Rollout(
        prompt.ids,
        prompt.mask,
        ids.to(device),
        mask.to(device),
        truncated.to(device),
        model.to(device),
    )
