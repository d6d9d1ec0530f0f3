"""Events, per-step metrics, samples and checkpoints of a job. Writes are idempotent per
``(job_id, step)`` (an event: per its timestamp, :func:`add_event_once`) so a retried worker
write never duplicates a step."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from api.artifacts.paths import Published
from api.domain.lifecycle import JobStatus
from api.schemas.jobs import CheckpointRead, EventRead, MetricRead, SamplesRead
from api.store import outbox
from api.store._rows import dialect_insert, insert_ignoring_duplicates
from api.store.tables import Checkpoint, Job, JobEvent, JobMetric, JobSample, utcnow
from api.store.webhooks import enqueue_eval_event
from api.vocabulary import BEFORE_FIRST_STEP
from grpo_core.spec.grpo_config import eval_metrics_of


def add_event(
    session: Session,
    job_id: int,
    type: str,
    message: str = "",  # noqa: A002
    data: dict[str, Any] | None = None,
    level: str = "info",
    ts: datetime | None = None,
) -> EventRead:
    event = JobEvent(job_id=job_id, type=type, message=message, data=data or {}, level=level,
                     ts=ts or utcnow())
    session.add(event)
    session.flush()
    read = EventRead.model_validate(event, from_attributes=True)
    outbox.stage(session, job_id, "event", read.model_dump(mode="json"))  # with its row id: de-duplicable
    return read


def add_event_once(session: Session, job_id: int, type: str, message: str,  # noqa: A002
                   data: dict[str, Any], ts: datetime, level: str = "info") -> bool:
    """:func:`add_event` unless the job already has a ``type`` event at ``ts``: the writer picks
    ``ts`` once, so a retry whose first try committed (the connection dropped on the way back)
    does not record the event twice. True when it was written."""
    found = session.execute(select(JobEvent.id).where(JobEvent.job_id == job_id, JobEvent.type == type,
                                                      JobEvent.ts == ts).limit(1)).first()
    if found is not None:
        return False
    add_event(session, job_id, type, message, data, level=level, ts=ts)
    return True


def has_event(session: Session, job_id: int, type: str) -> bool:  # noqa: A002
    """Whether the job has an event of ``type``."""
    found = select(JobEvent.id).where(JobEvent.job_id == job_id, JobEvent.type == type).limit(1)
    return session.execute(found).first() is not None


def count_unscored_rows(session: Session, job_id: int, rows: int) -> None:
    """Add ``rows`` to the job's ``unscored_rows`` (with the warning event that reports them)."""
    session.execute(update(Job).where(Job.id == job_id).values(unscored_rows=Job.unscored_rows + rows))


def record_metrics(session: Session, job_id: int, record: dict[str, Any], attempt: int | None = None) -> bool:
    """One step's record, written by ``attempt`` of the job, once: the same attempt writing it
    again (a retry) changes nothing; a later attempt, which trained the step again after resuming
    from an older checkpoint, replaces it, so SQL holds the step the model took. True when the
    row was written. Staged for the stream too, also on a retry (readers drop a step they have),
    since the first try may have committed without publishing. An eval point's row, when written,
    leaves its ``job.eval`` webhook deliveries in the same transaction: a retry that wrote nothing
    sends none again, and a later attempt's re-evaluated step is sent with its new figures."""
    outbox.stage(session, job_id, "metrics", record)
    table = JobMetric.__table__
    values = {"job_id": job_id, "step": int(record["step"]), "attempt": attempt, "payload": record,
              "ts": utcnow()}
    stmt = dialect_insert(session.get_bind().dialect.name, table).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "step"],
        set_={"attempt": stmt.excluded.attempt, "payload": stmt.excluded.payload, "ts": stmt.excluded.ts},
        # Rows from before attempts were recorded count as attempt 0.
        where=func.coalesce(table.c.attempt, 0) < stmt.excluded.attempt,
    )
    # RETURNING, not rowcount: psycopg reports -1 for a Core INSERT run through the ORM session.
    written = session.execute(stmt.returning(table.c.id)).first() is not None
    evaluated = eval_metrics_of(record)
    if written and evaluated:
        enqueue_eval_event(session, job_id, values["step"], evaluated)
    return written


