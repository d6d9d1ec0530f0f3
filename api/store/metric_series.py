"""Metric series of several jobs for a comparison: per job and metric the ``(step, value)``
points from the step records in SQL, thinned evenly in the query when there are more than the
answer may carry, and the names of the numeric metrics the jobs recorded. A metric counts only
where a record has it, so one logged every few steps (an evaluation's) keeps its own points
instead of losing them to a stride over every step. Also a job's last step record and last eval
point (:func:`final_records`), which its final webhook carries; and each listed job's latest eval
reward (:func:`with_eval_rewards`), for a page of jobs in one query."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlalchemy import bindparam, func, or_, select, text
from sqlalchemy.orm import Session

from api.schemas.jobs import JobRead
from api.store.tables import Job, JobMetric
from grpo_core.spec.grpo_config import eval_metrics_of

Points = list[tuple[int, float]]
MAX_METRIC_NAMES_LISTED = 500  # the picker's choices: far more than a record's metrics

# Keys whose value is a JSON number, over every record of the jobs.
_NUMERIC_KEYS = {
    "postgresql": "SELECT DISTINCT e.key FROM job_metrics m, json_each(m.payload) AS e "
                  "WHERE m.job_id IN :ids AND json_typeof(e.value) = 'number' ORDER BY e.key LIMIT :limit",
    "sqlite": "SELECT DISTINCT e.key FROM job_metrics m, json_each(m.payload) AS e "
              "WHERE m.job_id IN :ids AND e.type IN ('integer', 'real') ORDER BY e.key LIMIT :limit",
}


def sampling_stride(count: int, limit: int) -> int:
    """Keeping every ``stride``-th of ``count`` points (the first among them) and the last one
    keeps at most ``limit`` (at least 2) of them, spread evenly."""
    if count <= limit:
        return 1
    if limit < 2:
        raise ValueError("a thinned series keeps at least its first and last point")
    return math.ceil((count - 1) / (limit - 1))


def metric_names(session: Session, job_ids: Sequence[int]) -> list[str]:
    """The numeric metrics any of the jobs recorded, by name (``step`` left out)."""
    dialect = session.get_bind().dialect.name
    query = text(_NUMERIC_KEYS[dialect]).bindparams(bindparam("ids", expanding=True))
    names = session.scalars(query, {"ids": list(job_ids), "limit": MAX_METRIC_NAMES_LISTED})
    return [name for name in names if name != "step"]


def series(session: Session, job_id: int, name: str, limit: int) -> Points:
    """``(step, value)`` of each record of the job holding ``name`` as a finite number, in step
    order; at most ``limit`` of them, evenly spread, the first and last step always kept."""
    value = JobMetric.payload[name].as_string()  # as text: a stray non-number must not fail the cast
    mine = (JobMetric.job_id == job_id, value.is_not(None))
    count = session.scalar(select(func.count()).select_from(JobMetric).where(*mine)) or 0
    stride = sampling_stride(count, limit)
    numbered = select(JobMetric.step.label("step"), value.label("value"),
                      func.row_number().over(order_by=JobMetric.step).label("position")).where(*mine).subquery()
    query = select(numbered.c.step, numbered.c.value).order_by(numbered.c.step)
    if stride > 1:
        query = query.where(or_((numbered.c.position - 1) % stride == 0, numbered.c.position == count))
    return [(step, number) for step, raw in session.execute(query) if (number := _finite(raw)) is not None]


def _finite(raw: object) -> float | None:
    """The number a record holds; ``None`` for text, booleans and NaN or infinities."""
    if isinstance(raw, bool) or raw is None:
        return None
    try:
        number = float(raw)  # type: ignore[arg-type]
    except ValueError:
        return None
    return number if math.isfinite(number) else None


# Every eval point's record holds it (grpo_core.algorithm.eval_metrics); no training step's does.
EVAL_POINT_MARK = "eval_reward"


def final_records(session: Session, job_id: int) -> tuple[dict | None, dict | None]:
    """The job's last step's record and its last eval point's eval metrics, each as the API's
    metric records are (``{"step", "values"}``); None where it has none: what a job's final
    webhook tells of how it ended."""
    newest = (select(JobMetric.step, JobMetric.payload).where(JobMetric.job_id == job_id)
              .order_by(JobMetric.step.desc()).limit(1))
    last = session.execute(newest).first()
    evaluated = session.execute(newest.where(JobMetric.payload[EVAL_POINT_MARK].as_string().is_not(None)))
    point = evaluated.first()
    return (None if last is None else {"step": last.step, "values": last.payload},
            None if point is None else {"step": point.step, "values": eval_metrics_of(point.payload)})


def with_eval_rewards(session: Session, jobs: list[JobRead]) -> list[JobRead]:
    """The jobs with ``eval_reward``: their last eval point's mean reward, None for a job that has
    not evaluated. One query for the whole page: per job, its records read newest step first
    (the ``(job_id, step)`` unique index) down to the first eval point, a few steps at most."""
    if not jobs:
        return jobs
    value = JobMetric.payload[EVAL_POINT_MARK].as_string()
    latest = (select(value).where(JobMetric.job_id == Job.id, value.is_not(None))
              .order_by(JobMetric.step.desc()).limit(1).scalar_subquery())
    found = dict(session.execute(select(Job.id, latest).where(Job.id.in_([job.id for job in jobs]))).all())
    return [job.model_copy(update={"eval_reward": _finite(found.get(job.id))}) for job in jobs]
