"""What an attempt writes besides its checkpoints, staged in its own folder and published under
the fence (:mod:`worker.fencing`): the final model, the trackers' files; and, before it resumes,
the job's folder brought back to what was published (a folder no SQL row names is an attempt's
that lost the job, and no reader may take it for the job's).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Collection
from pathlib import Path

from api.artifacts.paths import (
    CHECKPOINTS_DIR,
    MODEL_DIR,
    STAGING_DIR,
    Published,
    checkpoint_dir,
    job_dir,
    model_dir,
    staging_dir,
)
from api.settings import Settings
from api.storage import ObjectStore
from api.store.db import session_scope
from api.store.telemetry import published_artifacts
from grpo_core.run.callbacks import TrainerCallback
from worker.fencing import AttemptFence
from worker.job_storage import job_file_keys, store_job_files
from worker.retrying import retry_transient

log = logging.getLogger(__name__)
TRACKERS_DIR, MODEL_STAGE = "trackers", "model"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def published_of(settings: Settings, job_id: int) -> Published:
    """What the job's attempts published (:func:`api.store.telemetry.published_artifacts`)."""
    def read() -> Published:
        with session_scope(settings.database_url) as session:
            return published_artifacts(session, job_id)

    return retry_transient(read, settings.db_retry_seconds, f"job {job_id}: its published artifacts")


def drop_unpublished_checkpoints(fence: AttemptFence, settings: Settings, job_id: int,
                                 published: Collection[int]) -> None:
    """Remove from the job's checkpoints folder what no row names (an attempt's that lost the job
    between its rename and its row, or a writer's leftover), so that the resume, which takes the
    newest folder, takes the newest published one."""
    root = checkpoint_dir(settings, job_id)
    if not root.is_dir():
        return
    strays = [path for path in root.iterdir()
              if not ((m := _STEP_DIR.match(path.name)) and int(m.group(1)) in published)]
    if strays:
        log.warning("job %s: removing %s, which no attempt published", job_id, [p.name for p in strays])
        fence.hold("unpublished checkpoint folders", lambda: [
            shutil.rmtree(p) if p.is_dir() else p.unlink() for p in strays])


def clear_staging(settings: Settings, job_id: int, attempt: int | None = None) -> None:
    """Remove the job's staging folders: every attempt's before ``attempt`` (they wrote nothing
    anyone reads, and their processes, if alive, can publish nothing), or all with None."""
    root = Path(settings.artifacts_root) / STAGING_DIR
    if not root.is_dir():
        return
    prefix = f"job-{job_id}-attempt-"
    for path in root.iterdir():
        number = path.name.removeprefix(prefix)
        if path.name.startswith(prefix) and number.isdigit() and (attempt is None or int(number) < attempt):
            shutil.rmtree(path, ignore_errors=True)


class StagedFiles(TrainerCallback):
    """The attempt's trackers write in its staging folder (a copy of what the job's earlier
    attempts published first, for the trackers that append to one run); each checkpoint and the
    attempt's end publish a copy of them into the job's folder, and, with an object store, its end
    stores them."""

    def __init__(self, fence: AttemptFence, settings: Settings, job_id: int, attempt: int) -> None:
        self.fence, self.settings, self.job_id, self.attempt = fence, settings, job_id, attempt
        self.staging = staging_dir(settings, job_id, attempt)
        self.trackers = self.staging / TRACKERS_DIR
        published = job_dir(settings, job_id)
        self.trackers.mkdir(parents=True, exist_ok=True)
        if published.is_dir():
            for folder in published.iterdir():
                if folder.is_dir() and folder.name not in (CHECKPOINTS_DIR, MODEL_DIR):
                    shutil.copytree(folder, self.trackers / folder.name, dirs_exist_ok=True)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.publish_trackers()

    def publish_trackers(self) -> None:
        for folder in sorted(self.trackers.iterdir()):
            copy = self.staging / f".{folder.name}.publishing"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(folder, copy)
            aside = self.staging / f".{folder.name}.replaced"
            shutil.rmtree(aside, ignore_errors=True)
            self.fence.publish_folder(copy, job_dir(self.settings, self.job_id) / folder.name,
                                      f"the {folder.name} files", aside)
            shutil.rmtree(aside, ignore_errors=True)

    def store_trackers(self, store: ObjectStore) -> None:
        """The published tracker folders into the store, while this attempt owns the job."""
        settings, job_id, attempt = self.settings, self.job_id, self.attempt

        def undo() -> None:  # this attempt's own keys: never another attempt's copy
            for _folder, key in job_file_keys(settings, job_id, attempt):
                store.delete_prefix(key)

        self.fence.hold("the trackers' files", lambda: store_job_files(store, settings, job_id, attempt),
                        undo)

    def model_stage(self) -> Path:
        """Where the final model is exported before :meth:`publish_model`."""
        return self.staging / MODEL_STAGE

    def publish_model(self) -> Path:
        final = model_dir(self.settings, self.job_id)
        aside = self.staging / f".{MODEL_STAGE}.replaced"
        self.fence.publish_folder(self.model_stage(), final, "the model folder", aside)
        shutil.rmtree(aside, ignore_errors=True)
        return final
