"""One attempt at a claimed job, inside the job's child process: train (in this process, or on
one rank per device for a job holding several) and record the outcome. This is the only worker
module the task body imports that loads torch (through ``grpo_core``), and the task body imports
it only in the job's child, so the Celery main process never loads it.
"""

from __future__ import annotations

import logging

import redis
from pydantic import ValidationError

from api.lifecycle import JobStatus
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import bus, outbox
from api.store.db import session_scope
from api.store.jobs import finish, requeue_after_fault
from api.store.scheduling import yield_preempted
from grpo_core.errors import GRPOError, traceback_tail
from grpo_core.launch import RankDied
from grpo_core.models import quiet_library_progress_bars
from grpo_core.spec import JobSpec
from worker.heartbeat import JobLease, LeaseLost
from worker.ranks import train_on_ranks
from worker.reporting import JobReporter
from worker.training import Outcome, ending, train_job

log = logging.getLogger(__name__)


def _failure(code: str, message: str) -> Outcome:
    return Outcome(JobStatus.FAILED, message, code, traceback_tail())


def train(job: JobRead, settings: Settings, reporter: JobReporter, lease: JobLease) -> Outcome:
    """Every failure becomes an Outcome with a stable code; only a lost lease and a rank process
    that died (the machine's fault, not the job's) propagate."""
    quiet_library_progress_bars()
    try:
        spec = JobSpec.model_validate(job.spec)
        if len(job.devices or ()) > 1:
            return train_on_ranks(job, spec, settings, lease.worker_id)
        result = train_job(job, spec, settings, reporter)
    except (LeaseLost, RankDied):
        raise
    except ValidationError as exc:
        return _failure("invalid_spec", f"stored spec no longer validates: {exc}")
    except GRPOError as exc:
        return _failure(exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - any crash must still end the job with a record
        return _failure("internal_error", f"{type(exc).__name__}: {exc}")
    return ending(result, lease)


def run_claimed_job(job: JobRead, worker_id: str, settings: Settings, lease: JobLease,
                    client: redis.Redis) -> str:
    """Run ``job`` (claimed by ``worker_id``, lease renewing) and return its final status, or
    ``lost`` when another attempt owns it now."""
    publish = bus.publisher(client, settings.stream_maxlen)
    try:
        outcome = train(job, settings, JobReporter(settings.database_url, job.id, publish, lease), lease)
    except LeaseLost as exc:
        log.warning("%s; leaving the job to its new attempt", exc)
        return "lost"
    except RankDied as exc:
        lease.stop()
        return _requeue(job, worker_id, settings, publish, exc)
    lease.stop()  # no renewal may race the outcome: it is the attempt's last write
    # The transition stages the final status: readers learn it after the commit, and find it
    # (and every step) in SQL.
    with session_scope(settings.database_url, publish=publish) as session:
        if outcome.status is JobStatus.PREEMPTED:  # checkpointed: back to the queue, to resume from it
            recorded = yield_preempted(session, job.id, worker_id, outcome.step)
        else:
            recorded = finish(session, job.id, worker_id=worker_id, outcome=outcome.status,
                              message=outcome.message, error_code=outcome.error_code,
                              error_message=outcome.message if outcome.error_code else None,
                              traceback=outcome.traceback) is not None
    if not recorded:
        log.warning("job %s: lease lost before its outcome (%s) was recorded", job.id, outcome.status)
        return "lost"
    log.info("job %s %s: %s", job.id, outcome.status, outcome.message)
    return outcome.status.value


def _requeue(job: JobRead, worker_id: str, settings: Settings, publish: outbox.Publish,
             died: RankDied) -> str:
    """A rank process died: the machine's fault, so the job goes back to the queue now (bounded by
    ``max_attempts``) to resume from its checkpoint, rather than when its lease expires."""
    data = {"rank": died.rank, "pid": died.pid, "exitcode": died.exitcode, "signal": died.signal_name}
    with session_scope(settings.database_url, publish=publish) as session:
        moved = requeue_after_fault(session, job.id, worker_id=worker_id, message=died.message, data=data,
                                    max_attempts=settings.max_attempts)
    if moved is None:
        log.warning("job %s: lease lost before its rank's death was recorded (%s)", job.id, died.message)
        return "lost"
    log.warning("job %s %s: %s", job.id, moved.status, died.message)
    return moved.status
