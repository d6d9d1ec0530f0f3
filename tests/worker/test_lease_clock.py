"""Leases are timed by the database's clock alone. A worker process whose own clock is a minute
off (its time sources patched: ``time.time`` and the store's ``utcnow``) claims a job and renews
its lease from a real :class:`worker.heartbeat.JobLease`, while this process reaps expired
leases as the scheduler does: the job is never requeued while the worker lives, and once the
worker is gone it is requeued after one lease, not a minute late."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from waiting import wait_until

from api.store.attempts import requeue_expired
from api.store.db import session_scope
from api.store.dispatching import dispatch_job

LEASE_SECONDS = 2.0
HOLD_SECONDS = 4.0

# The worker: every clock it could read skewed by argv[1] seconds, then claim, renew, stop.
WORKER = """
import sys, time
from datetime import timedelta
skew, database_url, redis_url, job_id, hold = sys.argv[1:]
skew, job_id, hold = float(skew), int(job_id), float(hold)
real_time = time.time
time.time = lambda: real_time() + skew
import redis
import api.store.tables as models
from api.settings import Settings
from api.store.db import session_scope
from api.store.attempts import claim
from worker.heartbeat import JobLease
real_utcnow = models.utcnow
def skewed():
    return real_utcnow() + timedelta(seconds=skew)
for module in list(sys.modules.values()):  # every module that took utcnow by name
    if getattr(module, "utcnow", None) is real_utcnow:
        module.utcnow = skewed
settings = Settings(database_url=database_url, redis_url=redis_url, heartbeat_seconds=0.25)
with session_scope(database_url) as session:
    assert claim(session, job_id, "skewed") is not None
lease = JobLease(settings, job_id, "skewed", redis.Redis.from_url(redis_url))
lease.start()
print("ready", flush=True)
time.sleep(hold)
lease.stop()
print("lost" if lease.lost else "kept", flush=True)
"""


def reap(database_url: str) -> list[int]:
    with session_scope(database_url) as session:
        return requeue_expired(session, LEASE_SECONDS, max_attempts=5)


@pytest.mark.parametrize("skew", [-60.0, 60.0])
def test_a_worker_with_a_skewed_clock_keeps_its_job_and_loses_it_one_lease_after_it_dies(
        skew, submit, tiny_spec, job_of, database_url, redis_url):
    job_id = submit(tiny_spec(f"skew{skew:+.0f}"))
    with session_scope(database_url) as session:
        assert dispatch_job(session, job_id, "skewed")
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(skew), database_url, redis_url, str(job_id),
                               str(HOLD_SECONDS)], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline() == "ready\n"
        while worker.poll() is None:  # the scheduler's reaper, on the right clock, all along
            assert job_id not in reap(database_url)
            time.sleep(0.2)
        assert worker.stdout.read() == "kept\n"
    finally:
        worker.kill()
        worker.wait()
    job = job_of(job_id)
    assert (job.status, job.worker_id, job.attempt) == ("running", "skewed", 1)
    # Silent now: requeued once its last renewal is a lease old (a minute ahead would add 60 s).
    wait_until(lambda: job_id in reap(database_url), 20, "the silent worker's job to be requeued",
               interval=0.2)
    assert job_of(job_id).status == "queued"
