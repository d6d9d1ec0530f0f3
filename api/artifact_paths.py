"""Where a job's artifacts live under ``GRPO_ARTIFACTS_ROOT``: one folder per job, with its
checkpoints (``step-N/`` each) and, once it has finished, its final model. The worker writes
them and the API streams them, so both ask here."""

from __future__ import annotations

from pathlib import Path

from api.settings import Settings

CHECKPOINTS_DIR, MODEL_DIR = "checkpoints", "model"


def job_dir(settings: Settings, job_id: int) -> Path:
    return Path(settings.artifacts_root) / "jobs" / str(job_id)


def checkpoint_dir(settings: Settings, job_id: int) -> Path:
    return job_dir(settings, job_id) / CHECKPOINTS_DIR


def model_dir(settings: Settings, job_id: int) -> Path:
    return job_dir(settings, job_id) / MODEL_DIR
