"""Multi-turn rollouts: every live episode of a round decodes its turn in one batch, its tool
calls run (all episodes' together, in the sandbox), their results are appended as tokens, and the
episodes that called a tool go on to their next turn; an episode that answers without a call, or
runs out of turns or tokens, leaves the batch.

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

from grpo_core.agents.rendering import Conversations
from grpo_core.agents.tool_calls import content_without_calls, parse_tool_calls
from grpo_core.agents.tool_runner import run_tool_calls
from grpo_core.algorithm.completion_text import DecodedCompletion, decode_and_strip_padding, split_reasoning
from grpo_core.algorithm.randomness import absorb
from grpo_core.algorithm.rollout import (
    PromptBatch,
    Rollout,
    SamplingOptions,
    left_padded,
    sample_completions,
)
from grpo_core.parallel.distributed import SINGLE, Ranks
from grpo_core.rewards.sandbox import Limits
from grpo_core.spec.run_spec import ReasoningSpec
from grpo_core.spec.tool_schemas import ToolSet


@dataclass(frozen=True)
class AgentSetup:
    """What a job's episodes need besides the model: its tools and how they run, the turn limit
    and the trajectory's bound."""

    conversations: Conversations
    tools: ToolSet
    tool_limits: Limits
    max_tool_calling_iterations: int | None
    max_trajectory_length: int


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
    truncated: bool = False
    answer: DecodedCompletion | None = None

    def context(self) -> list[int]:
        return self.prompt + self.tokens

    @property
    def model_tokens(self) -> int:
        return sum(self.sampled)


@dataclass(frozen=True)
class EpisodeStats:
    """Per row: turns the model took, tool calls it made, how many failed; and its messages."""

    turns: list[int]
    tool_calls: list[int]
    tool_errors: list[int]
    messages: list[list[dict[str, Any]]]

    def rows(self) -> list[dict[str, Any]]:
        """Each row's record, as the step's samples show it and its metrics count it."""
        return [
            {"turns": t, "tool_calls": c, "tool_errors": e, "messages": m}
            for t, c, e, m in zip(self.turns, self.tool_calls, self.tool_errors, self.messages, strict=True)
        ]


def episode_metrics(rows: list[dict[str, Any]], ranks: Ranks = SINGLE) -> dict[str, float]:
    """``turns/mean``, ``turns/max``, ``tool_calls/mean`` (per episode) and ``tool_errors/frequency``
    (failed calls over calls, 0 without calls) of the step's episodes, all ranks'."""
    turns, calls, errors, count = ranks.sum(
        [
            float(sum(r["turns"] for r in rows)),
            float(sum(r["tool_calls"] for r in rows)),
            float(sum(r["tool_errors"] for r in rows)),
            float(len(rows)),
        ]
    )
    [most] = ranks.max([float(max((r["turns"] for r in rows), default=0))])
    return {
        "turns/mean": turns / max(1.0, count),
        "turns/max": most,
        "tool_calls/mean": calls / max(1.0, count),
        "tool_errors/frequency": errors / calls if calls else 0.0,
    }


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
) -> tuple[Rollout, list[DecodedCompletion], EpisodeStats]:
    """``G`` episodes for each prompt of ``prompts`` (B·G rows, grouped as a single-turn rollout):
    the rollout (``model_mask`` set), each row's decoded completion (``text`` the whole trajectory,
    ``answer`` the last turn's content without its tool calls) and the episodes' statistics."""
    pad = tokenizer.pad_token_id
    prompt_rows = [row[mask.bool()].tolist() for row, mask in zip(prompts.ids, prompts.mask, strict=True)]
    episodes = [
        _Episode(list(prompt_rows[i // num_generations]), chat[i // num_generations])
        for i in range(len(prompt_rows) * num_generations)
    ]
    live = list(range(len(episodes)))
    turn = 0
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
        batch = left_padded([episodes[i].context() for i in live], pad, prompts.ids.device)
        turn_keys = None if keys is None else (keys[live] if turn == 0 else absorb(keys[live], turn))
        turn_options = replace(options, max_new_tokens=max(budgets.values()))
        sampled = sample_completions(model, batch, 1, eos_ids, pad, turn_options, turn_keys, should_stop)
        decoded = decode_and_strip_padding(
            sampled.completion_ids, sampled.completion_mask, tokenizer, ReasoningSpec(enabled=False)
        )
        calling: list[tuple[int, list]] = []
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
            calls = parse_tool_calls(text)
            episode.messages.append(
                {
                    "role": "assistant",
                    "content": content_without_calls(text) if calls else text,
                    **({"tool_calls": [c.as_message_call() for c in calls]} if calls else {}),
                }
            )
            if not ended and length >= budget:  # cut by a budget: the episode ends unfinished
                episode.truncated = True
            elif calls and (
                setup.max_tool_calling_iterations is None or turn < setup.max_tool_calling_iterations
            ):
                calling.append((i, calls))
            episode.answer = split_reasoning(content_without_calls(text) if calls else text, reasoning)
        live = _observe(episodes, calling, setup)
        turn += 1
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
    )
    return rollout, decoded, stats


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
        if len(episode.context()) + len(observation) >= setup.max_trajectory_length:
            episode.truncated = True  # no room for the results and a turn after them
            continue
        episode.tokens += observation
        episode.sampled += [0] * len(observation)
        going_on.append(i)
    return going_on


def _rollout(episodes: list[_Episode], prompts: PromptBatch, g: int, pad: int) -> Rollout:
    """The episodes as one rollout: the prompts as sampled (left-padded), each trajectory after
    them (right-padded), its model tokens marked."""
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
    return Rollout(
        prompts.ids.repeat_interleave(g, dim=0),
        prompts.mask.repeat_interleave(g, dim=0),
        ids.to(device),
        mask.to(device),
        truncated.to(device),
        model.to(device),
    )
