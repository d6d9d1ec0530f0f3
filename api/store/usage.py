"""GPU-seconds each team used per pool over a window, from the allocations the job transitions
already record (``api.store.tables.Allocation``: one row per stretch of GPUs a job held).

Exact interval arithmetic: an allocation of ``g`` GPUs held over ``[start, end]`` (``end``: now
while it is still open) counts ``g x`` the seconds that stretch overlaps ``[since, until)``.
The sum is done in Python on ``timedelta``s (whole microseconds, so no rounding builds up) over
the rows that overlap the window, which the ``(pool, ended_at)`` index narrows; it reads the same
on Postgres and SQLite, which share no function for the seconds between two timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from api.schemas.jobs import as_utc
from api.store.tables import Allocation, Team

__all__ = ["TeamPoolUsage", "gpu_usage", "overlap"]


@dataclass(frozen=True)
class TeamPoolUsage:
    team: str
    pool: str
    gpu_seconds: float


def overlap(start: datetime, end: datetime, since: datetime, until: datetime) -> timedelta:
    """How much of ``[start, end]`` lies inside ``[since, until)`` (zero when they do not meet)."""
    return max(timedelta(0), min(end, until) - max(start, since))


def gpu_usage(session: Session, since: datetime, until: datetime, now: datetime,
              team_id: int | None = None) -> list[TeamPoolUsage]:
    """Per (team, pool) with any use in ``[since, until)``, sorted by team then pool; an open
    allocation counts up to ``now`` (the database's clock). ``team_id``: that team's rows only.
    Every argument is an aware datetime."""
    query = (
        select(Team.name, Allocation.pool, Allocation.gpus, Allocation.started_at, Allocation.ended_at)
        .join(Team, Team.id == Allocation.team_id)
        .where(Allocation.started_at < until,
               or_(Allocation.ended_at.is_(None), Allocation.ended_at > since))
    )
    if team_id is not None:
        query = query.where(Allocation.team_id == team_id)
    totals: dict[tuple[str, str], timedelta] = {}
    for team, pool, gpus, started_at, ended_at in session.execute(query):
        end = as_utc(ended_at) if ended_at is not None else now
        held = overlap(as_utc(started_at), end, since, until)
        if held > timedelta(0):
            totals[(team, pool)] = totals.get((team, pool), timedelta(0)) + gpus * held
    return [TeamPoolUsage(team, pool, used.total_seconds()) for (team, pool), used in sorted(totals.items())]
