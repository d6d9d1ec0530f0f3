"""A worker owns N devices and runs up to N jobs at once: a real Celery worker with 2 CPU slots,
the real scheduler's placement, and two 1-slot jobs that run at the same time, each in its own
process confined to its own device index (``CUDA_VISIBLE_DEVICES`` set before torch loads)."""

from __future__ import annotations

import pytest
import redis

from api.domain.lifecycle import TERMINAL_STATUSES
from api.scheduling.scheduler import Scheduler
from api.store import bus
from api.store.db import session_scope
from api.store.telemetry import list_events

pytestmark = pytest.mark.slow


def devices_event(database_url: str, job_id: int) -> dict:
    with session_scope(database_url) as session:
        [event] = [e for e in list_events(session, job_id, limit=1000) if e.type == "devices"]
    return event.data


def test_two_one_slot_jobs_run_at_once_each_on_its_own_device(processes, submit, tiny_spec, job_of, wait_for,
                                                              pool, settings, database_url, redis_url,
                                                              wait_worker_ready):
    processes.worker(pool, GRPO_WORKER_GPUS="2")
    [worker_id] = wait_worker_ready(pool, processes)
    client = redis.Redis.from_url(redis_url)
    [beat] = [w for w in bus.live_workers(client, settings.redis_keys) if w.worker_id == worker_id]
    assert (beat.gpus, beat.free_devices) == (2, [0, 1])
    # Long enough that both children are past their torch import while the other trains.
    first, second = (submit(tiny_spec(f"pack{i}", pool=pool, max_steps=8)) for i in (1, 2))
    assert Scheduler(settings).tick() == [first, second]  # one tick: the worker has room for both

    def both_done():
        jobs = [job_of(first), job_of(second)]
        return jobs if all(job.status in TERMINAL_STATUSES for job in jobs) else None

    a, b = wait_for(both_done, 180, "both jobs to end", processes)
    assert (a.status, b.status) == ("succeeded", "succeeded"), (a.error, b.error)
    assert a.worker_id == b.worker_id == worker_id
    assert (a.devices, b.devices) == ([0], [1])  # lowest free index first
    assert a.started_at < b.finished_at and b.started_at < a.finished_at  # they ran at the same time
    seen = [devices_event(database_url, job.id) for job in (a, b)]
    assert [s["cuda_visible_devices"] for s in seen] == ["0", "1"]  # each child saw only its own
    assert seen[0]["pid"] != seen[1]["pid"]
    # Both marks are gone once the children end: the worker advertises both devices free again.
    keys = settings.redis_keys
    wait_for(lambda: [w for w in bus.live_workers(client, keys) if w.worker_id == worker_id and not w.jobs],
             10, "the worker to advertise both devices free", processes)
