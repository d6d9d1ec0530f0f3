"""GPU-hour budgets, pure: a team's for each calendar period (``team.gpu_hours_budget``, by
:class:`api.schemas.admin.TeamLimits`) and a job's own (``resources.max_gpu_hours``), the
period's bounds, what is left, and the refusals. The store counts the GPU-seconds from the
allocations (:mod:`api.store.usage`) and asks these; the scheduler pauses the jobs they say are
over (:mod:`api.store.budgets`), and admission refuses more (:mod:`api.store.team_admission`).

Periods are calendar periods in UTC, so every process and every reader agrees on them whatever
its time zone: a day from 00:00, a week from Monday 00:00, a month from its 1st.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from api.domain.errors import BudgetExhausted
from api.schemas.usage import SECONDS_PER_HOUR
from api.vocabulary import BudgetPeriod

TEAM_BUDGET_PARAM = "team.gpu_hours_budget"
JOB_BUDGET_PARAM = "resources.max_gpu_hours"

# Each period's first instant from the midnight that starts ``now``'s day, and the next period's
# from that (32 days past a month's 1st is always in the next month).
_STARTS: dict[str, Callable[[datetime], datetime]] = {
    "day": lambda midnight: midnight,
    "week": lambda midnight: midnight - timedelta(days=midnight.weekday()),
    "month": lambda midnight: midnight.replace(day=1),
}
_NEXT: dict[str, Callable[[datetime], datetime]] = {
    "day": lambda start: start + timedelta(days=1),
    "week": lambda start: start + timedelta(days=7),
    "month": lambda start: (start + timedelta(days=32)).replace(day=1),
}


def period_bounds(period: BudgetPeriod, now: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` of the calendar period (UTC) holding ``now`` (an aware datetime)."""
    moment = now.astimezone(UTC)
    start = _STARTS[period](datetime(moment.year, moment.month, moment.day, tzinfo=UTC))
    return start, _NEXT[period](start)


def hours(seconds: float) -> float:
    return seconds / SECONDS_PER_HOUR


@dataclass(frozen=True)
class TeamBudget:
    """A team's budget in its current period and what its jobs used of it so far."""

    team_id: int
    team: str
    budget_hours: float | None  # None: no budget
    period: BudgetPeriod
    start: datetime
    end: datetime
    used_seconds: float

    @property
    def left_hours(self) -> float | None:
        if self.budget_hours is None:
            return None
        return max(0.0, self.budget_hours - hours(self.used_seconds))

    @property
    def reached(self) -> bool:
        return self.budget_hours is not None and hours(self.used_seconds) >= self.budget_hours

    def facts(self) -> dict[str, object]:
        """What an event or a webhook says of it."""
        return {"budget": "team", "team": self.team, "used_gpu_hours": hours(self.used_seconds),
                "limit_gpu_hours": self.budget_hours, "period": self.period,
                "period_end": self.end.isoformat()}


def check_team_budget(budget: TeamBudget) -> None:
    """:class:`BudgetExhausted` naming ``team.gpu_hours_budget`` when the team has used its
    period's GPU-hours: nothing more of its may start until the next period or a higher budget."""
    if budget.reached:
        raise BudgetExhausted(
            f"your team used {hours(budget.used_seconds):.4g} of its {budget.budget_hours:.4g} GPU-hours "
            f"this {budget.period} (the next starts {budget.end:%Y-%m-%d %H:%M} UTC); ask an admin to raise "
            f"{TEAM_BUDGET_PARAM}, or wait for the next {budget.period}", param=TEAM_BUDGET_PARAM)


def job_budget_reached(max_gpu_hours: float | None, used_seconds: float) -> bool:
    return max_gpu_hours is not None and hours(used_seconds) >= max_gpu_hours


def job_budget_facts(max_gpu_hours: float, used_seconds: float) -> dict[str, object]:
    """What an event or a webhook says of a job's own budget."""
    return {"budget": "job", "used_gpu_hours": hours(used_seconds), "limit_gpu_hours": max_gpu_hours}


def check_job_budget(job_id: int, max_gpu_hours: float | None, used_seconds: float) -> None:
    """:class:`BudgetExhausted` naming ``resources.max_gpu_hours`` when the job has used its own
    budget: it would only be paused again at its next step."""
    if job_budget_reached(max_gpu_hours, used_seconds):
        raise BudgetExhausted(
            f"job {job_id} used {hours(used_seconds):.4g} of its {max_gpu_hours:.4g} GPU-hours "
            f"({JOB_BUDGET_PARAM}); raise it first (PATCH /v1/jobs/{job_id} with max_gpu_hours, or "
            f"grpo set-budget {job_id} HOURS)", param=JOB_BUDGET_PARAM)
