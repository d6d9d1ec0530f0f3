"""A job's processes killed, stuck or deaf to a cancel, on a real worker (2 CPU slots), scheduler,
Postgres and Redis: the supervisor in the worker's pool process, not the job's process, decides.

* The job's process SIGKILLed (as by the OOM killer), or the pool process supervising it: the
  job is back in the queue within seconds, not after its 30 s lease, and resumes to the end with
  every step recorded once.
* A job whose step outlasts its stall limit (a catastrophic regex, which the reward budget ends
  only after 10 s, past the 4 s limit set here): the job fails ``stalled``; one that
  ignores a cancel is ended after the grace period and is ``cancelled``; the worker's devices are
  free again once the processes are gone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import redis
from waiting import process_gone

from api.settings import Settings
from api.store.bus import live_workers
from api.store.db import session_scope
from api.store.jobs import request_cancel
from api.store.telemetry import list_events, list_metrics
from worker.supervisor import end_process

TWO_SLOTS = {"GRPO_WORKER_GPUS": "2"}
# Catastrophic backtracking: exponential in the completion's length; each call runs until the
# reward budget (10 s) stops it, so a step takes longer than the stall limits below.
STUCK_REWARD = [{"name": "regex_match", "args": {"pattern": "(?s)(.|.)*(?!)"}}]


def events(database_url: str, job_id: int, kind: str) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=1000) if e.type == kind]


def marks(settings: Settings, worker_id: str) -> dict[int, dict]:
    raw = redis.Redis.from_url(settings.redis_url).hgetall(settings.redis_keys.busy(worker_id))
    return {int(job): json.loads(mark) for job, mark in raw.items()}


def test_a_killed_job_process_or_supervisor_requeues_at_once_and_the_job_resumes(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, redis_url,
        settings, wait_worker_ready):
    processes.worker(pool, **TWO_SLOTS)
    [worker_id] = wait_worker_ready(pool, processes)
    processes.scheduler()
    steps = 24
    jobs = [submit(tiny_spec(f"victim-{n}", pool=pool, grpo={"max_steps": steps}, checkpoint_every=3))
            for n in range(2)]
    wait_for(lambda: all(job_of(j).latest_checkpoint for j in jobs) and len(marks(settings, worker_id)) == 2,
             120, "both jobs past a checkpoint", processes, interval=0.05)
    found = marks(settings, worker_id)
    job_process, supervisor = found[jobs[0]]["job_pid"], found[jobs[1]]["pid"]
    psutil.Process(job_process).kill()  # as the OOM killer would
    psutil.Process(supervisor).kill()  # Celery's WorkerLostError: the job's process dies with it

    # The lease is 30 s: only the worker seeing its processes die can be this quick.
    first = wait_for(lambda: events(database_url, jobs[0], "requeued"), 5, "the job process's requeue",
                     processes, interval=0.05)
    second = wait_for(lambda: events(database_url, jobs[1], "requeued"), 5, "the supervisor's requeue",
                      processes, interval=0.05)
    assert "killed by SIGKILL" in first[0].message and first[0].data["pid"] == job_process
    assert f"(pid {supervisor}) died" in second[0].message

    for job_id in jobs:
        done = wait_for(lambda j=job_id: finished(j), 180, f"job {job_id} to resume and finish", processes)
        assert (done.status, done.attempt) == ("succeeded", 2), done.error
        with session_scope(database_url) as session:
            assert [m.step for m in list_metrics(session, job_id)] == list(range(1, steps + 1))
        assert events(database_url, job_id, "resumed")


def test_a_stuck_reward_stalls_a_deaf_job_is_cancelled_and_the_devices_come_back(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, redis_url,
        settings, wait_worker_ready):
    processes.worker(pool, GRPO_CANCEL_GRACE_SECONDS="1", GRPO_KILL_GRACE_SECONDS="1", **TWO_SLOTS)
    [worker_id] = wait_worker_ready(pool, processes)
    processes.scheduler()
    stuck = {"rewards": STUCK_REWARD, "grpo": {"max_completion_length": 48}}
    stalls = submit(tiny_spec("stalls", pool=pool, stall_seconds=4, **stuck))
    deaf = submit(tiny_spec("deaf", pool=pool, **stuck))
    wait_for(lambda: events(database_url, deaf, "started"), 120, "the deaf job to start", processes)
    pid = marks(settings, worker_id)[deaf]["job_pid"]
    with session_scope(database_url) as session:
        request_cancel(session, deaf)

    cancelled = wait_for(lambda: finished(deaf), 30, "the deaf job to be ended", processes)
    assert cancelled.status == "cancelled"
    assert "did not stop within 1 s" in events(database_url, deaf, "cancelled")[-1].message
    assert process_gone(pid)
    stalled = wait_for(lambda: finished(stalls), 60, "the stuck job to stall", processes)
    assert (stalled.status, stalled.error.code) == ("failed", "stalled"), stalled.error
    assert "no step finished for 4 s" in stalled.error.message

    def devices_free() -> bool:
        beats = live_workers(redis.Redis.from_url(redis_url), settings.redis_keys)
        [beat] = [w for w in beats if w.worker_id == worker_id]
        return beat.free_devices == [0, 1] and not marks(settings, worker_id)

    wait_for(devices_free, 10, "the worker to advertise both devices free", processes)


def test_a_process_deaf_to_sigterm_is_killed_after_the_grace():
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, start_new_session=True, text=True)
    assert deaf.stdout.readline() == "ready\n"
    started = time.monotonic()
    end_process(deaf, kill_grace=0.5)
    assert deaf.returncode == -signal.SIGKILL and time.monotonic() - started >= 0.5