def record_samples(session: Session, job_id: int, step: int, rows: list[dict[str, Any]]) -> bool:
    outbox.stage(session, job_id, "samples", {"step": step, "rows": rows})
    return insert_ignoring_duplicates(
        session, JobSample.__table__, {"job_id": job_id, "step": step, "rows": rows}
    )


def record_checkpoint(session: Session, job_id: int, step: int, path: str, attempt: int | None) -> bool:
    return insert_ignoring_duplicates(session, Checkpoint.__table__, {
        "job_id": job_id, "step": step, "path": path, "attempt": attempt, "created_at": utcnow()})


def forget_checkpoints(session: Session, job_id: int, steps: list[int]) -> None:
    """Retention deleted these checkpoints' folders: the job no longer lists them."""
    session.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step.in_(steps)))


def list_events(session: Session, job_id: int, after: int = 0, limit: int = 100) -> list[EventRead]:
    rows = session.scalars(
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.id > after)
        .order_by(JobEvent.id)
        .limit(limit)
    )
    return [EventRead.model_validate(row, from_attributes=True) for row in rows]


def list_events_newest_first(session: Session, job_id: int, before: int = 0,
                             limit: int = 20) -> list[EventRead]:
    """The job's events newest first, those older than event ``before`` (0: from the newest)."""
    query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc()).limit(limit)
    if before:
        query = query.where(JobEvent.id < before)
    return [EventRead.model_validate(row, from_attributes=True) for row in session.scalars(query)]


def metrics_at(session: Session, job_id: int, steps: list[int]) -> dict[int, dict[str, Any]]:
    """The records of these steps of the job that it has, by step."""
    rows = session.execute(select(JobMetric.step, JobMetric.payload)
                           .where(JobMetric.job_id == job_id, JobMetric.step.in_(steps)))
    return {row.step: row.payload for row in rows}


def list_metrics(
    session: Session, job_id: int, after_step: int = BEFORE_FIRST_STEP, limit: int = 1000,
    names: set[str] | None = None,
) -> list[MetricRead]:
    rows = session.scalars(
        select(JobMetric)
        .where(JobMetric.job_id == job_id, JobMetric.step > after_step)
        .order_by(JobMetric.step)
        .limit(limit)
    )
    out = []
    for row in rows:
        values = (
            row.payload if not names else {k: v for k, v in row.payload.items() if k in names or k == "step"}
        )
        out.append(MetricRead(step=row.step, ts=row.ts, values=values))
    return out


def list_samples(
    session: Session, job_id: int, step: int | None = None, limit: int = 20
) -> list[SamplesRead]:
    query = select(JobSample).where(JobSample.job_id == job_id)
    query = query.where(JobSample.step == step) if step is not None else query.order_by(JobSample.step.desc())
    return [SamplesRead(step=row.step, rows=row.rows) for row in session.scalars(query.limit(limit))]


def published_artifacts(session: Session, job_id: int) -> Published:
    """What the job's attempts published (its checkpoint rows; its final model once it succeeded,
    by the attempt that did), the one view every reader of its stored artifacts takes."""
    rows = session.execute(select(Checkpoint.step, Checkpoint.attempt).where(Checkpoint.job_id == job_id))
    job = session.execute(select(Job.status, Job.attempt).where(Job.id == job_id)).one_or_none()
    succeeded = job is not None and job.status == JobStatus.SUCCEEDED
    return Published({row.step: row.attempt for row in rows}, job.attempt if succeeded else None)


def list_checkpoints(session: Session, job_id: int) -> list[CheckpointRead]:
    rows = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
    return [CheckpointRead(step=r.step, path=r.path, attempt=r.attempt, created_at=r.created_at)
            for r in rows]
