"""The ``alerts:`` section of a spec: the health rules a run checks on each step's metrics, what
each means, its conservative default, and what a tripped rule does (``notify``, ``pause``,
``stop``, or ``off``).

Pure data and pydantic, no torch: the API checks a spec's overrides at submit and explains each
rule in words (``GET /v1/codes``, :data:`api.domain.explanations.ALERT_RULES`); the evaluator is
:mod:`grpo_core.run.health`. A spec lists only the rules it changes: every rule not listed runs
with its :data:`DEFAULTS`, and a listed rule's omitted fields keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AlertRule = Literal["entropy_collapse", "kl_blowup", "no_signal", "length_runaway", "reward_hacking",
                    "grader_failures", "grad_explosion"]
# notify: an alert event (and a job.alert webhook, a badge); pause: also checkpoint and pause the job
# (a person looks, then resumes or clones it); stop: also end it, cancelled with the rule as its code;
# off: the rule is not checked.
AlertAction = Literal["notify", "pause", "stop", "off"]
# What a stop and a pause become for the run's owner: the job's ending.
STOPPING_ACTIONS = ("pause", "stop")

# A rule's default KL or grad-norm multiple of its running median that counts as a blow-up.
MEDIAN_MULTIPLE = 10.0


@dataclass(frozen=True)
class RuleDefault:
    threshold: float | None
    window: int
    action: AlertAction


# Conservative: each says something only when training has clearly gone wrong, and only notifies.
DEFAULTS: dict[str, RuleDefault] = {
    "entropy_collapse": RuleDefault(0.1, 10, "notify"),
    "kl_blowup": RuleDefault(1.0, 20, "notify"),
    "no_signal": RuleDefault(0.95, 10, "notify"),
    "length_runaway": RuleDefault(0.5, 10, "notify"),
    "reward_hacking": RuleDefault(0.0, 3, "notify"),
    "grader_failures": RuleDefault(0.1, 3, "notify"),
    "grad_explosion": RuleDefault(None, 20, "notify"),
}

ALERT_RULES: tuple[str, ...] = tuple(DEFAULTS)


class AlertSpec(BaseModel):
    """One rule's override: its threshold, window or action; an omitted field keeps the default."""

    model_config = ConfigDict(extra="forbid")

    rule: AlertRule = Field(..., description="The health rule: " + ", ".join(ALERT_RULES))
    threshold: float | None = Field(None, ge=0.0, le=1e12, allow_inf_nan=False,
                                    description="The rule's threshold (its meaning is the rule's: GET "
                                                "/v1/codes); omitted: the rule's default")
    window: int | None = Field(None, ge=1, le=10_000, description="Steps (reward_hacking: evaluations) "
                               "the condition must hold, or the history it is measured over; omitted: "
                               "the rule's default")
    action: AlertAction | None = Field(None, description="What a trip does: notify (an alert event, a "
                                       "job.alert webhook, a badge), pause (checkpoint and pause), stop "
                                       "(end the job, cancelled with the rule as its code), off (not "
                                       "checked); omitted: the rule's default (notify)")


@dataclass(frozen=True)
class ResolvedRule:
    """A rule as a run checks it: its defaults with the spec's override on top."""

    rule: str
    threshold: float | None
    window: int
    action: str


def resolved_rules(overrides: list[AlertSpec]) -> list[ResolvedRule]:
    """Every rule, in :data:`ALERT_RULES` order, with ``overrides`` applied; ``off`` rules left out."""
    given = {override.rule: override for override in overrides}
    rules = []
    for name, default in DEFAULTS.items():
        override = given.get(name)
        threshold, window, action = default.threshold, default.window, default.action
        if override is not None:
            threshold = default.threshold if override.threshold is None else override.threshold
            window = default.window if override.window is None else override.window
            action = default.action if override.action is None else override.action
        if action != "off":
            rules.append(ResolvedRule(name, threshold, window, action))
    return rules
