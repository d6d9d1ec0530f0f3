"""A job's artifacts between the worker's own folder and a store it shares with the API
(``GRPO_STORAGE_URL`` other than ``GRPO_ARTIFACTS_ROOT``, :func:`api.artifacts.paths.remote_store`):
the worker trains in its artifacts folder as with the default, and copies there what it resumes
from and to the store what it wrote. With the default store nothing here runs: the store is
that folder.

A store that cannot be reached (:class:`~api.storage.StorageUnavailable`) is retried with backoff
for ``GRPO_STORAGE_RETRY_SECONDS``, then raised: the attempt ends as the infrastructure's fault
(:mod:`worker.attempt`), never as the job's.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from api.artifacts.paths import (
    CHECKPOINTS_DIR,
    COMPLETE_MARK,
    MODEL_DIR,
    MODEL_MARK,
    artifact_key,
    attempt_scoped,
    checkpoint_dir,
    checkpoint_key,
    job_dir,
    model_dir,
    model_key,
    staging_dir,
)
from api.settings import Settings
from api.storage import ObjectStore, StorageUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

STORAGE_UNAVAILABLE = "storage_unavailable"
FIRST_DELAY_SECONDS, MOST_DELAY_SECONDS = 0.5, 30.0


def retry_storage(fn: Callable[[], T], budget_seconds: float, what: str,
                  sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, tried again while the store is unavailable (0.5 s doubling to 30 s, jittered)
    until it succeeds or ``budget_seconds`` have passed: then the last StorageUnavailable."""
    deadline, delay = time.monotonic() + budget_seconds, FIRST_DELAY_SECONDS
    while True:
        try:
            return fn()
        except StorageUnavailable as error:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageUnavailable(f"the object store was unreachable for {budget_seconds:g} s "
                                         f"({what}): {error}") from error
            log.warning("%s: the object store is unavailable, retrying: %s", what, error)
            sleep(min(left, delay * random.uniform(0.5, 1.0)))
            delay = min(MOST_DELAY_SECONDS, delay * 2)


def fetch_resume_checkpoint(store: ObjectStore, settings: Settings, job_id: int,
                            published: dict[int, int | None], best_step: int | None = None) -> Path | None:
    """Make the job's local checkpoints folder hold exactly the newest checkpoint an attempt
    published while it owned the job (``published``: each row's step and the attempt whose key
    holds it), and the job's best eval point's (``best_step``, grpo.metric_for_best_model: its
    final model may be that one's), each downloaded unless this host has it already; return the
    newest, or None when there is none. A local checkpoint no row names (its upload never finished,
    or a stale attempt's) is removed: the job resumes from what every worker can see."""
    step = max(published, default=None)
    local = checkpoint_dir(settings, job_id)
    wanted = {s for s in (step, best_step) if s is not None and s in published}
    keep = {local / f"step-{s}": s for s in wanted}
    if local.is_dir():
        for path in local.iterdir():
            if path not in keep or not (path / COMPLETE_MARK).is_file():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    for folder, kept in keep.items():
        if not folder.is_dir():
            retry_storage(lambda folder=folder, kept=kept: store.get_folder(
                checkpoint_key(job_id, kept, published[kept]), folder),
                settings.storage_retry_seconds, f"job {job_id}: downloading the checkpoint of step {kept}")
    return None if step is None else local / f"step-{step}"


def fetch_folder(store: ObjectStore, settings: Settings, key: str) -> Path:
    """The stored folder ``key`` in this worker's artifacts folder under the same name, downloaded
    unless it is there already (a ``job:`` source: another job's model or checkpoint, which never
    changes once stored). ObjectNotFound when the store has nothing under ``key``."""
    local = Path(settings.artifacts_root) / key
    if not local.is_dir():
        try:
            retry_storage(lambda: store.get_folder(key, local), settings.storage_retry_seconds,
                          f"downloading {key}")
        except FileExistsError:  # another job on this host fetched it meanwhile
            pass
    return local


def store_final_model(store: ObjectStore, settings: Settings, job_id: int, attempt: int) -> None:
    """The job's exported model folder into the store under the attempt's key, its card last: the
    API serves the model once the card is there (and the job succeeded as this attempt), so never
    a part of one."""
    retry_storage(lambda: store.put_folder(model_key(job_id, attempt), model_dir(settings, job_id),
                                           last=[MODEL_MARK]),
                  settings.storage_retry_seconds, f"job {job_id}: storing its final model")


def store_job_files(store: ObjectStore, settings: Settings, job_id: int, attempt: int) -> None:
    """What else the job's trackers wrote beside its checkpoints and model (TensorBoard, W&B's
    offline run, MLflow's store), each folder as it is now, under the attempt's keys: called at the
    end of every attempt, whose copy (the earlier attempts' files and its own) readers then take
    (:func:`api.artifacts.paths.stored_tracker_folder`). Best effort: a
    store away for the whole budget is logged, not raised, since requeuing a job for its charts
    would train nothing, and here it would hide the error that ended the attempt."""
    for folder, key in job_file_keys(settings, job_id, attempt):
        try:
            retry_storage(lambda f=folder, k=key: store.put_folder(k, f),
                          settings.storage_retry_seconds, f"job {job_id}: storing {folder.name}")
        except StorageUnavailable as error:
            log.error("job %s: its %s files were not stored: %s", job_id, folder.name, error)


def job_file_keys(settings: Settings, job_id: int, attempt: int) -> list[tuple[Path, str]]:
    """The job's tracker folders in this worker's artifacts folder, each with the key attempt
    ``attempt`` stores it under."""
    root = job_dir(settings, job_id)
    if not root.is_dir():
        return []
    return [(folder, attempt_scoped(artifact_key(settings, folder), attempt))
            for folder in sorted(root.iterdir())
            if folder.is_dir() and folder.name not in (CHECKPOINTS_DIR, MODEL_DIR)]


def drop_local_copies(settings: Settings, job_id: int, attempt: int) -> None:
    """At the end of an attempt, once its uploads are over: the job's folder and the attempt's
    staging folder removed from this worker's artifacts folder, which is only its work folder
    (the store holds every checkpoint a row names, the final model and the trackers' files, and a
    resume fetches from there). A long-lived worker's disk then holds no job it ever ran. Only
    with a store apart from the folder: call it after :func:`api.artifacts.paths.remote_store`."""
    for folder in (job_dir(settings, job_id), staging_dir(settings, job_id, attempt)):
        shutil.rmtree(folder, ignore_errors=True)
