"""A dry run of a spec's rewards: score a few hand-written samples the way a training step would,
without a model, so a team can check its rewards (its ``python`` grader above all) before paying
for training. Torch-free: the API runs it (``POST /v1/rewards/run``).

Each sample is a prompt (text, or chat messages as a dataset row gives them), a completion and the
row's other columns. The scores go through the same path as a step's
(:func:`grpo_core.rewards.score_completions`: budget, clip, gates), and the total is the same
weighted sum over the rewards that scored the row (none: None, as an unscorable row in training).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from grpo_core.rewards.reward_types import BoundReward
from grpo_core.rewards.scoring import score_completions

__all__ = ["SampleScores", "TrialSample", "prompt_text", "score_samples", "weighted_total"]


@dataclass(frozen=True)
class TrialSample:
    prompt: str | list[dict[str, Any]]
    completion: str
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass
class SampleScores:
    reward: float | None  # the weighted sum a training step would compute from these
    rewards: dict[str, float | None]  # each reward after its clip and gate; None: not scored
    problems: dict[str, str] = field(default_factory=dict)  # reward -> why it left this row unscored


def prompt_text(prompt: str | list[dict[str, Any]]) -> str:
    """The prompt as the ``prompts`` argument rewards get. A chat prompt is rendered by the
    model's chat template in training; with no model here, its messages' contents, one a line."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(message.get("content", "")) for message in prompt)


def weighted_total(scores: list[float], weights: list[float]) -> float | None:
    """The weighted sum over the scores that are not NaN; None when every one is (as
    :func:`grpo_core.algorithm.advantages.combine_rewards` leaves such a row NaN)."""
    present = [(score, weight) for score, weight in zip(scores, weights, strict=True)
               if not math.isnan(score)]
    return sum(score * weight for score, weight in present) if present else None


def _call_problems(scored: Any, reward: BoundReward) -> str | None:
    """Why a reward scored no row of the call at all, when it did not."""
    if reward.name in scored.timed_out:
        return f"did not return within the budget ({reward.timeout_seconds:g} s)"
    return scored.unavailable.get(reward.name)


def score_samples(rewards: list[BoundReward], samples: list[TrialSample]) -> list[SampleScores]:
    """Each sample's scores, in order. A reward that raises (a grader that does not load) raises
    here as it would fail the job: :class:`grpo_core.errors.GRPOError` ``reward_error``."""
    names = sorted({name for sample in samples for name in sample.columns})
    columns = {name: [sample.columns.get(name) for sample in samples] for name in names}
    messages = [sample.prompt if not isinstance(sample.prompt, str) else None for sample in samples]
    scored = score_completions(rewards, [sample.completion for sample in samples],
                               [prompt_text(sample.prompt) for sample in samples], columns,
                               prompt_messages=messages)
    weights = [reward.weight for reward in rewards]
    results = []
    for row, values in enumerate(scored.matrix):
        by_name, problems = {}, {}
        for reward, value in zip(rewards, values, strict=True):
            by_name[reward.name] = None if math.isnan(value) else value
            why = _call_problems(scored, reward) or scored.problems.get(reward.name, {}).get(row)
            if math.isnan(value) and why:
                problems[reward.name] = why
        results.append(SampleScores(weighted_total(values, weights), by_name, problems))
    return results
