"""A job holding 2 devices trains on 2 gloo ranks through the real worker (2 CPU slots), the real
scheduler, Postgres and Redis: the same metrics as its 1-device run, rank 0 alone reporting; a
killed rank requeues the job and a preemption yields it, and it resumes from its checkpoint each
time with every step recorded once; a killed worker leaves no rank behind; a cancel ends every
rank; a job error inside the ranks fails the job with its own code."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from same_records import assert_same_record
from waiting import is_rank, process_gone

from api.scheduling.scheduler import Scheduler
from api.store.db import session_scope
from api.store.dispatching import request_preempt
from api.store.jobs import request_cancel
from api.store.telemetry import list_events, list_metrics

pytestmark = pytest.mark.slow
# A bounded wait in collectives.
TWO_SLOTS = {"GRPO_WORKER_GPUS": "2", "GRPO_RANK_TIMEOUT_SECONDS": "120"}
# A short lease, only where a killed worker's job must be requeued quickly. (It was also the time a
# dispatched job had to be claimed, which a loaded CI host's pool start-up overran; that is the
# claim window now, GRPO_CLAIM_WINDOW_SECONDS, left at its 30 s.)
SHORT_LEASE = {"GRPO_LEASE_SECONDS": "3"}
# Long enough for a checkpoint, a fault and a resume with steps still left to train after it.
STEPS = 18


def two_rank_spec(tiny_spec: Callable[..., dict], pool: str, gpus: int = 2, **fields: Any) -> dict:
    return tiny_spec(resources={"pool": pool, "gpus": gpus}, **fields)


def events(database_url: str, job_id: int, kind: str | None = None) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=1000) if kind is None or e.type == kind]


def metrics(database_url: str, job_id: int) -> list:
    with session_scope(database_url) as session:
        return list_metrics(session, job_id)


def job_process(database_url: str, job_id: int) -> psutil.Process:
    """The process of the job's current attempt (its newest ``devices`` event names it)."""
    return psutil.Process(events(database_url, job_id, "devices")[-1].data["pid"])


def rank_processes(database_url: str, job_id: int, count: int = 2) -> list[psutil.Process]:
    """The rank processes of the job's current attempt (descendants of the process its newest
    ``devices`` event names), once ``count`` of them run; else []."""
    try:
        ranks = [p for p in job_process(database_url, job_id).children(recursive=True) if is_rank(p)]
    except (IndexError, psutil.NoSuchProcess):
        return []
    return ranks if len(ranks) == count else []


def gone(processes: list[psutil.Process]) -> bool:
    return all(process_gone(p.pid) for p in processes)


def test_a_two_device_job_trains_on_two_ranks_exactly_like_one(processes, submit, tiny_spec, job_of, finished,
                                                               wait_for, pool, settings, database_url,
                                                               wait_worker_ready):
    processes.worker(pool, **TWO_SLOTS)
    wait_worker_ready(pool, processes)
    scheduler, runs = Scheduler(settings), {}
    # Rewards that vary within each group, a token-mean loss and batch-scaled advantages: the
    # update needs whole-step statistics across ranks.
    varied = {"rewards": [{"name": "length_target", "args": {"target": 12}}],
              "grpo": {"loss_type": "bnpo", "scale_rewards": "batch"}}
    for gpus in (2, 1):
        job_id = submit(two_rank_spec(tiny_spec, pool, gpus, name=f"gpus{gpus}", **varied))
        # The second waits until the worker advertises the first job's devices free again.
        wait_for(lambda j=job_id: j in scheduler.tick(), 30, f"the {gpus}-device job's dispatch", processes)
        runs[gpus] = wait_for(lambda j=job_id: finished(j), 180, f"the {gpus}-device job to end", processes)
        assert runs[gpus].status == "succeeded", runs[gpus].error

    assert runs[2].devices == [0, 1] and runs[1].devices == [0]
    two, one = metrics(database_url, runs[2].id), metrics(database_url, runs[1].id)
    assert [m.step for m in two] == [m.step for m in one] == [1, 2, 3, 4]
    for a, b in zip(one, two, strict=True):
        assert_same_record(a.values, b.values, f"step {a.step}")
    assert all(m.values["grad_norm"] > 0 for m in two)  # every step moved the weights
    kinds = [e.type for e in events(database_url, runs[2].id)]
    assert kinds.count("started") == kinds.count("finished") == 1  # rank 0 alone reported
    assert kinds.count("checkpoint") == 2  # steps 2 and 4, written once


