"""Where a job's artifacts live under ``GRPO_ARTIFACTS_ROOT``: one folder per job, with its
checkpoints (``step-N/`` each), its TensorBoard event files if it reports to TensorBoard, and,
once it has finished, its final model. The worker writes
them and the API streams them, so both ask here.

With ``GRPO_STORAGE_URL`` naming a store other than that folder (a bucket), the folder is each
process's own work folder and the store holds the artifacts under the same relative names, each
scoped by the attempt that stored it (``jobs/ID/checkpoints/step-N.attempt-A/...``,
:func:`attempt_scoped`; SQL's rows name the attempt, :class:`Published`): :func:`remote_store` is
that store, None when the store IS the artifacts folder (the default), where nothing is copied
and a rename that never replaces publishes (:mod:`worker.fencing`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
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


def attempt_scoped(key: str, attempt: int | None) -> str:
    """``key`` as attempt ``attempt`` stores it in a store apart from the artifacts folder: under a
    name of its own (``KEY.attempt-A``), so that a stale attempt's upload (a process frozen
    halfway, thawed after the job moved) neither replaces nor mixes with the owner's, and undoing
    it deletes only its own objects. SQL names which attempt's key is the job's
    (:class:`Published`). None: written before attempts were recorded, under the plain key."""
    return key if attempt is None else f"{key}.attempt-{attempt}"


def checkpoint_key(job_id: int, step: int, attempt: int | None) -> str:
    return attempt_scoped(f"jobs/{job_id}/{CHECKPOINTS_DIR}/step-{step}", attempt)


def model_key(job_id: int, attempt: int | None) -> str:
    return attempt_scoped(f"jobs/{job_id}/{MODEL_DIR}", attempt)


@dataclass(frozen=True)
class Published:
    """What the job's attempts published while they owned it, as SQL records it: each kept
    checkpoint's step and the attempt that stored it, and, once the job succeeded, the attempt
    whose final model is the job's (None before, or for a job that ended otherwise)."""

    checkpoints: dict[int, int | None] = field(default_factory=dict)
    model_attempt: int | None = None


def stored_model_to_continue(store: ObjectStore, job_id: int, step: int | None,
                             published: Published) -> str | None:
    """:func:`model_to_continue` in the store: the key of the folder to load, or None. Only what
    SQL says an attempt published (a stale attempt's objects are under keys no row names)."""
    steps = sorted(published.checkpoints)
    if step is not None:
        return checkpoint_key(job_id, step, published.checkpoints[step]) if step in steps else None
    model = stored_model(store, job_id, published)
    if model is not None:
        return model
    return checkpoint_key(job_id, steps[-1], published.checkpoints[steps[-1]]) if steps else None


def stored_model(store: ObjectStore, job_id: int, published: Published) -> str | None:
    """The key of the job's final model in the store, whole (its card stored last), or None.
    Models stored before keys named their attempt are under the plain key."""
    if published.model_attempt is None:
        return None
    for key in (model_key(job_id, published.model_attempt), model_key(job_id, None)):
        if store.exists(f"{key}/{MODEL_MARK}"):
            return key
    return None


def stored_tracker_folder(store: ObjectStore, job_id: int, name: str, attempt: int) -> str | None:
    """The key of the job's tracker folder ``name`` (e.g. ``tensorboard``) in the store: the copy
    of the newest attempt up to ``attempt`` (the job's) that stored one, each attempt storing its
    own (:func:`attempt_scoped`); else one stored before keys named attempts; None if none."""
    base, scoped = f"jobs/{job_id}/", f"{name}.attempt-"
    folders = set(store.folders(base))
    attempts = [int(number) for folder in folders
                if folder.startswith(scoped) and (number := folder.removeprefix(scoped)).isdigit()
                and int(number) <= attempt]
    if attempts:
        return base + attempt_scoped(name, max(attempts))
    return base + name if name in folders else None


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


def has_model_to_continue(settings: Settings, job_id: int, step: int | None, published: Published) -> bool:
    """Whether a ``job:ID[@STEP]`` source has something to load, wherever the artifacts are kept
    (StorageUnavailable when the store cannot say)."""
    store = remote_store(settings)
    if store is None:
        return model_to_continue(settings, job_id, step, published.checkpoints) is not None
    return stored_model_to_continue(store, job_id, step, published) is not None
