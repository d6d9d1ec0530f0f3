"""What each process of an attempt trains: the job's components (as the only process, or as one
rank of several), resumed from the newest checkpoint, trained to the end or to a stop; and how
the attempt ended. Imported only where torch may load: the job's child and its rank processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from api.lifecycle import JobStatus
from api.schemas.jobs import JobRead
from api.settings import Settings
from grpo_core.callbacks import TrainerCallback
from grpo_core.components import build_components
from grpo_core.distributed import SINGLE, Ranks
from grpo_core.spec import JobSpec
from grpo_core.trainer import GRPOTrainer, TrainResult
from worker.heartbeat import JobLease


@dataclass
class Outcome:
    status: JobStatus  # succeeded | failed | cancelled | preempted
    message: str
    error_code: str | None = None
    traceback: str | None = None
    step: int = 0


def checkpoint_dir(settings: Settings, job_id: int) -> Path:
    return Path(settings.artifacts_root) / "jobs" / str(job_id) / "checkpoints"


def train_job(job: JobRead, spec: JobSpec, settings: Settings, callbacks: TrainerCallback,
              ranks: Ranks = SINGLE) -> TrainResult:
    """Build, resume and train; every rank of a job runs this with its own ``ranks``."""
    components = build_components(spec, models_root=Path(settings.models_root),
                                  data_root=Path(settings.data_root), device=None, ranks=ranks)
    trainer = GRPOTrainer(components, checkpoint_dir(settings, job.id), callbacks)
    # A requeued or preempted job continues from its newest complete checkpoint.
    trainer.resume()
    return trainer.train()


def ending(result: TrainResult, lease: JobLease) -> Outcome:
    """How a run that returned ended: stopped for a cancel or a preemption, or finished."""
    if result.stopped and lease.cancel_requested:  # a cancel wins over a preemption
        return Outcome(JobStatus.CANCELLED, f"cancelled at step {result.step}", step=result.step)
    if result.stopped and lease.preempt_requested:
        return Outcome(JobStatus.PREEMPTED, f"preempted at step {result.step}", step=result.step)
    return Outcome(JobStatus.SUCCEEDED, f"finished at step {result.step}", step=result.step)
