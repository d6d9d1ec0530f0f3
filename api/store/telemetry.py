"""Events, per-step metrics, samples and checkpoints of a job. Writes are idempotent per
``(job_id, step)`` so a retried worker write never duplicates a step."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from api.schemas.jobs import CheckpointRead, EventRead, MetricRead, SamplesRead
from api.store import outbox
from api.store._rows import insert_ignoring_duplicates
from api.store.models import Checkpoint, JobEvent, JobMetric, JobSample, utcnow


def add_event(
    session: Session,
    job_id: int,
    type: str,
    message: str = "",  # noqa: A002
    data: dict[str, Any] | None = None,
    level: str = "info",
) -> EventRead:
    event = JobEvent(job_id=job_id, type=type, message=message, data=data or {}, level=level, ts=utcnow())
    session.add(event)
    session.flush()
    read = EventRead.model_validate(event, from_attributes=True)
    outbox.stage(session, job_id, "event", read.model_dump(mode="json"))  # with its row id: de-duplicable
    return read


def record_metrics(session: Session, job_id: int, record: dict[str, Any]) -> bool:
    """One step's record, staged for the stream too: also a retried write's (readers drop a
    step they have), since the first attempt may have committed without publishing."""
    outbox.stage(session, job_id, "metrics", record)
    return insert_ignoring_duplicates(
        session,
        JobMetric.__table__,
        {"job_id": job_id, "step": int(record["step"]), "payload": record, "ts": utcnow()},
    )


def record_samples(session: Session, job_id: int, step: int, rows: list[dict[str, Any]]) -> bool:
    outbox.stage(session, job_id, "samples", {"step": step, "rows": rows})
    return insert_ignoring_duplicates(
        session, JobSample.__table__, {"job_id": job_id, "step": step, "rows": rows}
    )


def record_checkpoint(session: Session, job_id: int, step: int, path: str) -> bool:
    return insert_ignoring_duplicates(
        session, Checkpoint.__table__, {"job_id": job_id, "step": step, "path": path, "created_at": utcnow()}
    )


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


def list_metrics(
    session: Session, job_id: int, after_step: int = 0, limit: int = 1000, names: set[str] | None = None
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


def list_checkpoints(session: Session, job_id: int) -> list[CheckpointRead]:
    rows = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
    return [CheckpointRead(step=r.step, path=r.path, created_at=r.created_at) for r in rows]
