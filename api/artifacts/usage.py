"""What a team's artifact quota counts (``teams.artifact_quota_bytes``): its jobs' artifacts
(checkpoints, final models, tracker files) and its uploaded files, by one count everywhere: the
worker before each checkpoint (``worker.artifacts``), ``POST /v1/files`` before storing an upload,
and ``GET /v1/me`` for its members.

How each part is counted, cheaply:
  * uploaded files: from SQL (``api.store.files.team_file_bytes``): a row records its size before
    its object is stored, so an upload in flight counts already and no store is asked;
  * job artifacts: from where they are kept. With the local default (the store IS the artifacts
    folder) the files under each job's folder; with a remote store (``GRPO_STORAGE_URL``) a
    listing of each job's prefix, whose sizes are summed (one request per thousand objects of a
    job, a few dozen at most once retention ran; the team's jobs are listed in parallel). The
    worker's own folder is not what counts there: it is that host's work copy.

A file removed while it is counted (retention, a deletion) counts nothing, so a count never fails
for what another process is doing."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from api.artifacts.paths import job_dir, job_prefix, remote_store
from api.settings import Settings
from api.storage import ObjectStore
from grpo_core.io.paths import folder_bytes

# Listings of a remote store in flight at once for one count (each a short request).
LISTING_THREADS = 8


@dataclass(frozen=True)
class ArtifactUsage:
    job_bytes: int  # the team's jobs' artifacts in storage
    file_bytes: int  # its uploaded files (uploading or ready)
    quota: int | None  # None: no limit

    @property
    def total(self) -> int:
        return self.job_bytes + self.file_bytes

    @property
    def room(self) -> int | None:
        """What the quota has left (None: no limit; negative when already over)."""
        return None if self.quota is None else self.quota - self.total

    def over_quota(self, adding: int) -> bool:
        return self.quota is not None and self.total + adding > self.quota

    def parts(self) -> str:
        """The figures a refusal names, so the team sees what to delete."""
        return f"{self.job_bytes} bytes of job artifacts and {self.file_bytes} bytes of uploaded files"


def job_artifact_bytes(settings: Settings, job_ids: Iterable[int]) -> int:
    """Bytes the artifacts of ``job_ids`` take where they are kept (a job that never wrote, or
    whose artifacts were deleted, counts 0). StorageError when a remote store cannot be listed."""
    store = remote_store(settings)
    if store is None:
        return sum(folder_bytes(job_dir(settings, job_id)) for job_id in job_ids)
    with ThreadPoolExecutor(LISTING_THREADS, thread_name_prefix="usage") as pool:
        return sum(pool.map(lambda job_id: _stored_bytes(store, job_id), job_ids))


def _stored_bytes(store: ObjectStore, job_id: int) -> int:
    return sum(info.size for info in store.list(job_prefix(job_id)))
