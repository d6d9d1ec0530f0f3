"""Where a job's artifacts live under ``GRPO_ARTIFACTS_ROOT``: one folder per job, with its
checkpoints (``step-N/`` each), its TensorBoard event files if it reports to TensorBoard, and,
once it has finished, its final model. The worker writes
them and the API streams them, so both ask here.

With ``GRPO_STORAGE_URL`` naming a store other than that folder (a bucket), the folder is each
process's own work folder and the store holds the artifacts under the same relative names
(``jobs/ID/checkpoints/step-N/...``): :func:`remote_store` is that store, None when the store IS
the artifacts folder (the default), where nothing is copied."""

from __future__ import annotations

from collections.abc import Collection
from functools import lru_cache
from pathlib import Path

from api.settings import Settings
from api.storage import ObjectStore, open_store, parse_location

CHECKPOINTS_DIR, MODEL_DIR, TENSORBOARD_DIR = "checkpoints", "model", "tensorboard"
JOBS_DIR = "jobs"


def job_dir(settings: Settings, job_id: int) -> Path:
    return Path(settings.artifacts_root) / JOBS_DIR / str(job_id)


def job_prefix(job_id: int) -> str:
    """The job's folder as a storage prefix (:mod:`api.storage`): the local default store's root
    is the artifacts root, so it names the same files as :func:`job_dir`."""
    return f"{JOBS_DIR}/{job_id}/"


STAGING_DIR = ".attempts"


def staging_dir(settings: Settings, job_id: int, attempt: int) -> Path:
    """Where attempt ``attempt`` of the job writes before it publishes (:mod:`worker.fencing`):
    beside the jobs' folders, on their file system (a rename publishes), never inside the job's
    folder, which holds only what an attempt published while it owned the job."""
    return Path(settings.artifacts_root) / STAGING_DIR / f"job-{job_id}-attempt-{attempt}"


def checkpoint_dir(settings: Settings, job_id: int) -> Path:
    return job_dir(settings, job_id) / CHECKPOINTS_DIR


def model_dir(settings: Settings, job_id: int) -> Path:
    return job_dir(settings, job_id) / MODEL_DIR


def tensorboard_dir(settings: Settings, job_id: int) -> Path:
    """Where ``report_to: [tensorboard]`` writes (grpo_core.run.tracking names it the same)."""
    return job_dir(settings, job_id) / TENSORBOARD_DIR


COMPLETE_MARK = "trainer_state.json"  # written last into a checkpoint (grpo_core.run.checkpoint)
MODEL_MARK = "README.md"  # the model card: stored last of a final model's files


def remote_store(settings: Settings) -> ObjectStore | None:
    """The store artifacts are copied to, or None when it is the artifacts folder itself."""
    location = parse_location(settings.storage_location)
    artifacts = Path(settings.artifacts_root).resolve()
    if location.scheme == "file" and Path(location.prefix).resolve() == artifacts:
        return None
    return object_store(settings)


def object_store(settings: Settings) -> ObjectStore:
    """The store itself, whichever it is (by default the artifacts folder): where uploaded files
    are read from, which every store holds under the same keys."""
    return _opened(settings.storage_location)


@lru_cache(maxsize=4)
def _opened(url: str) -> ObjectStore:
    # One client per process and URL: a bucket's client keeps its connections between calls.
    return open_store(url)


def artifact_key(settings: Settings, path: Path) -> str:
    """The key of a file or folder under the artifacts folder: its relative path."""
    return Path(path).resolve().relative_to(Path(settings.artifacts_root).resolve()).as_posix()


def checkpoint_key(job_id: int, step: int) -> str:
    return f"jobs/{job_id}/{CHECKPOINTS_DIR}/step-{step}"


def model_key(job_id: int) -> str:
    return f"jobs/{job_id}/{MODEL_DIR}"


def stored_checkpoint_steps(store: ObjectStore, job_id: int) -> list[int]:
    """The steps of the job's checkpoints that are whole in ``store`` (their mark stored, which
    is stored last), oldest first."""
    base = f"jobs/{job_id}/{CHECKPOINTS_DIR}/"
    steps = set()
    for info in store.list(base):
        folder, _, name = info.key.removeprefix(base).partition("/")
        number = folder.removeprefix("step-")
        if name == COMPLETE_MARK and folder.startswith("step-") and number.isdigit():
            steps.add(int(number))
    return sorted(steps)


def complete_checkpoint(settings: Settings, job_id: int, step: int) -> Path | None:
    folder = checkpoint_dir(settings, job_id) / f"step-{step}"
    return folder if (folder / COMPLETE_MARK).is_file() else None


def model_to_continue(settings: Settings, job_id: int, step: int | None,
                      published: Collection[int] | None = None) -> Path | None:
    """The folder a ``job:ID[@STEP]`` source loads: that checkpoint, or the job's final model,
    else its newest complete checkpoint (a job stopped before its end has no final model).
    None when there is nothing (yet, or any more: retention deletes old checkpoints). Given
    ``published`` (the steps with a row, the worker's view), only a checkpoint an attempt published."""
    if step is not None:
        return complete_checkpoint(settings, job_id, step) if published is None or step in published else None
    if model_dir(settings, job_id).is_dir():
        return model_dir(settings, job_id)
    root = checkpoint_dir(settings, job_id)
    steps = sorted((int(p.name.removeprefix("step-")) for p in root.glob("step-*")
                    if p.name.removeprefix("step-").isdigit()), reverse=True) if root.is_dir() else []
    steps = [s for s in steps if published is None or s in published]
    return next((found for s in steps if (found := complete_checkpoint(settings, job_id, s))), None)


def stored_model_to_continue(store: ObjectStore, job_id: int, step: int | None,
                             published: Collection[int] | None = None) -> str | None:
    """:func:`model_to_continue` in the store: the key of the folder to load, or None."""
    steps = [s for s in stored_checkpoint_steps(store, job_id) if published is None or s in published]
    if step is not None:
        return checkpoint_key(job_id, step) if step in steps else None
    if store.exists(f"{model_key(job_id)}/{MODEL_MARK}"):
        return model_key(job_id)
    return checkpoint_key(job_id, steps[-1]) if steps else None


def has_model_to_continue(settings: Settings, job_id: int, step: int | None) -> bool:
    """Whether a ``job:ID[@STEP]`` source has something to load, wherever the artifacts are kept
    (StorageUnavailable when the store cannot say)."""
    store = remote_store(settings)
    if store is None:
        return model_to_continue(settings, job_id, step) is not None
    return stored_model_to_continue(store, job_id, step) is not None
