"""A job requeued after a fault or an expired lease waits out a backoff before the scheduler
dispatches it again (``retry_at``, on the database's clock), doubling per attempt up to a cap,
and says so: ``pending_reason: backoff``. Real scheduler ticks, Postgres and Redis; the worker's
capacity is advertised by hand, as in ``test_scheduler.py``."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
import redis
from sqlalchemy import select, update

from api.scheduling.scheduler import Scheduler
from api.store import bus
from api.store.attempts import claim, requeue_after_fault, requeue_expired
from api.store.clock import Backoff, db_now
from api.store.db import session_scope
from api.store.tables import Job
from api.vocabulary import Heartbeat


@pytest.fixture
def scheduler(settings, redis_url) -> Scheduler:
    slow = settings.model_copy(update={"requeue_backoff_seconds": 30.0, "requeue_backoff_max_seconds": 45.0})
    return Scheduler(slow, redis.Redis.from_url(redis_url))


def advertise(scheduler: Scheduler, pool: str) -> str:
    worker_id = f"fake-{uuid.uuid4().hex[:6]}"
    beat = Heartbeat(worker_id=worker_id, pool=pool, gpus=1, gpu_model="cpu", hostname="test")
    bus.advertise_worker(scheduler.client, scheduler.settings.redis_keys, beat, 60)
    return worker_id


def waits_for(database_url: str, job_id: int) -> float | None:
    """Seconds until the job may be dispatched again, by the database's clock (None: now)."""
    with session_scope(database_url) as session:
        retry_at = session.scalar(select(Job.retry_at).where(Job.id == job_id))
        return None if retry_at is None else (retry_at - db_now(session)).total_seconds()


def fault(database_url: str, job_id: int, worker_id: str, backoff: Backoff) -> str:
    with session_scope(database_url) as session:
        assert claim(session, job_id, worker_id) is not None
    with session_scope(database_url) as session:
        return requeue_after_fault(session, job_id, worker_id=worker_id, message="rank 1 was killed",
                                   data={}, max_attempts=5, backoff=backoff).status


def test_a_requeued_job_waits_its_backoff_while_others_run_then_is_dispatched(
        scheduler, submit, tiny_spec, job_of, pool, database_url, redis_url):
    backoff = Backoff.of(scheduler.settings)
    worker_id = advertise(scheduler, pool)
    job_id = submit(tiny_spec("faulty", pool=pool))
    assert scheduler.tick() == [job_id]
    assert fault(database_url, job_id, worker_id, backoff) == "queued"
    assert 25 < waits_for(database_url, job_id) <= 30  # the first backoff

    other = submit(tiny_spec("next", pool=pool))
    assert scheduler.tick() == [other]  # the free device does not wait for the faulty job
    assert job_of(job_id).pending_reason == "backoff"
    queue = json.loads(scheduler.client.get(scheduler.settings.redis_keys.queue))["entries"]
    [entry] = [e for e in queue if e["job_id"] == job_id]
    assert entry["pending_reason"] == "backoff"

    with session_scope(database_url) as session:  # the other job ends; the backoff runs out
        session.execute(update(Job).where(Job.id == other).values(status="succeeded", worker_id=None))
        past = db_now(session) - timedelta(seconds=1)
        session.execute(update(Job).where(Job.id == job_id).values(retry_at=past))
    assert scheduler.tick() == [job_id]
    assert waits_for(database_url, job_id) is None and job_of(job_id).pending_reason is None

    # The second attempt's fault would wait twice as long (60 s): capped at 45 s.
    assert fault(database_url, job_id, worker_id, backoff) == "queued"
    assert 40 < waits_for(database_url, job_id) <= 45


def test_a_job_whose_lease_expired_waits_its_backoff_too(submit, tiny_spec, pool, database_url, redis_url,
                                                         scheduler):
    worker_id = advertise(scheduler, pool)
    job_id = submit(tiny_spec("silent", pool=pool))
    assert scheduler.tick() == [job_id]
    with session_scope(database_url) as session:
        claim(session, job_id, worker_id)
    with session_scope(database_url) as session:  # lease 0 s: expired at once
        assert job_id in requeue_expired(session, 0.0, max_attempts=5, backoff=Backoff(30.0, 45.0))
    assert 25 < waits_for(database_url, job_id) <= 30
    assert scheduler.tick() == []
