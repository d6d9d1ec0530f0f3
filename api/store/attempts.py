"""A job's attempts, the worker's side of its lifecycle: claim, the lease and the stop
requests read through it, how an attempt ends, and the way back to the queue when a worker or its
lease is lost. Every status move goes through :func:`api.store.jobs.transition`, the one writer of
``jobs.status``; the moves a user asks for (cancel, pause, resume, retry) live there too."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, or_, select, text, update
from sqlalchemy.orm import Session

from api.domain.lifecycle import ACTIVE_STATUSES, ENDINGS, JobStatus, StopRequest, Transition, stop_requested
from api.schemas.jobs import JobRead, as_utc
from api.store.clock import Backoff, db_now
from api.store.gangs import job_held, joined_host, lost_host
from api.store.jobs import held_by, transition
from api.store.tables import Job, JobHost, utcnow

_JOBS = Job.__table__


def claim(session: Session, job_id: int, worker_id: str, dispatch: int | None = None) -> JobRead | None:
    """A worker takes a dispatched job; a duplicate delivery finds it no longer dispatched, and a
    delivery of an earlier dispatch (``dispatch``, the number its message carries; None: a message
    that carries none) finds the job dispatched again since (its message was not claimed within the
    claim window). The lease starts on the database's clock (:mod:`api.store.clock`), as every
    renewal does."""
    now = db_now(session)
    values = {"worker_id": worker_id, "attempt": _JOBS.c.attempt + 1, "heartbeat_at": now, "started_at": now,
              "retry_at": None, "error_code": None, "error_message": None, "error_traceback": None}
    # The job is promised to this worker; one dispatched to none (by hand) is anyone's.
    promised = or_(_JOBS.c.worker_id == worker_id, _JOBS.c.worker_id.is_(None))
    if dispatch is not None:
        promised = and_(promised, _JOBS.c.dispatches == dispatch)
    return transition(session, job_id, via=Transition.CLAIM, message=f"claimed by {worker_id}",
                      guard=promised, values=values)


_STOP_COLUMNS = (Job.cancel_requested, Job.status, Job.preempt_requested)


def _stop_in(row: Row[Any]) -> StopRequest | None:
    return stop_requested(cancel_requested=bool(row[0]), status=row[1], preempt_requested=bool(row[2]))


def release_if_frozen(session: Session, lease_seconds: float | None) -> None:
    """A transaction that locks a job's row and is then left idle for longer than the lease (its
    process frozen between the write and the commit: a paused VM, a stopped worker) is ended by
    Postgres, which releases the lock: otherwise the reaper's requeue of that job, and with it the
    scheduler's whole tick, would wait for as long as the process stays frozen. The thawed
    process's commit then fails, as any lost connection does. None: no bound (the caller's own)."""
    if lease_seconds is not None and session.get_bind().dialect.name == "postgresql":
        idle_ms = max(1000, int(lease_seconds * 1000))
        session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {idle_ms}"))


def renew_lease(session: Session, job_id: int, worker_id: str,
                lease_seconds: float | None = None) -> tuple[bool, StopRequest | None]:
    """``(still_ours, the stop the job is asked for)``; a worker that lost its lease must stop.
    Stamped with the database's clock, which the reaper compares it with: a worker whose own clock
    is off neither loses its job nor keeps a dead one. ``lease_seconds``: see
    :func:`release_if_frozen` (the renewal locks the job's row until its commit)."""
    release_if_frozen(session, lease_seconds)
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.worker_id == worker_id, Job.status.in_(ACTIVE_STATUSES))
        .values(heartbeat_at=db_now(session))
        .returning(*_STOP_COLUMNS)
        .execution_options(synchronize_session=False)
    )
    row = session.execute(stmt).first()
    return (False, None) if row is None else (True, _stop_in(row))


def still_held(session: Session, job_id: int, worker_id: str, dispatched_at: datetime | None) -> bool:
    """Whether ``worker_id`` still holds the running attempt of the dispatch made at
    ``dispatched_at`` (no one recorded its end). The dispatch's time tells it from a newer dispatch
    of the same job that may already have put this worker in again."""
    held = session.execute(select(_JOBS.c.dispatched_at).where(
        _JOBS.c.id == job_id, _JOBS.c.status.in_(ACTIVE_STATUSES), held_by(worker_id))).first()
    return held is not None and held.dispatched_at is not None and dispatched_at is not None \
        and as_utc(held.dispatched_at) == as_utc(dispatched_at)


def renew_host_lease(session: Session, job_id: int, worker_id: str,
                     lease_seconds: float | None = None) -> tuple[bool, StopRequest | None]:
    """A gang host's (not node 0's) lease renewal, its row of ``job_hosts``: ``(still_ours, the stop
    the job is asked for)``, as :func:`renew_lease` answers node 0. Its place is gone once the job
    stopped holding GPUs (requeued, ended): the host must end its part at once. While node 0 has
    not claimed yet the job is still ``dispatched``, and the place holds."""
    release_if_frozen(session, lease_seconds)
    renewed = session.execute(
        update(JobHost)
        .where(joined_host(job_id, worker_id), job_held(job_id))
        .values(heartbeat_at=db_now(session))
        .execution_options(synchronize_session=False)
    ).rowcount
    return (True, stop_request(session, job_id)) if renewed == 1 else (False, None)


