"""The scheduler dispatches queued jobs only into free worker capacity, onto the worker the
policy chose (its own queue), in priority-then-age order, and only one scheduler (the leader)
dispatches at a time.

Capacity here is advertised by hand (``api.store.bus.advertise_worker``, as a worker's heartbeat
does), so these tests need no worker process; the broker is a real Redis and the messages are
checked in its queues.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest
import redis
from celery import Celery
from sqlalchemy import func, select

from api.cli.dev import free_port
from api.domain.lifecycle import JobStatus
from api.redis_keys import RedisKeys
from api.scheduling.scheduler import LeaderLock, Scheduler
from api.store import bus
from api.store.attempts import claim, finish, requeue_expired
from api.store.db import session_scope
from api.store.tables import JobEvent
from api.vocabulary import Heartbeat


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def keys(settings) -> RedisKeys:
    return settings.redis_keys


@pytest.fixture
def scheduler(settings) -> Scheduler:
    return Scheduler(settings)


def advertise(client: redis.Redis, keys: RedisKeys, pool: str, gpus: int = 1, ttl: float = 60) -> str:
    worker_id = f"fake-{uuid.uuid4().hex[:6]}"
    beat = Heartbeat(worker_id=worker_id, pool=pool, gpus=gpus, gpu_model="cpu", hostname="test")
    bus.advertise_worker(client, keys, beat, ttl)
    return worker_id


def queued_messages(client: redis.Redis, keys: RedisKeys, *worker_ids: str) -> int:
    return sum(client.llen(keys.worker_queue(worker_id)) for worker_id in worker_ids)


def dispatched_events(database_url: str, job_id: int) -> int:
    with session_scope(database_url) as session:
        return session.scalar(select(func.count()).select_from(JobEvent)
                              .where(JobEvent.job_id == job_id, JobEvent.type == "dispatched"))


def test_a_job_without_a_live_worker_of_its_pool_stays_queued(scheduler, client, keys, submit, tiny_spec,
                                                              job_of, pool):
    job_id = submit(tiny_spec(pool=pool))
    other = advertise(client, keys, f"{pool}-other")  # capacity in another pool does not count
    assert job_id not in scheduler.tick()
    job = job_of(job_id)
    assert job.status == "queued" and job.pending_reason == "no_workers"
    assert queued_messages(client, keys, other) == 0


def test_dispatch_fills_free_slots_only_by_priority_then_age(scheduler, client, keys, submit, tiny_spec,
                                                             job_of, pool, database_url):
    low, normal, high, normal2 = (submit(tiny_spec(f"j{i}", pool=pool, priority=p))
                                  for i, p in enumerate(("low", "normal", "high", "normal")))
    ours = {low, normal, high, normal2}

    def tick() -> list[int]:
        return [job_id for job_id in scheduler.tick() if job_id in ours]

    first = advertise(client, keys, pool)
    assert tick() == [high]
    assert tick() == []  # the only slot is promised to the dispatched, not yet claimed job
    with session_scope(database_url) as session:
        assert claim(session, high, first) is not None
    assert tick() == []  # now it is busy running
    with session_scope(database_url) as session:
        assert finish(session, high, worker_id=first, outcome=JobStatus.SUCCEEDED)
    assert tick() == [normal]
    with session_scope(database_url) as session:
        claim(session, normal, first)
    second = advertise(client, keys, pool)
    assert tick() == [normal2]  # normal before low, and older normal first
    assert job_of(low).status == "queued"
    assert job_of(normal2).worker_id == second
    # One message per dispatch, each on the queue of the worker the job was placed on.
    assert (queued_messages(client, keys, first), queued_messages(client, keys, second)) == (2, 1)
    assert [dispatched_events(database_url, j) for j in (high, normal, normal2, low)] == [1, 1, 1, 0]


def test_a_job_waits_for_a_worker_with_enough_gpus(scheduler, client, keys, submit, tiny_spec, pool):
    big = submit(tiny_spec("big", pool=pool, resources={"pool": pool, "gpus": 2}))
    small = submit(tiny_spec("small", pool=pool))
    advertise(client, keys, pool, gpus=1)
    assert [j for j in scheduler.tick() if j in (big, small)] == [small]
    advertise(client, keys, pool, gpus=2)
    assert [j for j in scheduler.tick() if j in (big, small)] == [big]


def test_a_failed_send_puts_the_job_back_in_the_queue(settings, client, keys, submit, tiny_spec, job_of,
                                                       pool):
    dead_broker = Celery("dead", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    dead_broker.conf.update(broker_connection_retry=False, broker_connection_timeout=1,
                            task_publish_retry=False)
    scheduler = Scheduler(settings, sender=dead_broker)
    job_id = submit(tiny_spec(pool=pool))
    advertise(client, keys, pool)
    assert job_id not in scheduler.tick()
    job = job_of(job_id)
    assert job.status == "queued" and job.dispatched_at is None


def test_a_gone_workers_queue_is_dropped_once_no_job_is_promised_to_it(scheduler, client, keys, submit,
                                                                        tiny_spec, job_of, pool, database_url,
                                                                        wait_for):
    busy = advertise(client, keys, pool, ttl=0.6)
    job_id = submit(tiny_spec(pool=pool))
    assert job_id in scheduler.tick() and job_of(job_id).worker_id == busy
    idle = advertise(client, keys, pool, ttl=0.6)
    scheduler.tick()
    client.rpush(keys.worker_queue(idle), "stale message")
    wait_for(lambda: not client.exists(keys.worker(busy), keys.worker(idle)), 10,
             "both heartbeats to expire", interval=0.05)
    scheduler.tick()
    assert client.llen(keys.worker_queue(idle)) == 0  # nothing can claim what it held
    assert client.llen(keys.worker_queue(busy)) == 1  # the job is still promised to it: its message stays
    with session_scope(database_url) as session:
        requeue_expired(session, 0.0)  # the reaper gives the job up
    scheduler.tick()
    assert client.llen(keys.worker_queue(busy)) == 0


def test_the_leader_lock_has_one_holder_and_only_it_renews_or_releases(client, keys):
    client.delete(keys.scheduler_leader)
    first, second = (LeaderLock(client, keys.scheduler_leader, holder, 5) for holder in ("a", "b"))
    assert first.hold() and not second.hold()
    second.release()  # not its lock: nothing happens
    assert first.hold() and client.get(keys.scheduler_leader) == b"a"
    first.release()
    assert second.hold() and not first.hold()
    second.release()


def test_two_scheduler_processes_never_dispatch_a_job_twice(processes, client, keys, submit, tiny_spec,
                                                            job_of, wait_for, pool, database_url):
    jobs = [submit(tiny_spec(f"j{i}", pool=pool)) for i in range(5)]
    workers = [advertise(client, keys, pool) for _ in range(3)]
    schedulers = [processes.scheduler(), processes.scheduler()]

    def dispatched() -> list[int]:
        return [j for j in jobs if job_of(j).status == "dispatched"]

    wait_for(lambda: len(dispatched()) == 3, 30, "three dispatches", processes)
    leader = client.get(keys.scheduler_leader).decode()
    passes: set[bytes] = set()  # each pass marks its own time: distinct marks are distinct passes

    def leader_passed_three_more_times() -> bool:
        passes.add(client.get(keys.scheduler_pass))
        return len(passes) > 3

    # Both keep ticking (the follower tries the lock on each of its own); neither may send more.
    wait_for(leader_passed_three_more_times, 30, "three more passes of the leader", processes, interval=0.02)
    assert dispatched() == jobs[:3]
    assert queued_messages(client, keys, *workers) == 3
    assert [dispatched_events(database_url, j) for j in jobs] == [1, 1, 1, 0, 0]

    # The leader dies without releasing: the other takes over once the lock expires.
    pid = int(leader.split(":")[-2])  # holder id: host:pid:nonce
    victim = next(p for p in schedulers if p.pid == pid)
    os.killpg(victim.pid, signal.SIGKILL)
    workers.append(advertise(client, keys, pool))
    # SQL says dispatched just before the message is sent, so wait for both.
    wait_for(lambda: len(dispatched()) == 4 and queued_messages(client, keys, *workers) == 4, 30,
             "the survivor to dispatch", processes)
    assert client.get(keys.scheduler_leader).decode() != leader
