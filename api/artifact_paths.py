"""Where a job's artifacts live under ``GRPO_ARTIFACTS_ROOT``: one folder per job, with its
checkpoints (``step-N/`` each), its TensorBoard event files if it reports to TensorBoard, and,
once it has finished, its final model. The worker writes
them and the API streams them, so both ask here."""

from __future__ import annotations

from pathlib import Path

from api.settings import Settings

CHECKPOINTS_DIR, MODEL_DIR, TENSORBOARD_DIR = "checkpoints", "model", "tensorboard"
JOBS_DIR = "jobs"


def job_dir(settings: Settings, job_id: int) -> Path:
    return Path(settings.artifacts_root) / JOBS_DIR / str(job_id)


def job_prefix(job_id: int) -> str:
    """The job's folder as a storage prefix (:mod:`api.storage`): the local default store's root
    is the artifacts root, so it names the same files as :func:`job_dir`."""
    return f"{JOBS_DIR}/{job_id}/"


def checkpoint_dir(settings: Settings, job_id: int) -> Path:
    return job_dir(settings, job_id) / CHECKPOINTS_DIR


def model_dir(settings: Settings, job_id: int) -> Path:
    return job_dir(settings, job_id) / MODEL_DIR


def tensorboard_dir(settings: Settings, job_id: int) -> Path:
    """Where ``report_to: [tensorboard]`` writes (grpo_core.run.tracking names it the same)."""
    return job_dir(settings, job_id) / TENSORBOARD_DIR


COMPLETE_MARK = "trainer_state.json"  # written last into a checkpoint (grpo_core.run.checkpoint)


def complete_checkpoint(settings: Settings, job_id: int, step: int) -> Path | None:
    folder = checkpoint_dir(settings, job_id) / f"step-{step}"
    return folder if (folder / COMPLETE_MARK).is_file() else None


def model_to_continue(settings: Settings, job_id: int, step: int | None) -> Path | None:
    """The folder a ``job:ID[@STEP]`` source loads: that checkpoint, or the job's final model,
    else its newest complete checkpoint (a job stopped before its end has no final model).
    None when there is nothing (yet, or any more: retention deletes old checkpoints)."""
    if step is not None:
        return complete_checkpoint(settings, job_id, step)
    if model_dir(settings, job_id).is_dir():
        return model_dir(settings, job_id)
    root = checkpoint_dir(settings, job_id)
    steps = sorted((int(p.name.removeprefix("step-")) for p in root.glob("step-*")
                    if p.name.removeprefix("step-").isdigit()), reverse=True) if root.is_dir() else []
    return next((found for s in steps if (found := complete_checkpoint(settings, job_id, s))), None)
