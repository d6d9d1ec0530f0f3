"""A team's artifact byte quota (``teams.artifact_quota_bytes``), checked before each checkpoint
so that a team cannot fill the storage that every team's jobs write to.

The quota counts what storage holds, as ``api.artifacts.usage`` says (the same count as
``GET /v1/me`` and the upload check): the team's jobs' artifacts where they are kept (retention
has already removed old checkpoints, so it counts what they really hold) and its uploaded files,
plus the estimated size of the checkpoint about to be written. Over it, the job fails
``artifact_quota_exceeded`` before a byte is written; its earlier checkpoints stay, so once the
quota is raised (or other artifacts removed) it can run again and resume from them.
"""

from __future__ import annotations

import logging

from api.artifacts.usage import ArtifactUsage, job_artifact_bytes
from api.domain.errors import QuotaExceeded
from api.outages import DATABASE_DOWN
from api.settings import Settings
from api.storage import StorageError
from api.store.db import session_scope
from api.store.files import team_file_bytes
from api.store.teams import artifact_quota
from grpo_core.errors import GRPOError
from grpo_core.run.callbacks import TrainerCallback

log = logging.getLogger(__name__)
QUOTA_EXCEEDED = QuotaExceeded.code


class ArtifactQuota(TrainerCallback):
    """Refuses a checkpoint that would take the job's team past its artifact byte quota. The
    quota is read at every checkpoint, so an admin's change applies to running jobs."""

    def __init__(self, settings: Settings, job_id: int, team_id: int) -> None:
        self.settings, self.job_id, self.team_id = settings, job_id, team_id

    def before_checkpoint(self, step: int, estimated_bytes: int) -> None:
        try:
            with session_scope(self.settings.database_url) as session:
                quota, job_ids = artifact_quota(session, self.team_id)
                file_bytes = team_file_bytes(session, self.team_id) if quota is not None else 0
        except DATABASE_DOWN as exc:
            # A database blip must not end the job (issue 11): this checkpoint goes unchecked, the
            # next one is checked again.
            log.warning("job %s: artifact quota not checked at step %s: %s", self.job_id, step, exc)
            return
        if quota is None:
            return
        try:
            usage = ArtifactUsage(job_artifact_bytes(self.settings, job_ids), file_bytes, quota)
        except StorageError as exc:  # as a database blip: the checkpoint's own upload retries the store
            log.warning("job %s: artifact quota not checked at step %s: %s", self.job_id, step, exc)
            return
        if usage.over_quota(estimated_bytes):
            raise GRPOError(
                f"the checkpoint of step {step} (about {estimated_bytes} bytes) would take the team's "
                f"artifacts to {usage.total + estimated_bytes} bytes, over its quota of {quota} bytes "
                f"({usage.parts()} in use, over {len(job_ids)} job(s)); nothing was written. Raise the "
                "quota (grpo admin set-artifact-quota) or delete finished jobs (grpo rm ID) or files "
                "(grpo files rm ID), then resubmit",
                code=QUOTA_EXCEEDED,
            )
