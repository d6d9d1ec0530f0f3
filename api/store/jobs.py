"""Jobs and their lifecycle. :func:`transition` is the only writer of ``jobs.status``: each move
of :mod:`api.domain.lifecycle` is one UPDATE guarded by the rule's source statuses, plus its
``job_events`` row and its stream message in the same transaction: two actors can never both win."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, bindparam, delete, insert, or_, select, update
from sqlalchemy.orm import Session, defer

from api.domain.errors import Conflict, InvalidInput, NotFound
from api.domain.job_spec import JobSpec
from api.domain.lifecycle import (
    ACTIONS,
    ALREADY_ASKED,
    HOLDING_STATUSES,
    RESTING_STATUSES,
    RULES,
    TERMINAL_STATUSES,
    WAITING_STATUSES,
    Action,
    Transition,
    applies,
)
from api.schemas.jobs import JobRead, SpecWarningRead
from api.store import outbox
from api.store._rows import insert_returning, job_read
from api.store.job_labels import add_tags, matching
from api.store.tables import Allocation, Job, JobEvent, JobHost, utcnow
from api.store.telemetry import add_event
from api.store.webhooks import enqueue_job_event
from api.vocabulary import PRIORITIES
from grpo_core.errors import SpecWarning
from grpo_core.rewards import required_capabilities
from grpo_core.rewards.sandbox import CAPABILITY as SANDBOX_CAPABILITY


def request_hash(spec: JobSpec, body: dict[str, Any] | None = None) -> str:
    """``body``: ``spec.model_dump(mode="json")`` when the caller already has it."""
    canonical = json.dumps(body or spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def capabilities_needed(spec: JobSpec) -> list[str]:
    """What a worker must advertise to run ``spec`` (its rewards' needs), sorted, each once:
    stored with the job for the scheduler, and checked again by the worker that gets it."""
    needed = {capability for _, capability in required_capabilities(spec.rewards)}
    sandboxed_environment = spec.environment is not None and spec.environment.source is not None
    if spec.tools is not None or sandboxed_environment:  # they run in the sandbox the python graders use
        needed.add(SANDBOX_CAPABILITY)
    return sorted(needed)


_JOBS = Job.__table__
# A job back in the queue, or paused, is held by no worker: whichever move put it there (a pause,
# a preemption, a requeue, a retry, a resume, a failed dispatch), :func:`transition` clears what
# the worker that held it left behind.
_UNHELD = frozenset({*WAITING_STATUSES, *RESTING_STATUSES})
_RELEASED = {"worker_id": None, "devices": None, "placement": None, "preempt_requested": False}
_INSERT_EVENT = insert(JobEvent.__table__)
_QUEUED = {"type": "queued", "message": "job submitted", "level": "info"}
_BY_KEY = select(*_JOBS.c).where(_JOBS.c.team_id == bindparam("t"), _JOBS.c.idempotency_key == bindparam("k"))


def create_job(
    session: Session, team_id: int, spec: JobSpec, idempotency_key: str | None = None,
    found: Sequence[SpecWarning] = (),
) -> tuple[JobRead, bool]:
    """Insert a queued job, its ``queued`` event and a warning event (``spec_field_ignored``, or
    the warning's own type) for each of the spec's warnings and each of ``found`` (what the
    submit's checks found beside the spec: an uploaded dataset's row count), also in the returned
    job's ``warnings``; ``(job, created)``.
    The same idempotency key with the same body returns the first job; with a different body it is
    a :class:`Conflict`.
    Core statements, no ORM unit of work: this is the submit hot path. A used key makes the
    insert do nothing (``ON CONFLICT``), then the row holding it is read, also when a concurrent
    request inserted it (Postgres waits for that transaction; SQLite serialises writers)."""
    body = spec.model_dump(mode="json")
    digest = request_hash(spec, body)
    now = utcnow()
    values = {
        "team_id": team_id,
        "name": spec.name,
        "spec": body,
        "status": "queued",
        "priority": spec.priority,
        "pool": spec.resources.pool,
        "gpus": spec.resources.gpus,
        "required_capabilities": capabilities_needed(spec),
        "max_steps": spec.known_steps(),
        "idempotency_key": idempotency_key,
        "request_hash": digest,
        "created_at": now,
        "tags": spec.tags,
        "description": spec.description,
        "max_gpu_hours": spec.resources.max_gpu_hours,
    }
    # NULL keys never conflict, so only a keyed insert needs the arbiter.
    arbiter = ("team_id", "idempotency_key") if idempotency_key is not None else ()
    stmt = insert_returning(session.get_bind().dialect.name, _JOBS, arbiter)
    row = session.execute(stmt, values).first()
    if row is None:
        existing = session.execute(_BY_KEY, {"t": team_id, "k": idempotency_key}).first()
        if existing is None:  # the row holding the key was deleted between the two statements
            raise Conflict("Idempotency-Key is in use; retry", param="Idempotency-Key")
        return _with_warnings(_replay(existing, digest), spec, found), False
    event = {"priority": spec.priority, "pool": spec.resources.pool}
    # The spec's warnings are told once, at submit: the stored spec no longer holds what they name.
    ignored = [{"type": warning.event, "level": "warning", "message": str(warning),
                "data": {"field": warning.field}} for warning in [*spec.warnings(), *found]]
    session.execute(_INSERT_EVENT, [{**fields, "job_id": row.id, "ts": now}
                                    for fields in ({**_QUEUED, "data": event}, *ignored)])
    add_tags(session, row.id, spec.tags)
    return _with_warnings(job_read(row), spec, found), True


def _with_warnings(job: JobRead, spec: JobSpec, found: Sequence[SpecWarning]) -> JobRead:
    warnings = [SpecWarningRead(param=warning.field, message=warning.message)
                for warning in [*spec.warnings(), *found]]
    return job.model_copy(update={"warnings": warnings}) if warnings else job


def _replay(existing: Row[Any], digest: str) -> JobRead:
    if existing.request_hash != digest:
        raise Conflict(
            "Idempotency-Key was already used with a different request body", param="Idempotency-Key"
        )
    return job_read(existing)


def get_job(session: Session, job_id: int, team_id: int | None = None, *, traceback: bool = False) -> JobRead:
    """``team_id=None`` sees every team (admin); another team's job is reported as not found.
    ``traceback``: include a failure's traceback (an admin's read)."""
    job = session.get(Job, job_id)
    if job is None or job.deleted_at is not None or (team_id is not None and job.team_id != team_id):
        raise NotFound(f"job {job_id} not found", param="job_id")
    return job_read(job, traceback=traceback)


# A clone's name: its source's name and the next free number (a clone of a clone numbers on).
_NUMBERED = re.compile(r"^(?P<base>.+)-(?P<number>[0-9]{1,9})$")
_NAME_LENGTH: int = _JOBS.c.name.type.length  # a long name is cut to leave room for its number


def clone_name(session: Session, team_id: int, name: str) -> str:
    """``NAME-N``, N the next number after the largest any of the team's jobs called ``NAME-K``
    has (at least 2): clones of a job are told apart in every list. A clone of ``NAME-3`` (itself
    a clone of ``NAME``, which still exists) is named after ``NAME`` too, not ``NAME-3-2``."""
    mine = select(Job.name).where(Job.team_id == team_id, Job.deleted_at.is_(None))
    numbered = _NUMBERED.match(name)
    if numbered and session.execute(mine.where(Job.name == numbered["base"]).limit(1)).first():
        name = numbered["base"]
    taken = [_NUMBERED.match(other) for other in session.scalars(
        mine.where(Job.name.startswith(f"{name}-", autoescape=True)))]
    number = max((int(match["number"]) for match in taken if match and match["base"] == name), default=1) + 1
    suffix = f"-{number}"
    return name[:_NAME_LENGTH - len(suffix)] + suffix


def list_jobs(
    session: Session,
    team_id: int | None,
    statuses: Iterable[str] | None = None,
    after: int = 0,
    limit: int = 50,
    newest_first: bool = False,
    traceback: bool = False,
    with_spec: bool = False,
    tags: Sequence[str] = (),
    search: str | None = None,
) -> list[JobRead]:
    """Jobs by id, oldest first, or newest first; ``after`` is the cursor in that order (the last
    id seen; 0: from the start), so new submissions never shift a page being read. Only jobs with
    every one of ``tags`` and, with ``search``, holding it in their name or description
    (:func:`api.store.job_labels.matching`), as filters of the same query: the cursor holds.
    ``traceback`` as in :func:`get_job`; summaries unless ``with_spec`` (the spec is not even read)."""
    if newest_first:
        query = select(Job).order_by(Job.id.desc()).limit(limit)
        if after:
            query = query.where(Job.id < after)
    else:
        query = select(Job).where(Job.id > after).order_by(Job.id).limit(limit)
    query = query.where(Job.deleted_at.is_(None))  # a tombstone (api.store.job_deletion)
    if team_id is not None:
        query = query.where(Job.team_id == team_id)
    if statuses:
        query = query.where(Job.status.in_(list(statuses)))
    query = matching(query, tags, search)
    if not with_spec:
        query = query.options(defer(Job.spec, raiseload=True))
    return [job_read(job, traceback=traceback, spec=with_spec) for job in session.scalars(query)]


# Failure text comes from anywhere (a reward's exception, a tokenizer's bytes); storing it must not
# fail, or the attempt that failed cannot end and its job is requeued forever.
MAX_MESSAGE_CHARS = 4_000
MAX_TRACEBACK_CHARS = 32_000
_FAILURE_TEXT_LIMITS = {"error_message": MAX_MESSAGE_CHARS, "error_traceback": MAX_TRACEBACK_CHARS}


def storable_text(text: str, limit: int) -> str:
    """``text`` as any database stores it: NUL (which Postgres refuses in text) and unpaired
    surrogates (which UTF-8 cannot encode) replaced, at most ``limit`` characters, keeping the
    start and the end (a traceback's last lines say the most)."""
    text = text.replace("\x00", "\ufffd").encode("utf-8", errors="replace").decode("utf-8")
    if len(text) <= limit:
        return text
    marker = " [... {} characters cut ...] "
    cut = len(text) - limit + len(marker.format(len(text)))
    head = (len(text) - cut) // 2
    return text[:head] + marker.format(cut) + text[head + cut :]


def transition(
    session: Session,
    job_id: int,
    *,
    via: Transition,
    message: str = "",
    data: dict[str, Any] | None = None,
    worker_id: str | None = None,
    guard: ColumnElement[bool] | None = None,
    values: Mapping[str, Any] | None = None,
) -> JobRead | None:
    """The one writer of ``jobs.status``: move ``job_id`` as the rule of ``via`` says
    (:data:`api.domain.lifecycle.RULES`), setting ``values`` too; None when the job was not in one of the
    rule's sources (another actor moved it first), or failed ``guard``, or, with ``worker_id``,
    is not held by that worker. A move opens the job's allocation on dispatch and closes it
    when the job stops holding GPUs, releases a job that goes back to the queue or pauses from
    its worker (``worker_id``, ``devices``, ``preempt_requested``), records the rule's event,
    stages a ``status`` message for the job's stream (:mod:`api.store.outbox`) and, for a final
    status, the team's webhook deliveries (:mod:`api.store.webhooks`)."""
    via = Transition(via)
    rule = RULES[via]
    if values and "status" in values:
        raise ValueError("a transition's target status comes from its rule, not from values")
    message = storable_text(message, MAX_MESSAGE_CHARS)
    values = {**(values or {}), **(_RELEASED if rule.target in _UNHELD else {})}
    for column, limit in _FAILURE_TEXT_LIMITS.items():
        if values.get(column) is not None:
            values[column] = storable_text(values[column], limit)
    # Never a deleted job: a retry that waited on the deletion's row lock finds it a tombstone.
    conditions = [_JOBS.c.id == job_id, _JOBS.c.status.in_(sorted(s.value for s in rule.sources)),
                  _JOBS.c.deleted_at.is_(None)]
    if worker_id is not None:
        conditions.append(held_by(worker_id))
    if guard is not None:
        conditions.append(guard)
    stmt = update(_JOBS).where(*conditions).values(status=rule.target.value, **values)
    row = session.execute(stmt.returning(*_JOBS.c)).first()
    if row is None:
        return None
    if via is Transition.DISPATCH:
        session.add(Allocation(job_id=job_id, team_id=row.team_id, pool=row.pool, gpus=row.gpus,
                               started_at=row.dispatched_at or utcnow()))
    elif rule.target not in HOLDING_STATUSES:
        close_allocation(session, job_id)
        release_hosts(session, job_id)
    recorded = {name: getattr(row, name) for name in rule.record}
    add_event(session, job_id, rule.event, message, {**recorded, **(data or {})}, rule.level)
    job = job_read(row)
    status: dict[str, Any] = {"status": job.status}
    if job.error is not None:
        status["error"] = {"code": job.error.code, "message": job.error.message}
    outbox.stage(session, job_id, "status", status)
    if job.status in TERMINAL_STATUSES:  # the team's webhooks hear of it once this commits
        enqueue_job_event(session, job, f"job.{job.status}")
    return job


def held_by(worker_id: str) -> ColumnElement[bool]:
    """The job is held by ``worker_id``: its worker, or a host of its gang that joined the attempt
    (``job_hosts``), so that any host of a gang may record how the attempt ended (the first to
    record wins: each record is a guarded transition)."""
    hosts = JobHost.__table__.c
    member = (select(hosts.job_id)
              .where(hosts.job_id == _JOBS.c.id, hosts.worker_id == worker_id, hosts.joined_at.is_not(None))
              .exists())
    return or_(_JOBS.c.worker_id == worker_id, member)


def release_hosts(session: Session, job_id: int) -> None:
    """The job stopped holding GPUs: its gang's hosts (and their leases) go with the dispatch."""
    session.execute(delete(JobHost).where(JobHost.job_id == job_id)
                    .execution_options(synchronize_session=False))


def close_allocation(session: Session, job_id: int) -> None:
    """The job stopped holding GPUs: end its open allocation (a no-op when none is open)."""
    session.execute(
        update(Allocation)
        .where(Allocation.job_id == job_id, Allocation.ended_at.is_(None))
        .values(ended_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def set_priority(session: Session, job_id: int, priority: str, team_id: int | None = None) -> JobRead:
    """Change a job's priority class while it waits or runs (a running job's class decides
    whether it can be preempted); a finished job is a :class:`Conflict`."""
    job = get_job(session, job_id, team_id)
    if priority not in PRIORITIES:  # the HTTP schema refuses it first; the CLI may not
        raise InvalidInput(f"priority must be one of {', '.join(PRIORITIES)}", param="priority")
    _refuse_finished(job)
    if priority == job.priority:
        return job
    # The stored spec says the same: a job has one priority, whichever field is read.
    changed = {"priority": priority, "spec": {**job.spec, "priority": priority}}
    message = f"priority {job.priority} -> {priority}"
    return _change_unfinished(session, job, changed, "priority_changed", message,
                              {"from": job.priority, "to": priority})


def set_max_gpu_hours(session: Session, job_id: int, max_gpu_hours: float | None,
                      team_id: int | None = None) -> JobRead:
    """Change (None: remove) the job's own GPU-hour budget, in its row and its stored spec alike,
    in the statuses its priority may change in: raising it is how a job paused at its budget may
    resume; a finished job spends nothing more (a :class:`Conflict`)."""
    job = get_job(session, job_id, team_id)
    _refuse_finished(job)
    resources = dict(job.spec.get("resources", {}))
    previous = resources.pop("max_gpu_hours", None)
    if max_gpu_hours is not None:  # a spec without a budget leaves the field out (JobSpec's exclude_if)
        resources["max_gpu_hours"] = max_gpu_hours
    return _change_unfinished(session, job, {"max_gpu_hours": max_gpu_hours,
                                             "spec": {**job.spec, "resources": resources}},
                              "budget_changed", f"max_gpu_hours {previous} -> {max_gpu_hours}",
                              {"from": previous, "to": max_gpu_hours})


def _refuse_finished(job: JobRead) -> None:
    if not applies(Action.SET_PRIORITY, job.status):
        raise Conflict(f"job {job.id} already {job.status}", param="job_id")


def _change_unfinished(session: Session, job: JobRead, values: dict[str, Any], event: str, message: str,
                       data: dict[str, Any]) -> JobRead:
    """Write ``values`` to the job unless it finished meanwhile (a :class:`Conflict`), with its
    ``event``; the job as it is then."""
    stmt = (
        update(Job)
        .where(Job.id == job.id, Job.status.in_(ACTIONS[Action.SET_PRIORITY]))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if session.execute(stmt).rowcount != 1:
        raise Conflict(f"job {job.id} finished meanwhile", param="job_id")
    add_event(session, job.id, event, message, data)
    return get_job(session, job.id)


def request_cancel(session: Session, job_id: int, team_id: int | None = None) -> JobRead:
    """Queued (or dispatched, not yet claimed) jobs end at once; a running job is asked to stop
    and ends ``cancelled`` after its next checkpoint."""
    get_job(session, job_id, team_id)
    moved = transition(session, job_id, via=Transition.CANCEL, message="cancelled before it ran",
                       values={"finished_at": utcnow()})
    moved = moved or transition(session, job_id, via=Transition.REQUEST_CANCEL, message="cancel requested",
                                values={"cancel_requested": True})
    return moved or _not_moved(session, job_id, Action.CANCEL, "job {id} already {status}")


def request_pause(session: Session, job_id: int, team_id: int | None = None, *, why: str = "",
                  data: dict[str, Any] | None = None) -> JobRead:
    """A waiting (or dispatched, not yet claimed) job is paused at once; a running one is asked to
    checkpoint at its next step and stop (``pausing``), then it is ``paused``. A paused job holds
    no GPU and waits for none until it is resumed. Pausing a paused or pausing job changes nothing.
    ``why`` and ``data`` go into the move's event (a user's pause says nothing more; the
    scheduler's budget pass says which budget)."""
    get_job(session, job_id, team_id)
    because = f": {why}" if why else ""
    moved = transition(session, job_id, via=Transition.PAUSE, message=f"paused before it ran{because}",
                       data=data)
    moved = moved or transition(session, job_id, via=Transition.REQUEST_PAUSE,
                                message=f"pause requested{because}", data=data)
    return moved or _not_moved(session, job_id, Action.PAUSE,
                               "job {id} is {status}: only a waiting or running job can be paused")


def resume(session: Session, job_id: int, team_id: int | None = None) -> JobRead:
    """A paused job goes back to the queue; its next attempt continues from its checkpoint, with
    its attempt budget fresh: the pause ended its last attempt cleanly, not a machine fault."""
    get_job(session, job_id, team_id)
    moved = transition(session, job_id, via=Transition.RESUME, message="resumed: back in the queue",
                       values={"retry_at": None, "attempt_base": _JOBS.c.attempt})
    return moved or _not_moved(session, job_id, Action.RESUME, "job {id} is {status}, not paused")


def retry(session: Session, job_id: int, team_id: int | None = None) -> JobRead:
    """A failed or cancelled job goes back to the queue to continue from its last checkpoint
    (from the start without one), its error cleared and its attempt budget fresh."""
    job = get_job(session, job_id, team_id)
    values = {"finished_at": None, "error_code": None, "error_message": None, "error_traceback": None,
              "cancel_requested": False, "retry_at": None, "attempt_base": _JOBS.c.attempt}
    moved = transition(session, job_id, via=Transition.RETRY, values=values,
                       message=f"retried after it {job.status}", data={"previous_status": job.status})
    return moved or _not_moved(session, job_id, Action.RETRY,
                               "job {id} is {status}: only a failed or cancelled job can be retried")


def _not_moved(session: Session, job_id: int, action: Action, refusal: str) -> JobRead:
    """None of ``action``'s moves could start. Decided by :data:`api.domain.lifecycle.ACTIONS` on the
    status as it is now (the ORM's copy may predate the UPDATEs), so a 409 comes exactly where a
    job read leaves the action out: the job as it is when the action was asked already, else a
    :class:`Conflict` saying ``refusal`` (formatted with ``id`` and ``status``)."""
    row = session.execute(select(*_JOBS.c).where(_JOBS.c.id == job_id)).one()
    status = row.status
    if status in ALREADY_ASKED.get(action, ()):
        return job_read(row)
    if applies(action, status):  # another actor moved it between our read and our UPDATE
        raise Conflict(f"job {job_id} became {status} meanwhile: {action.value} it again", param="job_id")
    raise Conflict(refusal.format(id=job_id, status=status), param="job_id")
