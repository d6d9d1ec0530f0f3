"""Clipping and gating of reward scores (grpo_core.rewards.shaping) against hand-computed
matrices, through score_completions and bind_rewards as a job uses them, and the spec checks."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from reward_helpers import fresh_registry  # noqa: F401 - autouse fixture

from grpo_core.algorithm.advantages import combine_rewards
from grpo_core.rewards import BoundReward, RewardContext, bind_rewards, score_completions
from grpo_core.spec.run_spec import RewardSpec, RunSpec

NAN = math.nan


def fixed(values: list[float | None]):
    return lambda completions, prompts, **columns: list(values)


def scored(rewards: list[BoundReward]) -> list[list[float]]:
    n = 4
    return score_completions(rewards, ["c"] * n, ["p"] * n, {}).matrix


def same(actual: list[list[float]], expected: list[list[float]]) -> bool:
    flat = [(a, e) for ra, re in zip(actual, expected, strict=True) for a, e in zip(ra, re, strict=True)]
    return all((math.isnan(a) and math.isnan(e)) or a == e for a, e in flat)


def test_clipping_bounds_each_score_before_the_weighted_sum():
    reward = BoundReward("judge", 2.0, fixed([-3.0, 0.5, 7.0, None]), clip_min=-1.0, clip_max=1.0)
    matrix = scored([reward])
    assert same(matrix, [[-1.0], [0.5], [1.0], [NAN]])
    combined = combine_rewards(torch.tensor(matrix), torch.tensor([2.0]))
    assert combined[:3].tolist() == [-2.0, 1.0, 2.0] and math.isnan(combined[3])


def test_one_sided_clip():
    assert same(scored([BoundReward("r", 1.0, fixed([-3.0, 0.5, 7.0, 2.0]), clip_max=1.0)]),
                [[-3.0], [0.5], [1.0], [1.0]])


def test_gate_keeps_passing_rows_zeroes_failing_ones_and_spreads_unscorable_gates():
    fmt = BoundReward("format", 0.5, fixed([1.0, 0.0, None, 1.0]))
    judge = BoundReward("judge", 1.0, fixed([0.8, 0.9, 0.7, None]), gate_by="format")
    matrix = scored([fmt, judge])
    # pass -> own score; fail -> 0; gate unscorable -> unscorable; own NaN under a pass stays NaN.
    assert same(matrix, [[1.0, 0.8], [0.0, 0.0], [NAN, NAN], [1.0, NAN]])
    combined = combine_rewards(torch.tensor(matrix), torch.tensor([0.5, 1.0]))
    assert combined[0].item() == pytest.approx(1.3) and combined[1].item() == 0.0
    assert math.isnan(combined[2]) and combined[3].item() == 0.5


def test_a_failed_gate_zeroes_a_row_the_reward_could_not_score():
    fmt = BoundReward("format", 1.0, fixed([0.0] * 4))
    judge = BoundReward("judge", 1.0, fixed([None] * 4), gate_by="format")
    assert scored([fmt, judge]) == [[0.0, 0.0]] * 4


def test_gate_threshold_and_raw_gate_scores():
    # The gate is judged on its raw score: its own clip (to 0.2) does not close it at 0.5.
    gate = BoundReward("score", 1.0, fixed([0.3, 0.5, 0.9, -1.0]), clip_max=0.2)
    gated = BoundReward("judge", 1.0, fixed([5.0] * 4), gate_by="score", gate_threshold=0.4, clip_max=2.0)
    assert scored([gated, gate]) == [[0.0, 0.2], [2.0, 0.2], [2.0, 0.2], [0.0, -1.0]]


def test_gate_naming_an_unknown_reward_is_a_caller_error():
    with pytest.raises(ValueError, match="gate_by 'nope'"):
        scored([BoundReward("judge", 1.0, fixed([1.0] * 4), gate_by="nope")])


def job(rewards: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "j", "model": {"source": "path:m"}, "dataset": {"prompts": [{"prompt": "p"}]},
            "rewards": rewards}


def error_at(rewards: list[dict[str, Any]]) -> tuple[tuple[Any, ...], str]:
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(job(rewards))
    first = info.value.errors()[0]
    return first["loc"], first["msg"]


def test_spec_names_the_field_of_a_bad_gate_or_clip():
    loc, msg = error_at([{"name": "contains", "args": {"text": "x"}, "gate_by": "json_valid"}])
    assert loc == ("rewards", 0, "gate_by") and "contains" in msg
    loc, _ = error_at([{"name": "json_valid"}, {"name": "json_valid", "gate_by": "json_valid_2"}])
    assert loc == ("rewards", 1, "gate_by")  # itself, by its metric name
    loc, _ = error_at([{"name": "json_valid", "clip_min": 1, "clip_max": 0}])
    assert loc == ("rewards", 0, "clip_min")
    loc, _ = error_at([{"name": "json_valid", "gate_threshold": 0.5}])
    assert loc == ("rewards", 0, "gate_threshold")
    loc, _ = error_at([{"name": "json_valid", "clip_max": 1e9}])
    assert loc == ("rewards", 0, "clip_max")


def test_bound_rewards_carry_their_shaping_and_a_repeated_name_gates_by_its_suffix():
    spec = RunSpec.model_validate(job([
        {"name": "json_valid"},
        {"name": "json_valid", "args": {"require_object": True}, "clip_max": 0.5},
        {"name": "contains", "args": {"text": "{"}, "gate_by": "json_valid_2", "gate_threshold": 0.25},
    ]))
    rewards = bind_rewards(spec.rewards, RewardContext())
    assert [r.name for r in rewards] == ["json_valid", "json_valid_2", "contains"]
    assert rewards[1].clip_max == 0.5 and rewards[2].gate_by == "json_valid_2"
    texts = ['{"a": 1}', "[1]", "{", "x"]
    matrix = score_completions(rewards, texts, ["p"] * 4, {}).matrix
    assert matrix == [[1.0, 0.5, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_reward_spec_defaults_shape_nothing():
    reward = RewardSpec(name="json_valid")
    assert (reward.clip_min, reward.clip_max, reward.gate_by, reward.gate_threshold) == (None,) * 4
