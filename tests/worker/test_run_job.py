"""A real Celery worker process runs jobs: the claim makes duplicate deliveries harmless, every
step reaches SQL and the job's Redis Stream, failures keep their error code, one worker runs one
job at a time, and a job whose worker died resumes from its checkpoint on the next attempt."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
import redis
from celery import Celery

from api.scheduling.scheduler import celery_client
from api.settings import Settings
from api.store import bus
from api.store.db import session_scope
from api.store.dispatching import dispatch_job
from api.store.telemetry import list_checkpoints, list_events, list_metrics
from api.vocabulary import RUN_JOB

pytestmark = pytest.mark.slow


def dispatch_by_hand(settings: Settings, sender: Celery, job_id: int, worker_id: str, copies: int) -> None:
    with session_scope(settings.database_url) as session:
        assert dispatch_job(session, job_id, worker_id)
    for _ in range(copies):
        sender.send_task(RUN_JOB, args=[job_id], queue=settings.redis_keys.worker_queue(worker_id))


def stream(settings: Settings, job_id: int) -> list[dict]:
    client = redis.Redis.from_url(settings.redis_url)
    return [bus.decode(fields) for _, fields in client.xrange(settings.redis_keys.job_stream(job_id))]


def events(database_url: str, job_id: int, kind: str) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=1000) if e.type == kind]


def test_a_job_delivered_twice_runs_once_and_reports_every_step(processes, submit, tiny_spec, job_of,
                                                                finished, wait_for, pool, settings,
                                                                database_url, redis_url, roots,
                                                                wait_worker_ready):
    job_id = submit(tiny_spec(pool=pool))
    processes.worker(pool)
    [worker_id] = wait_worker_ready(pool, processes)
    dispatch_by_hand(settings, celery_client(settings), job_id, worker_id, copies=2)
    client = redis.Redis.from_url(redis_url)
    keys = settings.redis_keys
    beat = wait_for(lambda: [w for w in bus.live_workers(client, keys) if w.pool == pool and w.jobs],
                    60, "the worker to advertise its running job", processes)[0]
    # Dispatched by hand without devices: the job has the whole (1-slot) worker.
    assert beat.jobs == {job_id: [0]} and beat.gpus == 1 and beat.free_devices == []
    assert beat.gpu_model and beat.hostname and beat.worker_id
    job = wait_for(lambda: finished(job_id), 120, "the job to end", processes)
    assert job.status == "succeeded", job.error
    assert job.worker_id == beat.worker_id
    assert (job.attempt, job.last_step) == (1, 4)
    with session_scope(database_url) as session:
        metrics = list_metrics(session, job_id)
        checkpoints = list_checkpoints(session, job_id)
    assert [m.step for m in metrics] == [1, 2, 3, 4]
    assert {"reward", "kl", "clip_ratio/region_mean", "loss"} <= set(metrics[0].values)
    assert [c.step for c in checkpoints] == [2, 4]
    folder = roots["artifacts"] / "jobs" / str(job_id) / "checkpoints"
    assert all(Path(c.path).parent == folder and Path(c.path).is_dir() for c in checkpoints)
    assert job.latest_checkpoint == checkpoints[-1].path
    assert len(events(database_url, job_id, "running")) == 1

    messages = stream(settings, job_id)
    assert [m["data"]["step"] for m in messages if m["type"] == "metrics"] == [1, 2, 3, 4]
    assert {m["type"] for m in messages} == {"event", "metrics", "samples", "status"}
    assert messages[-1] == {"type": "status", "data": {"status": "succeeded"}}
    # The second copy was delivered to a fresh child and lost the claim without a trace.
    wait_for(lambda: "is not dispatched" in processes.logs(), 60, "the duplicate delivery", processes)
    assert len(events(database_url, job_id, "running")) == 1
    assert job_of(job_id).model_dump() == job.model_dump()


def test_a_failing_job_records_its_error_code(processes, submit, tiny_spec, finished, wait_for, pool,
                                              settings, database_url, redis_url, roots, wait_worker_ready):
    (roots["data"] / "no-prompts.jsonl").write_text(json.dumps({"question": "what?"}) + "\n")
    job_id = submit(tiny_spec(pool=pool, dataset={"source": "path:no-prompts.jsonl"}))
    processes.worker(pool)
    [worker_id] = wait_worker_ready(pool, processes)
    dispatch_by_hand(settings, celery_client(settings), job_id, worker_id, copies=1)
    job = wait_for(lambda: finished(job_id), 120, "the job to end", processes)
    assert job.status == "failed"
    assert job.error.code == "invalid_spec" and "prompt" in job.error.message
    final = stream(settings, job_id)[-1]
    assert final["type"] == "status" and final["data"]["error"]["code"] == "invalid_spec"
    assert events(database_url, job_id, "failed")[0].data == {"error_code": "invalid_spec"}


def test_one_single_gpu_worker_runs_one_job_at_a_time_highest_priority_first(processes, submit, tiny_spec,
                                                                             finished, wait_for,
                                                                             wait_worker_ready, pool):
    first = submit(tiny_spec("normal", pool=pool))
    second = submit(tiny_spec("high", pool=pool, priority="high"))
    processes.worker(pool)
    wait_worker_ready(pool, processes)
    processes.scheduler()
    jobs = [wait_for(lambda j=j: finished(j), 120, f"job {j}", processes)
            for j in (first, second)]
    assert [j.status for j in jobs] == ["succeeded", "succeeded"]
    normal, high = jobs
    assert high.finished_at <= normal.dispatched_at  # high went first; normal waited for the slot


def test_a_job_whose_worker_died_resumes_from_its_checkpoint(processes, submit, tiny_spec, job_of, finished,
                                                             wait_for, pool, database_url):
    lease = {"GRPO_LEASE_SECONDS": "3"}
    job_id = submit(tiny_spec(pool=pool, grpo={"max_steps": 40}, checkpoint_every=3))
    worker = processes.worker(pool, **lease)
    processes.scheduler(**lease)
    running = wait_for(lambda: (job := job_of(job_id)).latest_checkpoint and job, 120,
                       "a first checkpoint", processes, interval=0.02)
    for child in psutil.Process(worker.pid).children(recursive=True):
        child.kill()  # the job's process dies mid-run; its lease stops being renewed
    assert running.status == "running" and running.last_step < 40

    job = wait_for(lambda: finished(job_id), 120, "the job to end", processes)
    assert job.status == "succeeded", job.error
    assert job.attempt == 2
    with session_scope(database_url) as session:
        steps = [m.step for m in list_metrics(session, job_id)]
    assert steps == list(range(1, 41))
    assert events(database_url, job_id, "requeued")
    resumed = events(database_url, job_id, "resumed")
    assert len(resumed) == 1 and resumed[0].data["step"] >= 3
