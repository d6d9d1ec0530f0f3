"""Redis frozen, then restarted empty, while a job trains on a real worker and scheduler: the job
goes on and succeeds in its first attempt with every step recorded once. Redis only carries live
state and the message that started the job; the job's record and its lease are in SQL, a frozen
Redis fails each call within a third of the lease (``bus.connect``), and Celery is pinned not to
kill running tasks when its broker connection drops (``worker.celery_app``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from api.cli.dev import start_redis, stop_process
from api.store.db import session_scope
from api.store.telemetry import list_metrics

STEPS = 12
LEASE = {"GRPO_LEASE_SECONDS": "6"}  # Redis calls time out after 2 s


class RedisServer:
    """This module's Redis, which a test may freeze (SIGSTOP) and restart (empty) on its port."""

    def __init__(self) -> None:
        self.url, self.process = start_redis()

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self) -> None:
        stop_process(self.process)
        self.url, self.process = start_redis(port=urlparse(self.url).port)

    def stop(self) -> None:
        self.thaw()
        stop_process(self.process)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


def test_a_job_survives_a_frozen_then_restarted_redis(processes, redis_server, submit, tiny_spec, job_of,
                                                      finished, wait_for, pool, database_url,
                                                      wait_worker_ready):
    processes.worker(pool, **LEASE)
    wait_worker_ready(pool, processes)
    processes.scheduler(**LEASE)
    job_id = submit(tiny_spec("outage", pool=pool, max_steps=STEPS))
    wait_for(lambda: job_of(job_id).last_step >= 2, 120, "the job's second step", processes)

    redis_server.freeze()  # longer than a Redis call may take, shorter than the lease
    try:
        wait_for(lambda: job_of(job_id).last_step >= 4, 60, "two more steps while Redis is frozen",
                 processes)
    finally:
        redis_server.thaw()
    redis_server.restart()  # every key gone: heartbeats, the leader lock, the job's message

    done = wait_for(lambda: finished(job_id), 120, "the job to finish", processes)
    assert (done.status, done.attempt) == ("succeeded", 1), done.error
    with session_scope(database_url) as session:
        assert [m.step for m in list_metrics(session, job_id)] == list(range(1, STEPS + 1))
