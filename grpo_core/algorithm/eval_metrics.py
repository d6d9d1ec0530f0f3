"""The eval metrics of one evaluation (issue 25), with TRL's names behind an ``eval_`` prefix, and
its rows as browsable samples; pure functions of the scored eval completions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_core.algorithm.advantages import nanstd
from grpo_core.json_values import json_safe

# Marks an eval completion among a step's samples (training rows carry no split).
EVAL_SPLIT = "eval"
# Eval completions kept as samples per evaluation: enough to browse, bounded like training's.
MAX_EVAL_SAMPLE_ROWS = 64


@dataclass(frozen=True)
class EvalRow:
    """One scored eval completion: generation ``generation`` of eval prompt ``prompt_index``."""

    prompt_index: int
    generation: int
    prompt: str
    text: str
    answer: str
    scores: list[float]  # per reward function, NaN = not applicable
    reward: float  # the weighted sum, NaN = unscorable
    length: int  # completion tokens, EOS included
    truncated: bool  # reached max_completion_length without an EOS
    # the dataset row's columns but the prompt, as the samples show them (PromptSet.sample_columns)
    columns: dict[str, Any] = field(default_factory=dict)
    # a multi-turn episode's turns, tool calls and messages (grpo_core.algorithm.episodes); empty otherwise
    episode: dict[str, Any] = field(default_factory=dict)


def passes(reward: float, threshold: float) -> bool:
    """An unscorable completion (NaN) never passes."""
    return not math.isnan(reward) and reward >= threshold


def pass_at_k(rows: list[EvalRow], threshold: float) -> float:
    """The fraction of eval prompts with at least one completion whose reward reaches ``threshold``."""
    passed: dict[int, bool] = {}
    for row in rows:
        passed[row.prompt_index] = passed.get(row.prompt_index, False) or passes(row.reward, threshold)
    return sum(passed.values()) / max(1, len(passed))


def eval_metrics(rows: list[EvalRow], reward_names: list[str], pass_threshold: float) -> dict[str, Any]:
    """Reward, pass@k and completion-length statistics over every eval completion (None where a
    statistic has no values, as in training records)."""
    rewards = torch.tensor([row.reward for row in rows], dtype=torch.float64)
    scores = torch.tensor([row.scores for row in rows], dtype=torch.float64).reshape(len(rows), -1)
    lengths = torch.tensor([row.length for row in rows], dtype=torch.float64)
    truncated = torch.tensor([row.truncated for row in rows], dtype=torch.bool)
    out: dict[str, float] = {
        "eval_reward": torch.nanmean(rewards).item(),
        "eval_reward_std": nanstd(rewards).item(),
        "eval_pass@k": pass_at_k(rows, pass_threshold),
    }
    for i, name in enumerate(reward_names):
        out[f"eval_rewards/{name}/mean"] = torch.nanmean(scores[:, i]).item()
        out[f"eval_rewards/{name}/std"] = nanstd(scores[:, i]).item()
    terminated = lengths[~truncated]
    out.update({
        "eval_completions/mean_length": lengths.mean().item(),
        "eval_completions/min_length": lengths.min().item(),
        "eval_completions/max_length": lengths.max().item(),
        "eval_completions/clipped_ratio": truncated.double().mean().item(),
        "eval_completions/mean_terminated_length": terminated.mean().item() if terminated.numel() else 0.0,
    })
    return json_safe(out)


def eval_sample_rows(rows: list[EvalRow], reward_names: list[str], step: int) -> list[dict[str, Any]]:
    """The first eval completions in the shape of training samples, marked ``split: eval``; an
    eval completion has no advantage."""
    return json_safe([
        {
            "step": step,
            "split": EVAL_SPLIT,
            "prompt": row.prompt,
            "completion": row.text,
            "answer": row.answer,
            "columns": row.columns,
            "rewards": dict(zip(reward_names, row.scores, strict=True)),
            "reward": row.reward,
            "advantage": None,
            **row.episode,
        }
        for row in rows[:MAX_EVAL_SAMPLE_ROWS]
    ])
