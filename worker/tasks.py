"""Celery tasks: thin. Take an id, claim the row, hand over to :mod:`worker.runner`.

The claim is one guarded UPDATE (``dispatched → running``), so a duplicate delivery of the same
message finds the job already running (or finished) and returns without touching anything.
Torch is imported only after a successful claim, inside the job's child process.
"""

from __future__ import annotations

import logging

import redis
from celery import shared_task
from redis.exceptions import RedisError

from api.settings import Settings, get_settings
from api.store import bus
from api.store.db import session_scope
from api.store.jobs import claim, finish
from api.vocabulary import RUN_JOB
from worker.heartbeat import JobLease, current_worker_id

log = logging.getLogger(__name__)


@shared_task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_job(job_id: int) -> str:
    settings = get_settings()
    worker_id = current_worker_id()
    with session_scope(settings.database_url) as session:
        job = claim(session, job_id, worker_id)
    if job is None:
        log.info("job %s is not dispatched (duplicate or stale delivery); nothing to do", job_id)
        return "not_claimed"
    client = redis.Redis.from_url(settings.redis_url)
    _announce_claim(client, settings, job_id, worker_id, job.attempt)
    # Renewal starts before torch is imported: loading it can outlast a short lease.
    lease = JobLease(settings, job_id, worker_id, client)
    lease.start()
    try:
        try:
            from worker.runner import run_claimed_job  # torch loads here, in the job's child only
        except Exception as exc:  # a broken install would otherwise requeue the job forever
            return _fail(settings, job_id, worker_id, f"the worker cannot load the trainer: {exc!r}")
        return run_claimed_job(job, worker_id, settings, lease, client)
    finally:
        lease.stop()


def _fail(settings: Settings, job_id: int, worker_id: str, message: str) -> str:
    with session_scope(settings.database_url) as session:
        finish(session, job_id, worker_id, "failed", message, "internal_error", message)
    log.error("job %s failed: %s", job_id, message)
    return "failed"


def _announce_claim(client: redis.Redis, settings: Settings, job_id: int, worker_id: str,
                    attempt: int) -> None:
    """Best effort: SQL already holds the claim event; this only tells live readers early."""
    data = {"type": "running", "message": f"claimed by {worker_id}",
            "data": {"worker_id": worker_id, "attempt": attempt}}
    try:
        bus.publish(client, job_id, "event", data, settings.stream_maxlen)
    except RedisError as exc:
        log.warning("job %s: could not publish the claim: %s", job_id, exc)
