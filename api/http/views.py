"""What each caller may see of a job's server-side detail. Checkpoint folders are absolute
paths on the workers' disks: an admin needs them (to copy a model out); a member is shown only
the checkpoint's name (``step-40``, :meth:`api.schemas.jobs.JobRead.for_member`), in jobs,
checkpoint lists and the events that name a checkpoint."""

from __future__ import annotations

from api.http.auth import Principal
from api.schemas.jobs import CheckpointRead, EventRead, JobRead, checkpoint_name


def job_for(principal: Principal, job: JobRead) -> JobRead:
    return job if principal.is_admin else job.for_member()


def checkpoints_for(principal: Principal, items: list[CheckpointRead]) -> list[CheckpointRead]:
    if principal.is_admin:
        return items
    return [item.model_copy(update={"path": checkpoint_name(item.path)}) for item in items]


def events_for(principal: Principal, items: list[EventRead]) -> list[EventRead]:
    return items if principal.is_admin else [item.for_member() for item in items]
