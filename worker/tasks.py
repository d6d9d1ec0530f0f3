"""Celery tasks: thin. Take an id, claim the row, hand over to :mod:`worker.runner`.

The claim is one guarded UPDATE (``dispatched → running``), so a duplicate delivery of the same
message finds the job already running (or finished) and returns without touching anything; so
does a late delivery of an earlier dispatch (each message carries its dispatch's number), once the
job was dispatched again because that message was not claimed in time. A gang's other hosts join
it instead (one guarded UPDATE of their own row), and run their part.
The task's process supervises the job's own process (:mod:`worker.runner`,
:mod:`worker.supervisor`), which it confines to the job's devices first
(:func:`worker.devices.confine`: the job's process inherits the environment). Torch never loads in
Celery's processes.
"""

from __future__ import annotations

import logging
import os

from celery import shared_task
from sqlalchemy.orm import Session

from api.domain.lifecycle import JobStatus
from api.schemas.jobs import JobRead
from api.settings import Settings, get_settings
from api.store import bus, outbox
from api.store.attempts import claim, finish
from api.store.db import session_scope
from api.store.gangs import HostPart, join, mark_joined, part_of
from api.store.jobs import get_job
from api.store.telemetry import add_event
from api.vocabulary import RUN_JOB
from worker.devices import CUDA_ENV, confine
from worker.heartbeat import JobLease, current_worker_id
from worker.runner import run_claimed_job

log = logging.getLogger(__name__)


@shared_task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_job(job_id: int, dispatch: int | None = None) -> str:
    """``dispatch``: the number of the dispatch this message is for (None: a message sent before
    messages carried one), which only the job's current dispatch may claim."""
    settings = get_settings()
    worker_id = current_worker_id()
    client = bus.connect(settings)
    # The claim's event and status reach the job's stream once the claim commits.
    publish = bus.publisher(client, settings.redis_keys, settings.stream_maxlen)
    with session_scope(settings.database_url, publish=publish) as session:
        job, part = take(session, job_id, worker_id, dispatch)
    if job is None:
        log.info("job %s is not dispatched here (dispatch %s: a duplicate or stale delivery); nothing to do",
                 job_id, dispatch)
        client.close()
        return "not_claimed"
    devices = job.devices if part is None else list(part.devices)
    gang_host = part is not None and not part.leads
    lease = JobLease(settings, job_id, worker_id, client, devices, gang_host=gang_host)
    lease.start()
    try:
        try:
            _confine(settings, publish, job_id, devices)
        except ValueError as exc:
            return _fail(settings, publish, job_id, worker_id, f"the job cannot run here: {exc}")
        return run_claimed_job(job, worker_id, settings, lease, client, part)
    finally:
        lease.stop()


def take(session: Session, job_id: int, worker_id: str, dispatch: int | None = None,
         ) -> tuple[JobRead | None, HostPart | None]:
    """Claim the job as its worker (a gang's node 0 too), or else join its gang as another of its
    hosts: the job and this host's part of a gang (None for a job on one worker); no job when it
    is not this worker's to run (a duplicate delivery, or one of an earlier ``dispatch``)."""
    job = claim(session, job_id, worker_id, dispatch)
    if job is not None:
        part = part_of([host.model_dump() for host in job.placement], 0)
        if part is not None:
            mark_joined(session, job_id, worker_id)
        return job, part
    part = join(session, job_id, worker_id, dispatch)
    if part is None:
        return None, None
    return get_job(session, job_id), part


def _confine(settings: Settings, publish: outbox.Publish, job_id: int, devices: list[int] | None) -> None:
    """Show the job only its devices, and record what this process now exposes to CUDA."""
    visible = confine(devices)
    if visible is None:
        return
    with session_scope(settings.database_url, publish=publish) as session:
        add_event(session, job_id, "devices", f"runs on devices {visible} (process {os.getpid()})",
                  {"devices": devices, "cuda_visible_devices": os.environ[CUDA_ENV], "pid": os.getpid()})


def _fail(settings: Settings, publish: outbox.Publish, job_id: int, worker_id: str, message: str) -> str:
    with session_scope(settings.database_url, publish=publish) as session:
        finish(session, job_id, worker_id=worker_id, outcome=JobStatus.FAILED, message=message,
               error_code="internal_error", error_message=message)
    log.error("job %s failed: %s", job_id, message)
    return "failed"
