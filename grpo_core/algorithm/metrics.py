"""Metric records with TRL's names (docs/architecture.md §5), built from an :class:`Experience`."""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch

from grpo_core.algorithm.advantages import nanstd
from grpo_core.algorithm.experience import Experience
from grpo_core.json_values import json_safe
from grpo_core.parallel.distributed import SINGLE, Ranks

MAX_SAMPLE_ROWS = 64


def _step_columns(exp: Experience, ranks: Ranks) -> dict[str, torch.Tensor]:
    """The per-row values metrics are computed from, for the whole step's rows in the 1-process
    order (one gather across ranks), so every statistic is the exact 1-process one."""
    local = {
        "rewards": exp.rewards,
        "is_std_zero": exp.is_std_zero,
        "advantages": exp.advantages,
        "lengths": exp.rollout.completion_mask.sum(dim=1),
        "truncated": exp.rollout.is_truncated,
        "unclosed": torch.tensor([float(d.unclosed_reasoning) for d in exp.decoded]),
    }
    columns = [v.detach().reshape(len(exp.decoded), -1).to("cpu", torch.float64) for v in local.values()]
    step = ranks.gather_rows(torch.cat([*columns, exp.rewards_per_func.to("cpu", torch.float64)], dim=1))
    out = {name: step[:, i].float() for i, name in enumerate(local)}
    out["rewards_per_func"] = step[:, len(local) :].float()
    return out


def experience_metrics(exp: Experience, reward_names: list[str], ranks: Ranks = SINGLE) -> dict[str, Any]:
    """Reward, advantage and completion statistics of one generation batch (the whole step's)."""
    rows = _step_columns(exp, ranks)
    rewards, adv, lengths = rows["rewards"], rows["advantages"], rows["lengths"]
    truncated = rows["truncated"].bool()
    out: dict[str, Any] = {
        "reward": torch.nanmean(rewards).item(),
        "reward_std": nanstd(rewards).item(),
        "frac_reward_zero_std": rows["is_std_zero"].mean().item(),
    }
    for i, name in enumerate(reward_names):
        column = rows["rewards_per_func"][:, i]
        out[f"rewards/{name}/mean"] = torch.nanmean(column).item()
        out[f"rewards/{name}/std"] = nanstd(column).item()
    terminated = lengths[~truncated]
    out.update(
        {
            "advantages/mean": adv.mean().item(),
            "advantages/std": adv.std().item(),
            "advantages/min": adv.min().item(),
            "advantages/max": adv.max().item(),
            "completions/mean_length": lengths.mean().item(),
            "completions/min_length": lengths.min().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": truncated.float().mean().item(),
            "completions/mean_terminated_length": terminated.mean().item() if terminated.numel() else 0.0,
            "reasoning/unclosed_ratio": rows["unclosed"].mean().item() if rows["unclosed"].numel() else 0.0,
        }
    )
    out.update(exp.metrics)
    return json_safe({k: float(v) for k, v in out.items()})


def tokens_in(exp: Experience) -> int:
    """Prompt + completion tokens the step processed (padding excluded)."""
    return int(exp.rollout.prompt_mask.sum() + exp.rollout.completion_mask.sum())


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA allocation on GPU; the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def sample_rows(
    exp: Experience, reward_names: list[str], step: int, ranks: Ranks = SINGLE
) -> list[dict[str, Any]]:
    """The first rows of the step's batch (whole groups) for the dashboard's completions table."""
    if ranks.world_size > 1:
        parts = ranks.gather_objects(sample_rows(exp, reward_names, step))
        return [row for part in parts for row in part][:MAX_SAMPLE_ROWS]
    rows = []
    for i in range(min(MAX_SAMPLE_ROWS, len(exp.decoded))):
        per_func = {n: exp.rewards_per_func[i, j].item() for j, n in enumerate(reward_names)}
        error = exp.errors[i] if i < len(exp.errors) else None
        episode = exp.episodes[i] if i < len(exp.episodes) else {}
        rows.append(
            {
                **({"error": error} if error else {}),  # only rows a reward said it could not score
                **episode,  # a multi-turn episode's turns, tool calls and messages (the conversation)
                "step": step,
                "prompt": exp.prompts[i],
                "completion": exp.decoded[i].text,
                "answer": exp.decoded[i].answer,
                "columns": exp.columns[i] if i < len(exp.columns) else {},
                "rewards": per_func,
                "reward": exp.rewards[i].item(),
                "advantage": exp.advantages[i].item(),
            }
        )
    return json_safe(rows)
