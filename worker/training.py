"""What each process of an attempt trains: the job's components (as the only process, or as one
rank of several), resumed from the newest checkpoint, trained to the end or to a stop; and how
the attempt ended. Imported only where torch may load: the job's process and its rank processes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from pydantic import ValidationError

from api.lifecycle import JobStatus
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import bus
from grpo_core.callbacks import CallbackList, TrainerCallback
from grpo_core.components import build_components
from grpo_core.distributed import SINGLE, Ranks
from grpo_core.errors import GRPOError, traceback_tail
from grpo_core.launch import RankDied
from grpo_core.models import quiet_library_progress_bars
from grpo_core.spec import JobSpec
from grpo_core.trainer import GRPOTrainer, TrainResult
from worker.attempt_files import CANCEL, PREEMPT, AttemptFiles
from worker.outcome import Fault, Outcome
from worker.reporting import JobReporter
from worker.retrying import DATABASE_UNAVAILABLE, DatabaseUnavailable


def checkpoint_dir(settings: Settings, job_id: int) -> Path:
    return Path(settings.artifacts_root) / "jobs" / str(job_id) / "checkpoints"


class SupervisorLink(TrainerCallback):
    """The job's side of :mod:`worker.attempt_files`: progress for the supervisor's watchdog
    after every step and every event (training started or resumed, a checkpoint: the model has
    loaded, so the stall limit need only cover one step from there), and its stop request read
    before every step: the supervisor's stop file, or (``asked``) the job's own row, which the
    supervisor would only see at its next poll, several fast steps later."""

    def __init__(self, files: AttemptFiles, step: int = 0,
                 asked: Callable[[], str | None] | None = None) -> None:
        self.files, self.step, self.marks, self.asked = files, step, 0, asked

    def _mark(self) -> None:
        self.marks += 1
        self.files.mark_progress(self.step, self.marks)

    def on_step(self, record: dict[str, Any]) -> None:
        self.step = int(record["step"])
        self._mark()

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        self._mark()

    def should_stop(self) -> bool:
        if self.files.stop_reason() is not None:
            return True
        reason = self.asked() if self.asked else None
        if reason is not None:
            self.files.request_stop(reason)  # so the attempt's ending names why it stopped
        return reason is not None


def run_attempt(job: JobRead, settings: Settings, worker_id: str, files: AttemptFiles) -> Outcome | Fault:
    """Train ``job`` and say how the attempt ended. Every failure of the job's own becomes an
    Outcome with a stable code; a machine fault (a rank process that died, the database away
    longer than the retry budget) becomes a Fault."""
    from worker.ranks import train_on_ranks  # it imports this module

    quiet_library_progress_bars()
    try:
        spec = JobSpec.model_validate(job.spec)
        if len(job.devices or ()) > 1:
            return train_on_ranks(job, spec, settings, files)
        return train_reporting(job, spec, settings, files, SINGLE)
    except RankDied as exc:
        data = {"rank": exc.rank, "pid": exc.pid, "exitcode": exc.exitcode, "signal": exc.signal_name}
        return Fault(exc.message, data)
    except DatabaseUnavailable as exc:  # the infrastructure's fault: resume once it is back
        return Fault(str(exc), {"error_code": DATABASE_UNAVAILABLE}, DATABASE_UNAVAILABLE)
    except ValidationError as exc:
        return failure("invalid_spec", f"stored spec no longer validates: {exc}")
    except GRPOError as exc:
        return failure(exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - any crash must still end the job with a record
        return failure("internal_error", f"{type(exc).__name__}: {exc}")


def failure(code: str, message: str) -> Outcome:
    return Outcome(JobStatus.FAILED, message, code, traceback_tail())


def train_reporting(job: JobRead, spec: JobSpec, settings: Settings, files: AttemptFiles,
                    ranks: Ranks) -> Outcome:
    """Train as the process that reports (the only one, or rank 0): to SQL and the job's stream,
    and to the supervisor through ``files``."""
    client = redis.Redis.from_url(settings.redis_url)
    try:
        publish = bus.publisher(client, settings.stream_maxlen)
        reporter = JobReporter(settings.database_url, job.id, publish, job.attempt, settings.db_retry_seconds)
        callbacks = CallbackList([reporter, SupervisorLink(files, job.last_step, reporter.stop_request)])
        result = train_job(job, spec, settings, callbacks, ranks)
    finally:
        client.close()
    return ending(result, files.stop_reason())


def train_job(job: JobRead, spec: JobSpec, settings: Settings, callbacks: TrainerCallback,
              ranks: Ranks = SINGLE) -> TrainResult:
    """Build, resume and train; every rank of a job runs this with its own ``ranks``."""
    components = build_components(spec, models_root=Path(settings.models_root),
                                  data_root=Path(settings.data_root), device=None, ranks=ranks)
    trainer = GRPOTrainer(components, checkpoint_dir(settings, job.id), callbacks)
    # A requeued or preempted job continues from its newest complete checkpoint.
    trainer.resume()
    return trainer.train()


def ending(result: TrainResult, stop_reason: str | None) -> Outcome:
    """How a run that returned ended: stopped for a cancel or a preemption, or finished."""
    if result.stopped and stop_reason == CANCEL:  # a cancel wins over a preemption
        return Outcome(JobStatus.CANCELLED, f"cancelled at step {result.step}", step=result.step)
    if result.stopped and stop_reason == PREEMPT:
        return Outcome(JobStatus.PREEMPTED, f"preempted at step {result.step}", step=result.step)
    return Outcome(JobStatus.SUCCEEDED, f"finished at step {result.step}", step=result.step)
