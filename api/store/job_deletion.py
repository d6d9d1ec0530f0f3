"""Deleting a finished job (``DELETE /v1/jobs/{id}``): its rows go, a tombstone stays.

Deleted in the transaction: its events, metrics, samples, kept-checkpoint rows and tags (the
team's data, and the checkpoint rows point at files about to be removed). Kept as a tombstone:
the ``jobs`` row, emptied of the team's data (spec with any inline rows, description, tags,
traceback) and marked ``deleted_at``, which every read hides (``api.store.jobs``), because
  * its allocations are the team's GPU-hours (``GET /v1/usage``): deleting a job must not erase
    what the team used, and they cascade from the job row;
  * its webhook deliveries are owed to the receiver (at least once) and listable as sent.
The caller removes the job's artifacts from storage once this has committed, so no row ever
points at a removed file; a failure there leaves the tombstone and the files, which still count
against the team's quota until a second DELETE (:func:`deletion_target`) or the scheduler's
storage sweep (``api.scheduling.storage_sweeper``) removes them.
"""

from __future__ import annotations

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from api.domain.errors import Conflict, NotFound
from api.domain.job_spec import JOB_SCHEME
from api.domain.lifecycle import TERMINAL_STATUSES
from api.domain.serve_spec import SERVE
from api.domain.spec_sources import job_sources
from api.store.tables import Checkpoint, Job, JobEvent, JobMetric, JobSample, JobTag, utcnow

_CHILD_ROWS = (JobEvent, JobMetric, JobSample, Checkpoint, JobTag)
# Emptied on the tombstone: what the team wrote or the job recorded of its data and host.
_EMPTIED = {"spec": {}, "description": None, "tags": None, "error_traceback": None,
            "latest_checkpoint": None, "idempotency_key": None, "request_hash": None}


# How a job that loads another's model uses it, by the field naming it (a reward's: scores with).
_USES = {"model.source": "continues from", "serve.model": "serves"}


def continuing_jobs(session: Session, job_id: int) -> list[tuple[int, str, str]]:
    """``(id, status, field)`` of the unfinished jobs whose ``model.source`` or a reward's model
    (``rewards.N.args.PATH``: a judge's, a ``multi``'s grader's) is ``job:ID[@STEP]`` of
    ``job_id``: any of them may still load its model (a queued or paused one at its start, a
    running one again if it is requeued before its first checkpoint). Each source is read by the
    parser submit used (:func:`api.domain.job_spec.continued_job`), so however it was written (``job: 7``,
    ``job:07@40``) it names the job it loads."""
    source = Job.spec["model"]["source"].as_string()
    rewards = Job.spec["rewards"]
    # A deleted job is finished: the status alone leaves tombstones out. Only the specs that may
    # name a job are read, and of them only the model's source and the rewards.
    names_a_job = or_(source.startswith(f"{JOB_SCHEME}:"), rewards.as_string().contains(f"{JOB_SCHEME}:"))
    query = select(Job.id, Job.status, source.label("source"), rewards.label("rewards")).where(
        Job.status.not_in(TERMINAL_STATUSES), names_a_job).order_by(Job.id)
    found = []
    for row in session.execute(query):
        named = job_sources({"model": {"source": row.source}, "rewards": row.rewards})
        field = next((field for field, named_id, _ in named if named_id == job_id), None)
        if field is not None:
            found.append((row.id, row.status, field))
    # A serving job (api.domain.serve_spec) loads it at its start, and again after a preemption.
    model = f"{JOB_SCHEME}:{job_id}"
    serves = or_(Job.serve_model == model, Job.serve_model.startswith(f"{model}@"))
    serving = select(Job.id, Job.status).where(Job.kind == SERVE, Job.status.not_in(TERMINAL_STATUSES),
                                                serves)
    found += [(row.id, row.status, "serve.model") for row in session.execute(serving)]
    return sorted(found)


def hold_against_deletion(session: Session, job_id: int) -> bool:
    """Keep ``job_id`` from being deleted until the caller's transaction ends (a shared row lock,
    which :func:`deletion_target`'s exclusive one waits for, so the deletion then sees the new job
    that continues from it); False when it was deleted meanwhile."""
    query = select(Job.id).where(Job.id == job_id, Job.deleted_at.is_(None)).with_for_update(read=True)
    return session.execute(query).first() is not None


def deletion_target(session: Session, job_id: int, team_id: int | None) -> bool:
    """Lock the job for deletion; True when it is still to be tombstoned, False when it already
    is (a DELETE retried after its artifacts could not be removed). :class:`NotFound` for another
    team's job; :class:`Conflict` naming the status of a job not finished."""
    row = session.execute(select(Job.team_id, Job.status, Job.deleted_at)
                          .where(Job.id == job_id).with_for_update()).first()
    if row is None or (team_id is not None and row.team_id != team_id):
        raise NotFound(f"job {job_id} not found", param="job_id")
    if row.deleted_at is not None:
        return False
    if row.status not in TERMINAL_STATUSES:
        raise Conflict(f"job {job_id} is {row.status}: only a succeeded, failed or cancelled job can be "
                       "deleted (cancel it first)", param="job_id")
    if continuing := continuing_jobs(session, job_id):
        named = "; ".join(f"job {other} ({status}) "
                          f"{_USES.get(field, 'scores with')} job {job_id}'s "
                          f"model ({field} job:{job_id})" for other, status, field in continuing)
        raise Conflict(f"{named}; cancel it or let it finish first", param="job_id")
    return True


def undeleted_jobs(session: Session, job_ids: list[int]) -> set[int]:
    """Those of ``job_ids`` that have a row and are not deleted: the storage sweep removes the
    artifacts of the others (a deletion whose storage step failed, or no row at all)."""
    return set(session.scalars(select(Job.id).where(Job.id.in_(job_ids), Job.deleted_at.is_(None))))


def tombstone(session: Session, job_id: int) -> None:
    """Delete the job's rows and empty its own (after :func:`deletion_target` said so)."""
    for table in _CHILD_ROWS:
        rows = delete(table).where(table.job_id == job_id)
        session.execute(rows.execution_options(synchronize_session=False))
    session.execute(update(Job).where(Job.id == job_id).values(deleted_at=utcnow(), **_EMPTIED)
                    .execution_options(synchronize_session=False))
