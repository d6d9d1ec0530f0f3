"""Row → schema conversion and the dialect-neutral ``INSERT ... ON CONFLICT`` statement."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Executable, Row, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from api.domain.lifecycle import HOLDING_STATUSES, WAITING_STATUSES
from api.schemas.jobs import ErrorInfo, HostPlacement, JobRead
from api.store.tables import Job


def job_read(job: Job | Row[Any], *, traceback: bool = False, spec: bool = True) -> JobRead:
    """From an ORM ``Job`` or a Core row of every ``jobs`` column (``RETURNING``). A failure's
    traceback is for admins (it may show paths and data of the host): only with ``traceback``.
    ``spec=False``: a summary, without the spec (which the query need not have loaded)."""
    error = None
    if job.error_code:
        error = ErrorInfo(code=job.error_code, message=job.error_message or "",
                          traceback=job.error_traceback if traceback else None)
    return JobRead(
        id=job.id,
        name=job.name,
        kind=job.kind,
        tags=job.tags or [],
        description=job.description,
        team_id=job.team_id,
        status=job.status,
        priority=job.priority,
        pool=job.pool,
        gpus=job.gpus,
        attempt=job.attempt,
        worker_id=job.worker_id,
        devices=job.devices,
        placement=placement_of(job),
        max_steps=job.max_steps,
        last_step=job.last_step,
        unscored_rows=job.unscored_rows,
        cancel_requested=job.cancel_requested,
        preempt_requested=job.preempt_requested,
        # The column keeps the scheduler's last word on a job it could not place; once the job
        # runs, rests or ends, that word is no longer true (a cancelled job does not wait).
        pending_reason=job.pending_reason if job.status in WAITING_STATUSES else None,
        created_at=job.created_at,
        dispatched_at=job.dispatched_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        heartbeat_at=job.heartbeat_at,
        latest_checkpoint=job.latest_checkpoint,
        error=error,
        alerts=job.alerts or [],
        best=job.best,
        spec=job.spec if spec else None,
    )


def placement_of(job: Job | Row[Any]) -> list[HostPlacement]:
    """Every host the job holds devices on: the dispatch's ``placement``, or for a job dispatched
    before it was recorded, its one worker."""
    if job.placement:
        return [HostPlacement(worker=host["worker"], devices=host["devices"]) for host in job.placement]
    if job.worker_id is not None and job.status in HOLDING_STATUSES:
        return [HostPlacement(worker=job.worker_id, devices=job.devices)]
    return []


def dialect_insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """``table``'s INSERT for ``dialect`` (a ``Dialect.name``); it offers ``on_conflict_do_nothing``."""
    return (postgresql if dialect == "postgresql" else sqlite).insert(table)


@cache
def insert_returning(dialect: str, table: Table, arbiter: tuple[str, ...] = ()) -> Executable:
    """``INSERT ... [ON CONFLICT (arbiter) DO NOTHING] RETURNING`` every column, built once per
    dialect: a hot path only binds its values (no statement to build, no cache key to compute)."""
    stmt = dialect_insert(dialect, table)
    if arbiter:
        stmt = stmt.on_conflict_do_nothing(index_elements=list(arbiter))
    return stmt.returning(*table.c)


def insert_ignoring_duplicates(session: Session, table: Table, values: dict[str, Any]) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING; True when a row was written. A retried write of the
    same (job, step) is harmless, which is what makes worker retries safe."""
    stmt = dialect_insert(session.get_bind().dialect.name, table).values(**values).on_conflict_do_nothing()
    # RETURNING, not rowcount: psycopg reports -1 for a Core INSERT run through the ORM session.
    return session.execute(stmt.returning(*table.primary_key.columns)).first() is not None
