"""``GET /v1/usage``'s answer: GPU-seconds each team used per pool over a window (the
arithmetic is :mod:`api.store.usage`'s) and what each team has left of its GPU-hour budget in its
current period (:mod:`api.limits.budgets`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from api.schemas.jobs import UtcDatetime
from api.vocabulary import BudgetPeriod

SECONDS_PER_HOUR = 3600


class UsageItem(BaseModel):
    team: str
    pool: str
    gpu_seconds: float  # the sum over its allocations of GPUs x seconds held inside the window
    gpu_hours: float  # gpu_seconds / 3600


class BudgetRead(BaseModel):
    """A team's GPU-hour budget in its current period, whatever window the usage was asked for."""

    team: str
    gpu_hours_budget: float | None = Field(description="GPU-hours the team may use each period, all pools "
                                           "together (null: no budget)")
    period: BudgetPeriod = Field(description="The calendar period (UTC) the budget renews each")
    period_start: UtcDatetime
    period_end: UtcDatetime = Field(description="When the next period starts, and the budget with it")
    used_gpu_hours: float = Field(description="GPUs × hours the team's jobs held since period_start")
    left_gpu_hours: float | None = Field(description="gpu_hours_budget - used_gpu_hours, never below 0 "
                                         "(null: no budget). At 0 the team's jobs are paused and new ones "
                                         "refused (422 `budget_exhausted`) until the next period")


class UsageView(BaseModel):
    since: UtcDatetime  # the window is [since, until)
    until: UtcDatetime
    items: list[UsageItem]  # by team, then pool; only pairs with some use in the window
    budgets: list[BudgetRead] = Field(default_factory=list, description="Each team the caller may see (a "
                                      "member: its own), by name: its budget in its current period")
