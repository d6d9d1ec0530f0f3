"""The health rules (:mod:`grpo_core.spec.alerts`) checked on each step's metrics record, where
the numbers are made: the trainer hands every record to :meth:`HealthWatch.observe`, which answers
the alerts that tripped at that step.

A rule *trips* once when its condition starts to hold (for its window, where it has one) and stays
quiet while it goes on holding; it is armed again by a step where it does not hold. So a job paused
by a rule and resumed by a person who looked does not trip again on the very next step, yet a
problem that clears and comes back is told again. The watch's state (windows, streaks, what has
tripped) is part of the checkpoint (:meth:`HealthWatch.state_dict`), so a resumed run goes on from
where it was. Pure Python on plain numbers: every rank sees the same record and decides the same.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from grpo_core.spec.alerts import MEDIAN_MULTIPLE, STOPPING_ACTIONS, AlertSpec, ResolvedRule, resolved_rules

# The record's names each rule reads (docs/architecture.md §5).
ENTROPY, KL, ZERO_STD, CLIPPED = "entropy", "kl", "frac_reward_zero_std", "completions/clipped_ratio"
REWARD, EVAL_REWARD, GRAD_NORM = "reward", "eval_reward", "grad_norm"
UNSCORED = "rewards/unscored_ratio"
# The stronger action wins when several rules trip at one step.
_ACTION_STRENGTH = {"notify": 0, "pause": 1, "stop": 2}


@dataclass(frozen=True)
class Alert:
    """A rule that tripped at ``step``: the value that tripped it and what the rule does."""

    rule: str
    action: str
    step: int
    value: float | None
    threshold: float | None
    window: int
    message: str

    def data(self) -> dict[str, Any]:
        return asdict(self)


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


class HealthWatch:
    """Checks ``rules`` (an ``alerts:`` list resolved over the defaults) on each record."""

    def __init__(self, overrides: list[AlertSpec], state: dict[str, Any] | None = None) -> None:
        self.rules: list[ResolvedRule] = resolved_rules(overrides)
        self.state: dict[str, dict[str, Any]] = {rule.rule: {} for rule in self.rules}
        for name, saved in (state or {}).items():
            if name in self.state:
                self.state[name] = dict(saved)

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe: it is written into the checkpoint's trainer state."""
        return {name: dict(state) for name, state in self.state.items()}

    def observe(self, record: dict[str, Any]) -> list[Alert]:
        """The alerts that trip at this record's step (often none)."""
        alerts = []
        for rule in self.rules:
            state = self.state[rule.rule]
            verdict = _CHECKS[rule.rule](rule, record, state)
            if verdict is None:  # the record has nothing this rule reads: nothing changes
                continue
            holds, value, why = verdict
            if not holds:
                state["tripped"] = False
                continue
            if state.get("tripped"):
                continue
            state["tripped"] = True
            step = int(record["step"])
            message = f"{rule.rule} at step {step}: {why}"
            alerts.append(Alert(rule.rule, rule.action, step, value, rule.threshold, rule.window, message))
        return alerts


def strongest(alerts: list[Alert]) -> Alert | None:
    """The alert whose action ends the run (``pause`` or ``stop``, the stronger), or None."""
    stopping = [alert for alert in alerts if alert.action in STOPPING_ACTIONS]
    return max(stopping, key=lambda alert: _ACTION_STRENGTH[alert.action], default=None)


Verdict = tuple[bool, float | None, str] | None


def _streak(state: dict[str, Any], holds: bool, window: int) -> bool:
    """Whether the condition has held for ``window`` steps in a row, counting this one."""
    state["streak"] = state.get("streak", 0) + 1 if holds else 0
    return state["streak"] >= window


def _fraction_streak(name: str, what: str, at_least: bool = False) -> Callable[..., Verdict]:
    """A rule on a fraction in the record over its threshold for ``window`` steps in a row."""

    def check(rule: ResolvedRule, record: dict[str, Any], state: dict[str, Any]) -> Verdict:
        value = _finite(record.get(name))
        if value is None:
            return None
        over = value >= rule.threshold if at_least else value > rule.threshold
        holds = _streak(state, over, rule.window)
        return holds, value, (f"{what} {value:.3g} {'>=' if at_least else '>'} {rule.threshold:g} for "
                              f"{rule.window} step(s) in a row")

    return check


