"""GPU-seconds each team used per pool over a window, from the allocations the job transitions
already record (``api.store.tables.Allocation``: one row per stretch of GPUs a job held); those
each job or team held since a moment, for its GPU-hour budget (:mod:`api.store.budgets`); and a
pool's latest succeeded jobs as an estimate measures its throughput on them (:func:`pool_history`).

Exact interval arithmetic: an allocation of ``g`` GPUs held over ``[start, end]`` (``end``: now
while it is still open) counts ``g x`` the seconds that stretch overlaps ``[since, until)``.
The sum is done in Python on ``timedelta``s (whole microseconds, so no rounding builds up) over
the rows that overlap the window, which the ``(pool, ended_at)`` index narrows; it reads the same
on Postgres and SQLite, which share no function for the seconds between two timestamps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from api.domain.lifecycle import JobStatus
from api.domain.serve_spec import TRAIN
from api.limits.gpu_estimate import PastRun
from api.schemas.jobs import as_utc
from api.store.tables import Allocation, Job, JobMetric, Team

__all__ = ["EVER", "TeamPoolUsage", "gpu_usage", "held_gpu_seconds", "overlap", "pool_history"]

EVER = datetime(1970, 1, 1, tzinfo=UTC)  # a ``since`` before any allocation: a job's whole life


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


def held_gpu_seconds(session: Session, by: Literal["job", "team"], since: Mapping[int, datetime],
                     now: datetime) -> dict[int, float]:
    """GPU-seconds each job (``by="job"``) or team held from its own ``since`` to ``now`` (the
    database's clock; an open allocation counts up to it): what a budget is checked against.
    Every key of ``since`` is answered, 0 when it held nothing. One query, from the earliest
    ``since``."""
    if not since:
        return {}
    key = Allocation.job_id if by == "job" else Allocation.team_id
    query = (select(key, Allocation.gpus, Allocation.started_at, Allocation.ended_at)
             .where(key.in_(list(since)), Allocation.started_at < now,
                    or_(Allocation.ended_at.is_(None), Allocation.ended_at > min(since.values()))))
    totals = dict.fromkeys(since, timedelta(0))
    for owner, gpus, started_at, ended_at in session.execute(query):
        end = as_utc(ended_at) if ended_at is not None else now
        totals[owner] += gpus * overlap(as_utc(started_at), end, since[owner], now)
    return {owner: held.total_seconds() for owner, held in totals.items()}


THROUGHPUT_JOBS = 20  # the latest succeeded jobs of a pool a throughput is measured on


def pool_history(session: Session, pool: str, now: datetime) -> list[PastRun]:
    """The pool's latest :data:`THROUGHPUT_JOBS` training jobs that succeeded in one attempt (a
    resumed job's records span its pause), as :func:`api.limits.gpu_estimate.measured` reads them:
    the GPU-seconds they held, their ``num_tokens`` at their first and last step records and the
    time between those. A deleted job's metrics are gone, so it is not among them."""
    recent = (select(Job.id, Job.gpus)
              .where(Job.pool == pool, Job.kind == TRAIN, Job.status == JobStatus.SUCCEEDED,
                     Job.deleted_at.is_(None), Job.attempt == 1)
              .order_by(Job.finished_at.desc(), Job.id.desc()).limit(THROUGHPUT_JOBS))
    gpus: dict[int, int] = {job_id: count for job_id, count in session.execute(recent)}
    steps = (select(JobMetric.job_id, func.min(JobMetric.step).label("first"),
                    func.max(JobMetric.step).label("last"))
             .where(JobMetric.job_id.in_(list(gpus)), JobMetric.step >= 1)
             .group_by(JobMetric.job_id).subquery())
    tokens = JobMetric.payload["num_tokens"].as_string()  # as text, as api.store.metric_series reads
    ends = session.execute(
        select(JobMetric.job_id, JobMetric.step == steps.c.last, JobMetric.ts, tokens)
        .join(steps, and_(JobMetric.job_id == steps.c.job_id,
                          or_(JobMetric.step == steps.c.first, JobMetric.step == steps.c.last))))
    # (job, is its last record) -> (when it was written, num_tokens); a job of one record has it twice.
    records = {(job_id, bool(last)): (as_utc(ts), _count(raw)) for job_id, last, ts, raw in ends}
    held = held_gpu_seconds(session, "job", dict.fromkeys(gpus, EVER), now)
    runs = []
    for job_id, count in gpus.items():
        if (job_id, True) not in records:  # no step record: nothing trained
            continue
        end, last = records[(job_id, True)]
        start, first = records.get((job_id, False), (end, last))
        runs.append(PastRun(gpus=count, held_gpu_seconds=held[job_id], tokens=last,
                            steady_tokens=last - first, steady_seconds=(end - start).total_seconds()))
    return runs


def _count(raw: object) -> float:
    """A stored ``num_tokens``: a finite number; anything else (a record without it) counts none."""
    try:
        count = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return count if math.isfinite(count) else 0.0