def stop_request(session: Session, job_id: int) -> StopRequest | None:
    """What the job has been asked to do, read by its own process before every step (one indexed
    read), so a stop lands within a step however fast steps are, not on the supervisor's next
    lease renewal."""
    row = session.execute(select(*_STOP_COLUMNS).where(Job.id == job_id)).first()
    return None if row is None else _stop_in(row)


def finish(
    session: Session,
    job_id: int,
    *,
    worker_id: str,
    outcome: JobStatus,
    message: str = "",
    error_code: str | None = None,
    error_message: str | None = None,
    traceback: str | None = None,
) -> JobRead | None:
    """Record how an attempt ended (``outcome``: succeeded, failed or cancelled); only the
    worker holding the lease may. None when it no longer holds it."""
    outcome = JobStatus(outcome)
    return transition(
        session,
        job_id,
        via=ENDINGS[outcome],
        message=message or outcome.value,
        data={"error_code": error_code} if error_code else None,
        worker_id=worker_id,
        values={"finished_at": utcnow(), "error_code": error_code, "error_message": error_message,
                "error_traceback": traceback},
    )


TOO_MANY_ATTEMPTS = "too_many_attempts"


def requeue_expired(session: Session, lease_seconds: float, now: datetime | None = None,
                    max_attempts: int | None = None, backoff: Backoff | None = None,
                    claim_window_seconds: float | None = None) -> list[int]:
    """Jobs whose worker went silent go back to the queue (they resume from their checkpoint);
    one that was being cancelled ends cancelled instead, and a running one that has had
    ``max_attempts`` attempts fails ``too_many_attempts`` (a job that kills its worker each
    time, say, must not loop forever). The staleness is checked again by each move, so a lease
    renewed meanwhile keeps its job. ``now``: the database's clock unless given (tests);
    ``backoff``: how long a requeued job waits before its next dispatch. ``claim_window_seconds``:
    how long a gang's host may take to join; given, a dispatch never claimed is the claim window's
    alone (:func:`api.store.dispatching.undispatch_unclaimed`: the lease is for running jobs, not
    for lost messages); None, the lease stands for both."""
    now = now or db_now(session)
    cutoff = now - timedelta(seconds=lease_seconds)
    c = _JOBS.c
    host_lost = lost_host(cutoff, now - timedelta(seconds=claim_window_seconds or lease_seconds))
    expired = or_(c.status.in_(ACTIVE_STATUSES) & (c.heartbeat_at < cutoff), host_lost)
    if claim_window_seconds is None:
        expired = or_(expired, (c.status == JobStatus.DISPATCHED.value) & (c.dispatched_at < cutoff))
    moved = []
    rows = session.execute(select(c.id, c.status, host_lost).where(expired)).all()
    for job_id, status, gang_host_lost in rows:
        why = "a host of its gang was lost (its lease expired)" if gang_host_lost else "lease expired"
        if status == JobStatus.CANCELLING:
            job = transition(session, job_id, via=Transition.STOP_CANCELLED, guard=expired,
                             message="worker lost while cancelling", values={"finished_at": utcnow()})
        elif status == JobStatus.PAUSING:  # it resumes from its last checkpoint when resumed
            job = transition(session, job_id, via=Transition.STOP_PAUSED, guard=expired,
                             message="worker lost while pausing")
        else:
            job = _requeue_or_give_up(session, job_id, guard=expired, worker_id=None,
                                      message=why, data={"previous_status": status},
                                      max_attempts=max_attempts, backoff=backoff, now=now)
        if job is not None:
            moved.append(job_id)
    return moved


def requeue_after_fault(session: Session, job_id: int, *, worker_id: str, message: str, data: dict[str, Any],
                        max_attempts: int, backoff: Backoff | None = None) -> JobRead | None:
    """The attempt was ended by the machine, not by the job (a rank process killed, e.g. by the OOM
    killer): back to the queue at once, to resume from its checkpoint, rather than once its lease
    expires. Bounded: a job that has had ``max_attempts`` attempts fails ``too_many_attempts`` with
    this ``message`` as its error instead; one being cancelled ends cancelled, one being paused
    paused. Only the worker holding the lease may; None when it no longer does. ``backoff``: how
    long the job waits before its next dispatch. A job only dispatched has no attempt to end: a
    fault reported late, after the job was requeued and dispatched to this worker again, must not
    send that new dispatch back (its message would then find it queued)."""
    c = _JOBS.c
    job = transition(session, job_id, via=Transition.STOP_CANCELLED, worker_id=worker_id,
                     guard=c.status == JobStatus.CANCELLING.value, message=f"{message} while cancelling",
                     data=data, values={"finished_at": utcnow()})
    # Guarded: a running job may stop paused too (a health rule's pause), but a fault never pauses it.
    job = job or transition(session, job_id, via=Transition.STOP_PAUSED, worker_id=worker_id,
                            guard=c.status == JobStatus.PAUSING.value, message=f"{message} while pausing",
                            data=data)
    ran = c.status != JobStatus.DISPATCHED.value
    return job or _requeue_or_give_up(session, job_id, guard=ran, worker_id=worker_id, message=message,
                                      data=data, max_attempts=max_attempts, backoff=backoff)