def _entropy_collapse(rule: ResolvedRule, record: dict[str, Any], state: dict[str, Any]) -> Verdict:
    value = _finite(record.get(ENTROPY))
    if value is None:
        return None
    if state.get("early_steps", 0) < rule.window:  # still measuring its early value
        state["early_sum"] = state.get("early_sum", 0.0) + value
        state["early_steps"] = state.get("early_steps", 0) + 1
        return False, value, ""
    early = state["early_sum"] / state["early_steps"]
    floor = rule.threshold * early
    holds = _streak(state, early > 0 and value < floor, rule.window)
    return holds, value, (f"entropy {value:.3g} below {rule.threshold:g} x its early value {early:.3g} for "
                          f"{rule.window} step(s) in a row")


def _running_away(name: str, what: str) -> Callable[..., Verdict]:
    """A rule on a value that must stay finite, under its threshold (when set) and under
    :data:`MEDIAN_MULTIPLE` times its median over the previous ``window`` steps."""

    def check(rule: ResolvedRule, record: dict[str, Any], state: dict[str, Any]) -> Verdict:
        raw = record.get(name)
        if not isinstance(raw, int | float):
            return None
        value = _finite(raw)
        if value is None:
            return True, None, f"{what} is {raw}"
        history: list[float] = state.setdefault("history", [])
        median = statistics.median(history) if len(history) >= rule.window else None
        state["history"] = [*history, value][-rule.window:]
        if rule.threshold is not None and value > rule.threshold:
            return True, value, f"{what} {value:.3g} > {rule.threshold:g}"
        if median is not None and median > 0 and value > MEDIAN_MULTIPLE * median:
            return True, value, (f"{what} {value:.3g} > {MEDIAN_MULTIPLE:g} x its median {median:.3g} over "
                                 f"the previous {rule.window} step(s)")
        return False, value, ""

    return check


def _slope(values: list[float]) -> float:
    """The least-squares slope of ``values`` against 0, 1, 2, ..."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    spread = sum((x - mean_x) ** 2 for x in range(n))
    return sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / spread


def _reward_hacking(rule: ResolvedRule, record: dict[str, Any], state: dict[str, Any]) -> Verdict:
    """At each eval point, the mean training reward since the previous one beside the eval reward;
    over the last ``window`` of them (at least 2) the first trending up and the second down."""
    train = _finite(record.get(REWARD))
    if train is not None:
        state["train_sum"] = state.get("train_sum", 0.0) + train
        state["train_steps"] = state.get("train_steps", 0) + 1
    evaluated = _finite(record.get(EVAL_REWARD))
    if evaluated is None or not state.get("train_steps"):
        return None  # not an eval point (or one before any training: step 0)
    points = [*state.get("points", []), [state["train_sum"] / state["train_steps"], evaluated]]
    window = max(rule.window, 2)
    state.update(points=points[-window:], train_sum=0.0, train_steps=0)
    if len(state["points"]) < window:
        return False, evaluated, ""
    trains, evals = [p[0] for p in state["points"]], [p[1] for p in state["points"]]
    fall = evals[0] - evals[-1]
    holds = _slope(trains) > 0 and _slope(evals) < 0 and fall > rule.threshold
    return holds, evaluated, (f"over the last {window} evaluations the training reward rose "
                              f"({trains[0]:.3g} -> {trains[-1]:.3g}) while eval_reward fell "
                              f"({evals[0]:.3g} -> {evals[-1]:.3g})")


_CHECKS: dict[str, Callable[[ResolvedRule, dict[str, Any], dict[str, Any]], Verdict]] = {
    "entropy_collapse": _entropy_collapse,
    "kl_blowup": _running_away(KL, "kl"),
    "no_signal": _fraction_streak(ZERO_STD, "frac_reward_zero_std", at_least=True),
    "length_runaway": _fraction_streak(CLIPPED, "completions/clipped_ratio"),
    "reward_hacking": _reward_hacking,
    "grader_failures": _fraction_streak(UNSCORED, "the unscored-row ratio"),
    "grad_explosion": _running_away(GRAD_NORM, "grad_norm"),
}
