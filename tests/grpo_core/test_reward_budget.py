"""Every reward call runs under a time budget (issue 12, Why 1): a regex that backtracks
catastrophically stops at the budget (the ``regex`` package's timeout), a plugin that sleeps is
no longer waited for, and either way the call's rows are unscorable (NaN) and the reward is named
as timed out, while the other rewards of the batch are scored as usual."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from grpo_core.errors import RewardTimeout
from grpo_core.rewards import BoundReward, RewardContext, bind_rewards, score_completions
from grpo_core.spec.run_spec import RewardSpec

# The pattern from the finding: exponential in the text's length, and `re` would hold the GIL.
CATASTROPHIC = "(?s)(.|.)*(?!)"
TEXTS = ["yes " * 12, "no " * 12]


def test_a_catastrophic_regex_stops_at_its_budget_and_its_rows_are_unscorable():
    [slow] = bind_rewards([RewardSpec(name="regex_match", args={"pattern": CATASTROPHIC})],
                          RewardContext(timeout_seconds=0.2))
    [fast] = bind_rewards([RewardSpec(name="contains", args={"text": "yes"})],
                          RewardContext(timeout_seconds=5))
    started = time.monotonic()
    scores = score_completions([slow, fast], TEXTS, ["p", "p"], {})
    assert scores.timed_out == ["regex_match"]
    assert all(math.isnan(row[0]) for row in scores.matrix)
    assert [row[1] for row in scores.matrix] == [1.0, 0.0]
    # 2**48 steps would take years; the budget (plus thread start-up) bounds it.
    assert time.monotonic() - started < 30


def test_the_regex_engine_itself_stops_so_no_thread_is_left_spinning():
    [slow] = bind_rewards([RewardSpec(name="regex_match", args={"pattern": CATASTROPHIC})],
                          RewardContext(timeout_seconds=0.2))
    with pytest.raises(RewardTimeout, match="regex_match took over 0.2 s"):
        slow.fn(TEXTS, ["p", "p"])  # called directly, in this thread: only the engine can stop it


def test_a_regex_within_its_budget_scores_as_before():
    [bound] = bind_rewards([RewardSpec(name="regex_match", args={"pattern": r"^yes"})],
                           RewardContext(timeout_seconds=5))
    scores = score_completions([bound], TEXTS, ["p", "p"], {})
    assert (scores.matrix, scores.timed_out) == ([[1.0], [0.0]], [])


def test_a_plugin_that_does_not_return_in_time_is_left_behind():
    release = threading.Event()

    def sleepy(completions: list[str], prompts: list[str], **columns: Any) -> list[float]:
        release.wait(30)  # releases the GIL, as a plugin waiting on I/O would
        return [1.0] * len(completions)

    try:
        scores = score_completions([BoundReward("sleepy", 1.0, sleepy, timeout_seconds=0.2)], TEXTS,
                                   ["p", "p"], {})
    finally:
        release.set()
    assert scores.timed_out == ["sleepy"]
    assert all(math.isnan(row[0]) for row in scores.matrix)


def test_without_a_budget_a_reward_is_called_in_the_callers_thread():
    threads: list[str] = []

    def where(completions: list[str], prompts: list[str], **columns: Any) -> list[float]:
        threads.append(threading.current_thread().name)
        return [0.5] * len(completions)

    assert score_completions([BoundReward("where", 1.0, where)], ["a"], ["p"], {}).matrix == [[0.5]]
    assert threads == [threading.current_thread().name]
