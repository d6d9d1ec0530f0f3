"""Whether a team may put one more job in the queue, and at which priority: the reads and the
count behind :mod:`api.limits.team_limits` and its GPU-hour budget (:mod:`api.store.budgets`), run
in the transaction that queues the job (a submit, a clone, a retry, a resume), after its write, so
a refusal rolls the write back.

The count includes the job just queued, and it is taken holding the team's row (``FOR NO KEY
UPDATE``, which dispatch's foreign-key checks on the row do not wait for): concurrent admissions
of one team take turns, each counting the others' committed jobs, so the cap holds exactly. On
SQLite, which has no row locks, the write before the count holds the database's one write lock
to the commit, with the same effect.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from api.domain.errors import NotFound, QueueFull
from api.domain.job_spec import JobSpec
from api.domain.lifecycle import WAITING_STATUSES
from api.limits.budgets import check_team_budget
from api.limits.team_limits import check_priority, default_priority, effective_team_limits
from api.schemas.admin import TeamLimits
from api.settings import Settings
from api.store.budgets import team_budgets
from api.store.clock import db_now
from api.store.tables import Job, Team

_LIMITS = select(Team.limits).where(Team.id == bindparam("team"))
_LIMITS_LOCKED = _LIMITS.with_for_update(key_share=True)
_WAITING = (select(func.count()).select_from(Job)
            .where(Job.team_id == bindparam("team"), Job.status.in_(WAITING_STATUSES)))


def team_limits(session: Session, team_id: int, settings: Settings, *, lock: bool = False) -> TeamLimits:
    """The team's limits, every field set (defaults filled in); ``lock`` holds its row until the
    transaction ends."""
    row = session.execute(_LIMITS_LOCKED if lock else _LIMITS, {"team": team_id}).first()
    if row is None:
        raise NotFound(f"team {team_id} not found", param="team")
    return effective_team_limits(TeamLimits.model_validate(row.limits or {}), settings)


def admit(session: Session, team_id: int, priority: str, settings: Settings, *, member: bool) -> None:
    """Call after queuing one of the team's jobs at ``priority``, in the same transaction:
    :class:`~api.domain.errors.InvalidInput` naming ``priority`` when a member (``member``) asked for a
    class above the team's highest, :class:`~api.domain.errors.BudgetExhausted` naming
    ``team.gpu_hours_budget`` when the team has used its period's GPU-hours (admins too: it bounds
    what the team spends), :class:`~api.domain.errors.QueueFull` when the team now has more jobs
    waiting than its ``max_queued_jobs``."""
    limits = team_limits(session, team_id, settings, lock=True)
    if member:
        check_priority(priority, str(limits.max_priority))
    if limits.gpu_hours_budget is not None:  # read only where there is one: a period's allocations
        [budget] = team_budgets(session, settings, db_now(session), [team_id])
        check_team_budget(budget)
    waiting = session.scalar(_WAITING, {"team": team_id}) or 0
    cap = int(limits.max_queued_jobs or 0)
    if waiting > cap:
        raise QueueFull(f"your team has {waiting - 1} jobs waiting in the queue, its limit "
                        f"(max_queued_jobs = {cap}); cancel some or wait until they start, or ask an "
                        "admin to raise it", param="max_queued_jobs")


def with_team_priority(session: Session, team_id: int, spec: JobSpec, settings: Settings) -> JobSpec:
    """A spec that names no priority gets the team's default class (:func:`default_priority`);
    one that names it is left as it is, for :func:`admit` to judge."""
    if "priority" in spec.model_fields_set:
        return spec
    chosen = default_priority(str(team_limits(session, team_id, settings).max_priority))
    return spec if chosen == spec.priority else spec.model_copy(update={"priority": chosen})
