"""Helpers shared by the reward test modules (imported by name: tests/grpo_core is on sys.path)."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_core.errors import SpecError
from grpo_core.rewards import BoundReward, RewardContext, available_rewards, bind_rewards
from grpo_core.spec.run_spec import RewardSpec


@pytest.fixture(autouse=True)
def fresh_registry():
    """Rediscover after each test; autouse fixtures tear down after monkeypatch has undone its patches."""
    yield
    available_rewards(refresh=True)


def bind_one(name: str, context: RewardContext | None = None, **args: Any) -> BoundReward:
    return bind_rewards([RewardSpec(name=name, args=args)], context or RewardContext())[0]


def run(reward: BoundReward, completions: list[str], **columns: Any) -> list[float | None]:
    return reward.fn(completions, [""] * len(completions), **columns)


def spec_error(specs: list[RewardSpec], columns: set[str] | None = None, **context: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        bind_rewards(specs, RewardContext(**context), columns)
    return info.value
