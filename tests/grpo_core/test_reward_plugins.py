"""Reward plugins: discovered from the ``grpo.rewards`` entry-point group, with or without an
args model; a built-in wins over a plugin of the same name; a broken plugin says why."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from reward_helpers import bind_one, fresh_registry, run, spec_error  # noqa: F401 - autouse fixture

from grpo_core.rewards import RewardContext, RewardDefinition, available_rewards, bind_rewards, reward_catalog
from grpo_core.spec.run_spec import RewardSpec


class FakeEntryPoint:
    def __init__(self, name: str, obj: Any = None, error: Exception | None = None) -> None:
        self.name, self.group, self._obj, self._error = name, "grpo.rewards", obj, error

    def load(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._obj


def shouting(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
    """Fraction of upper-case characters."""
    return [sum(c.isupper() for c in text) / max(len(text), 1) for text in completions]


class PrefixArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix: str = Field(..., min_length=1, description="Required prefix.")


PREFIX = RewardDefinition(
    name="starts_with",
    description="1.0 if the answer starts with a prefix.",
    args_model=PrefixArgs,
    build=lambda args, context: (
        lambda completions, prompts, **_: [float(text.startswith(args.prefix)) for text in completions]
    ),
)


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> list[FakeEntryPoint]:
    entry_points = [
        FakeEntryPoint("shouting", shouting),
        FakeEntryPoint("prefix", PREFIX),  # the entry-point name wins over the definition's
        FakeEntryPoint("exact_match", shouting),  # shadowed by the built-in
        FakeEntryPoint("broken", error=ImportError("no module named 'missing_dep'")),
        FakeEntryPoint("not_callable", 42),
        FakeEntryPoint("shouting", lambda completions, prompts, **_: [0.0] * len(completions)),  # 2nd loses
    ]
    groups: list[str] = []

    def fake_entry_points(*, group: str) -> list[FakeEntryPoint]:
        groups.append(group)
        return entry_points if group == "grpo.rewards" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    available_rewards(refresh=True)
    assert groups == ["grpo.rewards"]
    return entry_points


def test_plugins_are_discovered(plugins: list[FakeEntryPoint]):
    registry = available_rewards()
    assert {"shouting", "prefix"} <= set(registry)
    assert "broken" not in registry and "not_callable" not in registry
    assert registry["shouting"].description == "Fraction of upper-case characters."
    assert registry["prefix"].name == "prefix"
    shout, prefix = bind_rewards(
        [RewardSpec(name="shouting"), RewardSpec(name="prefix", args={"prefix": "A"})], RewardContext()
    )
    assert run(shout, ["AB", "ab"]) == [1.0, 0.0]
    assert prefix.name == "prefix"
    assert run(prefix, ["Ab", "b"]) == [1.0, 0.0]
    catalog = {entry["name"]: entry for entry in reward_catalog()}
    assert catalog["prefix"]["builtin"] is False
    assert catalog["prefix"]["args_schema"]["required"] == ["prefix"]


def test_builtin_wins_over_plugin_of_the_same_name(plugins: list[FakeEntryPoint]):
    exact = bind_one("exact_match")
    assert run(exact, ["ABC"], answer=["x"]) == [0.0]  # the plugin would score this 1.0
    assert available_rewards()["exact_match"].args_model.__name__ == "ExactMatchArgs"


def test_plain_function_plugin_takes_no_args(plugins: list[FakeEntryPoint]):
    error = spec_error([RewardSpec(name="shouting", args={"level": 3})])
    assert error.field == "rewards.0.args"
    assert "takes no args" in error.reason


def test_broken_plugin_says_why_when_requested(plugins: list[FakeEntryPoint]):
    error = spec_error([RewardSpec(name="broken")])
    assert error.field == "rewards.0.name"
    assert "missing_dep" in error.reason
    error = spec_error([RewardSpec(name="not_callable")])
    assert "not a RewardDefinition" in error.reason


def test_plugin_args_errors_use_its_model(plugins: list[FakeEntryPoint]):
    error = spec_error([RewardSpec(name="json_valid"), RewardSpec(name="prefix", args={"prefix": ""})])
    assert error.field == "rewards.1.args.prefix"


def test_refresh_forgets_plugins(plugins: list[FakeEntryPoint]):
    plugins.clear()
    assert "shouting" in available_rewards()  # cached
    assert "shouting" not in available_rewards(refresh=True)


