"""How many bytes a team's job artifacts take: what its artifact quota counts (the worker, before
each checkpoint: ``worker.artifacts``) and what its members read (``GET /v1/me``), by one count.

On disk, under each job's folder of the artifacts root (:mod:`api.artifact_paths`), where the
workers write them; a file removed while it is counted (retention, a deletion) counts nothing, so
a count never fails for what another process is doing."""

from __future__ import annotations

from collections.abc import Iterable

from api.artifact_paths import job_dir
from api.settings import Settings
from grpo_core.io.paths import folder_bytes


def team_artifact_bytes(settings: Settings, job_ids: Iterable[int]) -> int:
    """Bytes under the artifact folders of ``job_ids`` (a job that never wrote, or whose
    artifacts were deleted, counts 0)."""
    return sum(folder_bytes(job_dir(settings, job_id)) for job_id in job_ids)
