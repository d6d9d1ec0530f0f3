"""A dispatch whose message never reaches its worker is made again once the claim window is over
(``GRPO_CLAIM_WINDOW_SECONDS``), not a lease later, and the lost message, should it still turn up,
is refused by the claim (it carries its dispatch's number). Real scheduler and Celery worker
processes, Postgres and Redis; the message is dropped on purpose, taken out of the worker's queue
while the worker is stopped (SIGSTOP), so the broker had it and the worker never did."""

from __future__ import annotations

import base64
import json
import os
import signal

import pytest
import redis

from api.store import bus
from api.store.db import session_scope
from api.store.telemetry import list_events

pytestmark = pytest.mark.slow

WINDOW = {"GRPO_CLAIM_WINDOW_SECONDS": "5"}
# Ten minutes: before the claim window, a lost dispatch waited this long (the test waits far less).
LONG_LEASE = {"GRPO_LEASE_SECONDS": "600"}


def message_args(raw: bytes) -> list:
    """The arguments of a Celery task message as it lies in a Redis queue (protocol 2)."""
    body = json.loads(raw)["body"]
    args, _kwargs, _embed = json.loads(base64.b64decode(body))
    return args


def drain(client: redis.Redis, queue: str) -> list[bytes]:
    """Every message in ``queue``, oldest first, taken out of it."""
    taken = []
    while (raw := client.rpop(queue)) is not None:
        taken.append(raw)
    return taken


def events(database_url: str, job_id: int, kind: str) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=1000) if e.type == kind]


def test_a_dispatch_whose_message_is_lost_is_made_again_within_the_claim_window(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, settings, database_url, redis_url,
        wait_worker_ready):
    client = redis.Redis.from_url(redis_url)
    keys = settings.redis_keys
    # Two slots: the lost message, pushed back later, finds a free child while the job runs.
    worker = processes.worker(pool, GRPO_WORKER_GPUS="2", **LONG_LEASE)
    [worker_id] = wait_worker_ready(pool, processes)
    processes.scheduler(**WINDOW, **LONG_LEASE)
    wait_for(lambda: client.exists(keys.scheduler_pass), 60, "the scheduler's first pass", processes)

    # The worker stops taking messages; the scheduler still sees it live (its heartbeat held up
    # for it), so it sends the job there. Once no command of the worker's is blocked in Redis, no
    # pop it sent before it stopped can take the message either.
    [beat] = [w for w in bus.live_workers(client, keys) if w.worker_id == worker_id]
    os.killpg(worker.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: client.info("clients")["blocked_clients"] == 0, 30, "the worker's pops to time out")
        bus.advertise_worker(client, keys, beat, 600)
        job_id = submit(tiny_spec(pool=pool, max_steps=8))
        wait_for(lambda: job_of(job_id).status == "dispatched", 60, "the dispatch", processes)
        queue = keys.worker_queue(worker_id)
        # Dropped: no worker has it. (On a slow host the window may have passed already and the
        # job been dispatched again to the stopped worker: those messages are dropped too.)
        lost = wait_for(lambda: drain(client, queue), 30, "the message in the worker's queue", processes)
        assert all(message_args(raw)[0] == job_id for raw in lost)
    finally:
        os.killpg(worker.pid, signal.SIGCONT)

    # Made again within the window (a lease of 10 minutes would have held it dispatched).
    running = wait_for(lambda: (job := job_of(job_id)).status == "running" and job, 120,
                       "the job to be dispatched again and claimed", processes, interval=0.05)
    undone = events(database_url, job_id, "dispatch_failed")
    claimed = len(undone) + 1  # the dispatch whose message the worker took
    assert [message_args(raw) for raw in lost] == [[job_id, n] for n in range(1, len(lost) + 1)]
    assert len(undone) >= len(lost)
    assert [e.data for e in undone] == [{"reason": "not_claimed", "dispatch": n, "claim_window_seconds": 5.0}
                                        for n in range(1, claimed)]
    assert undone[0].message == f"not claimed by {worker_id} within 5 s (dispatch 1); back to the queue"
    assert running.attempt == 1  # no attempt charged (and no backoff: claimed within seconds)
    assert int(client.get(keys.stat("unclaimed_dispatches"))) == len(undone)  # for Prometheus

    # The first message turns up late, while the new dispatch's attempt runs: refused.
    client.lpush(queue, lost[0])
    [log] = [log for process, log in processes.started if process is worker]
    refused = f"job {job_id} is not dispatched here (dispatch 1"
    wait_for(lambda: refused in log.read_text(), 120, "the late delivery to be refused", processes)
    # Each delivery names its dispatch: the claimed one's, then the first one's, late.
    received = [line.split("[")[-1] for line in log.read_text().splitlines() if "] received" in line]
    assert received[-1] == f"job-{job_id}-dispatch-1-host-0] received"
    assert f"job-{job_id}-dispatch-{claimed}-host-0] received" in received
    job = wait_for(lambda: finished(job_id), 180, "the job to end", processes)
    assert job.status == "succeeded", job.error
    assert (job.attempt, job.last_step, job.worker_id) == (1, 8, worker_id)
    assert len(events(database_url, job_id, "dispatched")) == claimed
    assert len(events(database_url, job_id, "running")) == 1