def test_a_killed_rank_requeues_the_job_a_preemption_yields_it_and_it_resumes_each_time(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, wait_worker_ready):
    processes.worker(pool, **TWO_SLOTS)
    wait_worker_ready(pool, processes)
    processes.scheduler()
    job_id = submit(two_rank_spec(tiny_spec, pool, grpo={"max_steps": STEPS}, checkpoint_every=3))

    # A rank process dies mid-run (as under the OOM killer): the machine's fault, not the job's.
    wait_for(lambda: job_of(job_id).latest_checkpoint, 180, "a first checkpoint", processes, interval=0.02)
    first = wait_for(lambda: rank_processes(database_url, job_id), 30, "both ranks", processes)
    victim = first[-1]
    victim.send_signal(signal.SIGKILL)
    [requeued] = wait_for(lambda: events(database_url, job_id, "requeued"), 60, "the requeue", processes)
    assert requeued.data["pid"] == victim.pid and requeued.data["rank"] in (0, 1)
    assert requeued.data["signal"] == "SIGKILL" and f"rank {requeued.data['rank']}" in requeued.message
    wait_for(lambda: gone(first), 30, "every rank of the first attempt to end", processes)

    # Back at once (no lease expiry), resumed from the checkpoint; then preempted mid-run.
    resumed = wait_for(lambda: events(database_url, job_id, "resumed"), 180, "the resume", processes)
    at = resumed[0].data["step"]
    second = wait_for(lambda: job_of(job_id).last_step > at and rank_processes(database_url, job_id), 120,
                      "the second attempt to train", processes, interval=0.02)
    urgent = submit(two_rank_spec(tiny_spec, pool, 1, name="urgent", priority="high"))
    with session_scope(database_url) as session:
        assert request_preempt(session, job_id, urgent)
    preempted = wait_for(lambda: (job := job_of(job_id)).status == "preempted" and job, 60, "the yield",
                         processes, interval=0.05)
    assert preempted.last_step < STEPS and preempted.latest_checkpoint.endswith(f"step-{preempted.last_step}")
    wait_for(lambda: gone(second), 30, "every rank of the second attempt to end", processes)

    done = wait_for(lambda: finished(job_id), 240, "the job to resume and finish", processes, interval=0.5)
    assert done.status == "succeeded", done.error
    assert done.attempt == 3 and done.devices == [0, 1]
    assert job_of(urgent).finished_at <= done.started_at  # the preempted job's devices went to it
    assert [m.step for m in metrics(database_url, job_id)] == list(range(1, STEPS + 1))  # each step once
    steps = [e.data["step"] for e in events(database_url, job_id, "resumed")]
    assert steps == [at, preempted.last_step]


def test_a_worker_killed_mid_run_leaves_no_rank_behind_and_the_job_resumes(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, wait_worker_ready,
        tmp_path):
    # TMPDIR: the killed job process cannot remove its launch folder; it stays in the test's.
    worker = processes.worker(pool, **TWO_SLOTS, **SHORT_LEASE, TMPDIR=str(tmp_path))
    wait_worker_ready(pool, processes)
    processes.scheduler(**SHORT_LEASE)
    job_id = submit(two_rank_spec(tiny_spec, pool, grpo={"max_steps": STEPS}, checkpoint_every=3))
    wait_for(lambda: job_of(job_id).latest_checkpoint, 180, "a first checkpoint", processes, interval=0.02)
    ranks = wait_for(lambda: rank_processes(database_url, job_id), 30, "both ranks", processes)
    # The whole worker dies at once, as under the OOM killer: no process of it can clean up.
    for process in (psutil.Process(worker.pid), job_process(database_url, job_id)):
        process.kill()
    wait_for(lambda: gone(ranks), 30, "the orphaned ranks to die with their parent", processes)
    assert job_of(job_id).status == "running"

    processes.worker(pool, **TWO_SLOTS)
    done = wait_for(lambda: finished(job_id), 240, "the job to resume on the new worker", processes,
                    interval=0.5)
    assert done.status == "succeeded", done.error
    assert done.attempt == 2
    assert [m.step for m in metrics(database_url, job_id)] == list(range(1, STEPS + 1))
    assert events(database_url, job_id, "requeued")[0].data["previous_status"] == "running"  # lease expired
    assert len(events(database_url, job_id, "resumed")) == 1


def test_cancelling_a_running_two_rank_job_ends_it_and_every_rank(processes, submit, tiny_spec, job_of,
                                                                  finished, wait_for, pool, settings,
                                                                  database_url, wait_worker_ready):
    processes.worker(pool, **TWO_SLOTS)
    wait_worker_ready(pool, processes)
    job_id = submit(two_rank_spec(tiny_spec, pool, grpo={"max_steps": 500}, checkpoint_every=100))
    assert Scheduler(settings).tick() == [job_id]
    ranks = wait_for(lambda: job_of(job_id).last_step >= 1 and rank_processes(database_url, job_id), 180,
                     "the job to train on both ranks", processes)
    with session_scope(database_url) as session:
        request_cancel(session, job_id)
    job = wait_for(lambda: finished(job_id), 60, "the cancel", processes)
    assert job.status == "cancelled" and job.last_step < 500
    assert gone(ranks)  # the outcome is written only once the launcher has taken every rank down
    assert job.latest_checkpoint.endswith(f"step-{job.last_step}")  # rank 0 checkpointed on the way out


def test_a_job_error_inside_the_ranks_fails_the_job_with_its_own_code(processes, submit, tiny_spec, finished,
                                                                      wait_for, pool, settings, database_url,
                                                                      roots, wait_worker_ready):
    # Found only when each rank builds its components: the stored spec itself is valid.
    (roots["data"] / "no-prompts.jsonl").write_text(json.dumps({"question": "what?"}) + "\n")
    job_id = submit(two_rank_spec(tiny_spec, pool, dataset={"source": "path:no-prompts.jsonl"}))
    processes.worker(pool, **TWO_SLOTS)
    wait_worker_ready(pool, processes)
    assert Scheduler(settings).tick() == [job_id]
    job = wait_for(lambda: finished(job_id), 120, "the job to end", processes)
    assert job.status == "failed" and job.attempt == 1  # a job error is not retried
    assert job.error.code == "invalid_spec" and "prompt" in job.error.message
    assert job.error.message.startswith(("rank 0 failed: ", "rank 1 failed: "))
    assert events(database_url, job_id, "failed")[0].data == {"error_code": "invalid_spec"}
    assert not events(database_url, job_id, "requeued")
