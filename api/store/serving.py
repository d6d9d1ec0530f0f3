"""Serving jobs (:mod:`api.domain.serve_spec`): the team's one live serving job of a model, found
or started for a chat request.

A live serving job (queued, dispatched, running or preempted) takes every request of its team for
its model; none, a new one is queued (its ``queued`` event too) and admitted like any job of the
team (:func:`api.store.team_admission.admit`: a full queue is the same ``queue_full``), all in the
caller's transaction. Two first requests at once make one job: the insert does nothing where the
unique index ``uq_jobs_serving`` already holds a live one (``ON CONFLICT DO NOTHING``; Postgres
waits for the other transaction's commit first, SQLite serialises writers), and the job then read
is the other request's.
"""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from api.domain.errors import Conflict
from api.domain.serve_spec import (
    LIVE_SERVING_STATUSES,
    SERVE,
    ServeConfig,
    ServeResources,
    ServeSpec,
    serving_name,
)
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store._rows import dialect_insert, job_read
from api.store.tables import Job, JobEvent, utcnow
from api.store.team_admission import admit, team_limits

_JOBS = Job.__table__


def live_serving_job(session: Session, team_id: int, model: str) -> JobRead | None:
    """The team's live serving job of ``model`` (canonical: :func:`api.domain.serve_spec.canonical_model`)."""
    c = _JOBS.c
    row = session.execute(
        select(*c).where(c.team_id == team_id, c.kind == SERVE, c.serve_model == model,
                         c.status.in_(LIVE_SERVING_STATUSES), c.deleted_at.is_(None))
        .order_by(c.id).limit(1)).first()
    return None if row is None else job_read(row)


def job_status(session: Session, job_id: int) -> tuple[str | None, str | None]:
    """A job's status now and its error's message (None: no such job, or deleted; no error): what
    a waiting chat request checks."""
    row = session.execute(select(Job.status, Job.error_message)
                          .where(Job.id == job_id, Job.deleted_at.is_(None))).first()
    return (None, None) if row is None else (row.status, row.error_message)


def serving_spec(session: Session, team_id: int, model: str, settings: Settings, pool: str) -> ServeSpec:
    """The spec of a new serving job of ``model``: the team's idle time, the deployment's batch."""
    idle = team_limits(session, team_id, settings).serve_idle_seconds or settings.team_serve_idle_seconds
    serve = ServeConfig(model=model, idle_seconds=int(idle), max_batch=settings.serve_max_batch)
    return ServeSpec(name=serving_name(model), serve=serve, resources=ServeResources(pool=pool))


def find_or_start(session: Session, team_id: int, model: str, settings: Settings, *, member: bool,
                  pool: str) -> tuple[JobRead, bool]:
    """``(the team's live serving job of model, whether this call queued it)``. A new one is
    admitted in this transaction (:class:`~api.domain.errors.QueueFull` rolls it back)."""
    found = live_serving_job(session, team_id, model)
    if found is not None:
        return found, False
    spec = serving_spec(session, team_id, model, settings, pool)
    now = utcnow()
    values = {"team_id": team_id, "name": spec.name, "spec": spec.model_dump(mode="json"), "status": "queued",
              "priority": spec.priority, "pool": spec.resources.pool, "gpus": spec.resources.gpus,
              "kind": SERVE, "serve_model": spec.serve.model, "created_at": now}
    stmt = dialect_insert(session.get_bind().dialect.name, _JOBS).values(**values).on_conflict_do_nothing()
    row = session.execute(stmt.returning(*_JOBS.c)).first()
    if row is None:  # another request started it first (the unique index held its row)
        found = live_serving_job(session, team_id, model)
        if found is None:  # and it ended already: rare enough to ask the client to retry
            raise Conflict(f"the serving job of {model} changed meanwhile; send the request again",
                           param="model")
        return found, False
    session.execute(insert(JobEvent.__table__), [{
        "job_id": row.id, "ts": now, "type": "queued", "level": "info",
        "message": f"serving job queued for chat requests to {model}",
        "data": {"priority": spec.priority, "pool": spec.resources.pool, "serve": spec.serve.model}}])
    admit(session, team_id, spec.priority, settings, member=member)
    return job_read(row), True