def _requeue_or_give_up(session: Session, job_id: int, *, guard: ColumnElement[bool] | None,
                        worker_id: str | None, message: str, data: dict[str, Any],
                        max_attempts: int | None, backoff: Backoff | None = None,
                        now: datetime | None = None) -> JobRead | None:
    """Back to the queue, unless the job has used ``max_attempts`` attempts (None: no limit): then
    it fails ``too_many_attempts`` with ``message`` as the last error. A dispatched job that was
    never claimed has used no attempt, so it always goes back. A requeued job is not dispatched
    before ``backoff`` says (``retry_at``, on the database's clock ``now``)."""
    c = _JOBS.c
    values: dict[str, Any] = {}
    if backoff is not None:
        attempts = session.execute(select(c.attempt).where(c.id == job_id)).scalar() or 0
        values["retry_at"] = backoff.until(now or db_now(session), attempts)
    # Attempts since the job was last retried by hand: a retry gives it a fresh budget.
    within = None if max_attempts is None else or_(c.attempt - c.attempt_base < max_attempts,
                                                   c.status == JobStatus.DISPATCHED.value)
    conditions = [g for g in (guard, within) if g is not None]
    requeue_guard = and_(*conditions) if conditions else None
    job = transition(session, job_id, via=Transition.REQUEUE, worker_id=worker_id, guard=requeue_guard,
                     message=f"{message}; back to the queue", data=data, values=values)
    if job is not None or max_attempts is None:
        return job
    error = f"gave up after {max_attempts} attempts; the last: {message}"
    return transition(session, job_id, via=Transition.FAIL, worker_id=worker_id, guard=guard, message=error,
                      data={**data, "error_code": TOO_MANY_ATTEMPTS},
                      values={"finished_at": utcnow(), "error_code": TOO_MANY_ATTEMPTS,
                              "error_message": error, "error_traceback": None})


def record_max_steps(session: Session, job_id: int, steps: int) -> None:
    """The step count of a job that trains by epochs over a file or hub dataset, once its worker
    has counted the prompts; a count already there (from submit or an earlier attempt) stays."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.max_steps.is_(None))
        .values(max_steps=steps)
        .execution_options(synchronize_session=False)
    )


def set_progress(session: Session, job_id: int, step: int, checkpoint: str | None = None) -> None:
    values: dict[str, Any] = {"last_step": step}
    if checkpoint is not None:
        values["latest_checkpoint"] = checkpoint
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.last_step <= step)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def stop_paused(session: Session, job_id: int, worker_id: str, step: int, message: str | None = None) -> bool:
    """The attempt checkpointed and stopped for a pause (a person's, or a health rule's, which
    ``message`` says): ``paused``, its GPUs free; only the worker holding the lease may record it.
    False when it no longer holds it."""
    moved = transition(session, job_id, via=Transition.STOP_PAUSED, worker_id=worker_id,
                       message=message or f"paused at step {step}", data={"step": step})
    return moved is not None


def attempt_lease_left(session: Session, job_id: int, worker_id: str, attempt: int,
                       lease_seconds: float) -> float | None:
    """The fencing check of an attempt's writes (docs/architecture.md §6): None unless ``attempt``
    is still the job's current attempt, held by ``worker_id`` and running (a newer attempt, a
    requeue or an ending all refuse it); else the seconds its lease has left on the database's
    clock (0 or less: expired, though nobody has taken the job over yet). The job's row is locked
    until the transaction ends, so a row written in the same transaction is published only while
    the attempt owns the job: the requeue or claim that would take it waits for the commit. A
    process frozen before that commit holds the lock no longer than the lease
    (:func:`release_if_frozen`; the thawed process's retry finds the attempt stale)."""
    release_if_frozen(session, lease_seconds)
    row = session.execute(
        select(_JOBS.c.heartbeat_at)
        .where(_JOBS.c.id == job_id, _JOBS.c.attempt == attempt, _JOBS.c.status.in_(ACTIVE_STATUSES),
               held_by(worker_id))
        .with_for_update()
    ).first()
    if row is None or row.heartbeat_at is None:
        return None
    left = as_utc(row.heartbeat_at) + timedelta(seconds=lease_seconds) - as_utc(db_now(session))
    return left.total_seconds()
