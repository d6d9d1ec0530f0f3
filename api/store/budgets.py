"""GPU-hour budgets against the GPU-seconds the allocations record (:mod:`api.store.usage`): each
team's in its current period (``GET /v1/usage``, admission in :mod:`api.store.team_admission`),
a job's own (resume and retry), and the scheduler's pass that pauses what went over.

The pass runs at the start of each scheduler tick, before the plan: a job of a team that used
its period's budget, or one that used its own ``resources.max_gpu_hours``, is paused through
the user's pause path (:func:`api.store.jobs.request_pause`: a running job checkpoints at its
next step and stops, a waiting one rests at once), so it neither runs on nor is dispatched
again; a team's waiting jobs are paused too rather than left queued, since each would start
only to be stopped a tick later. Each pause records a ``budget_reached`` event and the team's
``job.budget`` webhook deliveries in the transaction that pauses it. So a budget may be passed by
what its running jobs use until their next step ends, and by a tick
(``GRPO_SCHEDULER_INTERVAL_SECONDS``). A job paused so stays paused when the period renews or the
budget is raised: its team resumes it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from api.domain.errors import Conflict
from api.domain.lifecycle import WAITING_STATUSES, JobStatus
from api.limits.budgets import (
    TeamBudget,
    check_job_budget,
    hours,
    job_budget_facts,
    job_budget_reached,
    period_bounds,
)
from api.limits.team_limits import effective_team_limits
from api.schemas.admin import TeamLimits
from api.schemas.jobs import JobRead
from api.schemas.usage import BudgetRead
from api.settings import Settings
from api.store.clock import db_now
from api.store.jobs import request_pause
from api.store.tables import Job, Team
from api.store.telemetry import add_event
from api.store.usage import EVER, held_gpu_seconds
from api.store.webhooks import enqueue_budget_event

BUDGET_REACHED = "budget_reached"  # the event a budget's pause records
# What the pass may stop: a job that waits for GPUs or holds them and is not stopping already.
_SPENDING = sorted({*WAITING_STATUSES, JobStatus.DISPATCHED, JobStatus.RUNNING})


class _Limits(NamedTuple):
    team_id: int
    name: str
    limits: TeamLimits  # effective: the deployment's defaults where the team has none of its own


def team_budgets(session: Session, settings: Settings, now: datetime,
                 team_ids: Collection[int] | None = None) -> list[TeamBudget]:
    """Every team's budget (or those of ``team_ids``) in its period holding ``now``, by team name;
    a team with none has ``budget_hours`` None and its use in the period all the same."""
    return _with_use(session, _team_limits(session, settings, team_ids), now)


def _team_limits(session: Session, settings: Settings, team_ids: Collection[int] | None = None,
                 ) -> list[_Limits]:
    query = select(Team.id, Team.name, Team.limits).order_by(Team.name)
    if team_ids is not None:
        query = query.where(Team.id.in_(list(team_ids)))
    return [_Limits(team_id, name, effective_team_limits(TeamLimits.model_validate(limits or {}), settings))
            for team_id, name, limits in session.execute(query)]


def _with_use(session: Session, teams: list[_Limits], now: datetime) -> list[TeamBudget]:
    bounds = {team_id: period_bounds(limits.budget_period or "month", now) for team_id, _, limits in teams}
    used = held_gpu_seconds(session, "team", {team_id: start for team_id, (start, _) in bounds.items()}, now)
    return [TeamBudget(team_id, name, limits.gpu_hours_budget, limits.budget_period or "month",
                       *bounds[team_id], used[team_id]) for team_id, name, limits in teams]


def budget_read(budget: TeamBudget) -> BudgetRead:
    return BudgetRead(team=budget.team, gpu_hours_budget=budget.budget_hours, period=budget.period,
                      period_start=budget.start, period_end=budget.end,
                      used_gpu_hours=hours(budget.used_seconds), left_gpu_hours=budget.left_hours)


def check_job_budget_left(session: Session, job: JobRead) -> None:
    """:class:`~api.domain.errors.BudgetExhausted` naming ``resources.max_gpu_hours`` when the job
    has used its own budget (a resume or retry of it would be paused again at once)."""
    limit = job.spec.get("resources", {}).get("max_gpu_hours")
    if limit is not None:
        used = held_gpu_seconds(session, "job", {job.id: EVER}, db_now(session))[job.id]
        check_job_budget(job.id, limit, used)


def pause_over_budget(session: Session, settings: Settings) -> list[int]:
    """The scheduler's pass: pause every spending job of a team over its period's budget and every
    one over its own; the ids paused (or asked to pause), each with its event and deliveries."""
    # Cheap when nobody has a budget: the teams' limits (a few rows) are read every tick; jobs only
    # where a budget applies to them, and allocations only for those jobs and their teams.
    budgeted = {team.team_id: team for team in _team_limits(session, settings)
                if team.limits.gpu_hours_budget is not None}
    rows = session.execute(
        select(Job.id, Job.team_id, Job.max_gpu_hours)
        .where(Job.status.in_(_SPENDING), Job.deleted_at.is_(None),
               or_(Job.max_gpu_hours.is_not(None), Job.team_id.in_(list(budgeted))))
    ).all()
    if not rows:
        return []
    now = db_now(session)
    spending = [budgeted[team_id] for team_id in sorted({row.team_id for row in rows}) if team_id in budgeted]
    over_teams = {team.team_id: team for team in _with_use(session, spending, now) if team.reached}
    own = [row for row in rows if row.team_id not in over_teams and row.max_gpu_hours is not None]
    used = held_gpu_seconds(session, "job", dict.fromkeys((row.id for row in own), EVER), now)
    stops = [(row.id, over_teams[row.team_id].facts()) for row in rows if row.team_id in over_teams]
    stops += [(row.id, job_budget_facts(row.max_gpu_hours, used[row.id]))
              for row in own if job_budget_reached(row.max_gpu_hours, used[row.id])]
    return [job_id for job_id, facts in stops if _pause(session, job_id, facts)]


def _pause(session: Session, job_id: int, facts: dict[str, Any]) -> bool:
    """Pause the job for the budget ``facts`` describe; False when it ended or moved meanwhile."""
    whose = f"team {facts['team']}'s {facts['period']}" if facts["budget"] == "team" else "its own"
    why = (f"{whose} GPU-hour budget is used up ({facts['used_gpu_hours']:.4g} of "
           f"{facts['limit_gpu_hours']:.4g})")
    try:
        request_pause(session, job_id, why=why, data=facts)
    except Conflict:  # it finished (or was cancelled) since it was read: nothing left to pause
        return False
    add_event(session, job_id, BUDGET_REACHED, f"paused: {why}", facts, "warning")
    enqueue_budget_event(session, job_id, facts)
    return True
