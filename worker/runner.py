"""One attempt at a claimed job, inside the job's child process: build, (resume,) train, record
the outcome. This is the only worker module that imports torch (through ``grpo_core``), and it is
imported only by the task body, so the Celery main process never loads it.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from pathlib import Path

import redis
from pydantic import ValidationError

from api.lifecycle import JobStatus
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import bus
from api.store.db import session_scope
from api.store.jobs import finish
from api.store.scheduling import yield_preempted
from grpo_core.components import build_components
from grpo_core.errors import GRPOError
from grpo_core.models import quiet_library_progress_bars
from grpo_core.spec import JobSpec
from grpo_core.trainer import GRPOTrainer
from worker.heartbeat import JobLease, LeaseLost
from worker.reporting import JobReporter

TRACEBACK_LINES = 30
log = logging.getLogger(__name__)


@dataclass
class Outcome:
    status: JobStatus  # succeeded | failed | cancelled | preempted
    message: str
    error_code: str | None = None
    traceback: str | None = None
    step: int = 0


def checkpoint_dir(settings: Settings, job_id: int) -> Path:
    return Path(settings.artifacts_root) / "jobs" / str(job_id) / "checkpoints"


def _failure(code: str, message: str) -> Outcome:
    lines = traceback.format_exc().rstrip().splitlines()
    return Outcome(JobStatus.FAILED, message, code, "\n".join(lines[-TRACEBACK_LINES:]))


def train(job: JobRead, settings: Settings, reporter: JobReporter, lease: JobLease) -> Outcome:
    """Every failure becomes an Outcome with a stable code; only a lost lease propagates."""
    quiet_library_progress_bars()
    try:
        spec = JobSpec.model_validate(job.spec)
        components = build_components(spec, models_root=Path(settings.models_root),
                                      data_root=Path(settings.data_root), device=None)
        trainer = GRPOTrainer(components, checkpoint_dir(settings, job.id), reporter)
        # A requeued or preempted job continues from its newest complete checkpoint.
        trainer.resume()
        result = trainer.train()
    except LeaseLost:
        raise
    except ValidationError as exc:
        return _failure("invalid_spec", f"stored spec no longer validates: {exc}")
    except GRPOError as exc:
        return _failure(exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - any crash must still end the job with a record
        return _failure("internal_error", f"{type(exc).__name__}: {exc}")
    if result.stopped and lease.cancel_requested:  # a cancel wins over a preemption
        return Outcome(JobStatus.CANCELLED, f"cancelled at step {result.step}", step=result.step)
    if result.stopped and lease.preempt_requested:
        return Outcome(JobStatus.PREEMPTED, f"preempted at step {result.step}", step=result.step)
    return Outcome(JobStatus.SUCCEEDED, f"finished at step {result.step}", step=result.step)


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
