"""Jobs that span hosts, through the real scheduler, Celery workers, Postgres and Redis: two or
three worker processes act as hosts (each its own worker id, its own CPU slots, its own artifacts
folder; all they share is the S3 server process's bucket). A job larger than any one worker trains
across two of them with the one-process metrics; the loss of one host (its whole worker killed
mid-job) requeues the job, which resumes from its stored checkpoint on a new gang with every step
recorded once; a pause, a preemption and a cancel reach every host's ranks (the gang checkpoints,
stops everywhere and resumes on a new dispatch); and a gang waiting behind 1-GPU jobs gets its
reservation and starts before the 1-GPU job queued after it."""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from same_records import assert_same_record
from waiting import is_rank

from api.store.db import session_scope
from api.store.dispatching import request_preempt
from api.store.jobs import request_cancel, request_pause, resume
from api.store.telemetry import list_events, list_metrics

pytestmark = pytest.mark.slow

HOST = {"GRPO_WORKER_GPUS": "1", "GRPO_RANK_TIMEOUT_SECONDS": "120"}
# Short, so a lost host is noticed quickly (a host that never joins is the claim window's,
# GRPO_CLAIM_WINDOW_SECONDS, left at its 30 s).
SHORT_LEASE = {"GRPO_LEASE_SECONDS": "6"}


@pytest.fixture
def bucket_env(s3_server) -> dict[str, str]:
    return {"GRPO_STORAGE_URL": s3_server.url(f"g-{uuid.uuid4().hex[:8]}"), **s3_server.env}


def start_hosts(processes, pool: str, count: int, tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    """``count`` workers of ``pool``, each a host with one slot and an artifacts folder of its own;
    worker id -> its process."""
    hosts = {}
    for index in range(count):
        worker_id = f"{pool}-host{index}"
        hosts[worker_id] = processes.worker(pool, GRPO_WORKER_ID=worker_id,
                                            GRPO_ARTIFACTS_ROOT=str(tmp_path / f"host{index}"), **HOST, **env)
    return hosts


def events(database_url: str, job_id: int, kind: str) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=1000) if e.type == kind]


def metrics(database_url: str, job_id: int) -> list:
    with session_scope(database_url) as session:
        return list_metrics(session, job_id)


def gang_ranks(database_url: str, job_id: int, count: int = 2) -> list[psutil.Process]:
    """The rank processes of the current dispatch on every host (descendants of the processes the
    hosts' newest ``devices`` events name), once ``count`` of them run; else []."""
    ranks = []
    for event in events(database_url, job_id, "devices")[-count:]:
        try:
            children = psutil.Process(event.data["pid"]).children(recursive=True)
            ranks += [p for p in children if is_rank(p)]
        except psutil.NoSuchProcess:
            return []
    return ranks if len(ranks) == count else []


def gone(ranks: list[psutil.Process]) -> bool:
    return not any(rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE for rank in ranks)


def spec(tiny_spec: Callable[..., dict], pool: str, gpus: int, **fields: Any) -> dict:
    # Rewards that vary within each group, a token-mean loss and batch-scaled advantages: the update
    # needs whole-step statistics across every rank of every host.
    return tiny_spec(**{"resources": {"pool": pool, "gpus": gpus},
                        "rewards": [{"name": "length_target", "args": {"target": 12}}],
                        "grpo": {"loss_type": "bnpo", "scale_rewards": "batch"}, **fields})


def test_a_job_larger_than_any_worker_trains_across_two_with_the_one_process_metrics_ddp_and_fsdp(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, wait_worker_ready,
        bucket_env, tmp_path):
    hosts = start_hosts(processes, pool, 2, tmp_path, bucket_env)
    processes.scheduler(**bucket_env)
    wait_worker_ready(pool, processes, count=2)
    gang = submit(spec(tiny_spec, pool, 2, name="gang"))
    # The same across hosts with the model sharded (FSDP2 over the gang's ranks), checkpoints
    # written whole by node 0: the hosts share no folder.
    sharded = submit(spec(tiny_spec, pool, 2, name="gang-fsdp",
                          resources={"pool": pool, "gpus": 2, "sharding": "fsdp"}))
    one = submit(spec(tiny_spec, pool, 1, name="alone"))
    runs = {job_id: wait_for(lambda j=job_id: finished(j), 240, f"job {job_id} to end", processes,
                             interval=0.5) for job_id in (gang, sharded, one)}
    assert all(run.status == "succeeded" for run in runs.values()), {j: r.error for j, r in runs.items()}
    done = runs[gang]

    assert sorted(host.worker for host in done.placement) == sorted(hosts)
    assert [h.devices for h in done.placement] == [[0], [0]] == [h.devices for h in runs[sharded].placement]
    single = metrics(database_url, one)
    for job_id in (gang, sharded):
        two = metrics(database_url, job_id)
        assert [m.step for m in two] == [m.step for m in single] == [1, 2, 3, 4]
        for a, b in zip(single, two, strict=True):
            assert_same_record(a.values, b.values, f"job {job_id} step {a.step}")
    kinds = [e.type for e in events(database_url, gang, "started") + events(database_url, gang, "finished")]
    assert kinds == ["started", "finished"]  # rank 0 alone reported, from node 0
    [dispatched] = events(database_url, gang, "dispatched")
    assert [host["worker"] for host in dispatched.data["placement"]] == [h.worker for h in done.placement]


def test_a_host_lost_mid_job_requeues_the_gang_which_resumes_on_a_new_one_with_each_step_once(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, wait_worker_ready,
        bucket_env, tmp_path):
    steps = 12
    hosts = start_hosts(processes, pool, 3, tmp_path, {**bucket_env, **SHORT_LEASE})
    processes.scheduler(**bucket_env, **SHORT_LEASE)
    wait_worker_ready(pool, processes, count=3)
    job_id = submit(spec(tiny_spec, pool, 2, grpo={"max_steps": steps, "loss_type": "bnpo"},
                         checkpoint_every=3))
    first = wait_for(lambda: (job := job_of(job_id)).latest_checkpoint and job.status == "running" and job,
                     240, "a first stored checkpoint", processes, interval=0.05)
    # The host that is not node 0: its whole worker dies at once (Celery's main and pool processes,
    # the job's process and its rank with them), as a machine that goes away.
    lost = first.placement[1].worker
    os.killpg(hosts[lost].pid, signal.SIGKILL)
    [requeued] = wait_for(lambda: events(database_url, job_id, "requeued"), 90, "the gang's requeue",
                          processes)
    # Whichever saw it first: node 0's ranks losing their peer, or the reaper, the lost host's lease.
    assert re.search(r"a host of (the|its) gang was lost", requeued.message), requeued.message

    done = wait_for(lambda: finished(job_id), 300, "the job to resume on a new gang", processes,
                    interval=0.5)
    assert done.status == "succeeded", done.error
    assert done.attempt == 2
    assert lost not in [host.worker for host in done.placement] and len(done.placement) == 2
    assert [m.step for m in metrics(database_url, job_id)] == list(range(1, steps + 1))  # each step once
    [resumed] = events(database_url, job_id, "resumed")
    assert resumed.data["step"] >= 3
    assert not psutil.pid_exists(hosts[lost].pid) or psutil.Process(hosts[lost].pid).status() == "zombie"


def test_a_pause_a_preemption_and_a_cancel_reach_every_hosts_ranks(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, wait_worker_ready,
        bucket_env, tmp_path):
    steps = 40
    start_hosts(processes, pool, 2, tmp_path, bucket_env)
    processes.scheduler(**bucket_env)
    wait_worker_ready(pool, processes, count=2)
    job_id = submit(spec(tiny_spec, pool, 2, grpo={"max_steps": steps, "loss_type": "bnpo"},
                         checkpoint_every=50))
    elsewhere = submit(spec(tiny_spec, f"{pool}x", 1, name="stands-in-for-an-urgent-job"))

    def running_ranks() -> list[psutil.Process]:
        job = job_of(job_id)
        return job.status == "running" and job.last_step >= 1 and gang_ranks(database_url, job_id)

    for stop in ("pause", "preempt"):
        ranks = wait_for(running_ranks, 180, f"the gang to train before its {stop}", processes, interval=0.05)
        with session_scope(database_url) as session:
            if stop == "pause":
                request_pause(session, job_id)
            else:
                assert request_preempt(session, job_id, elsewhere)
        status = "paused" if stop == "pause" else "preempted"
        stopped = wait_for(lambda s=status: (job := job_of(job_id)).status == s and job, 60, status,
                           processes, interval=0.05)
        # Rank 0 saw the stop and every rank on both hosts checkpointed and ended with it.
        assert stopped.latest_checkpoint.endswith(f"step-{stopped.last_step}") and stopped.placement == []
        wait_for(lambda r=ranks: gone(r), 30, f"every host's rank to end after the {stop}", processes)
        if stop == "pause":
            with session_scope(database_url) as session:
                resume(session, job_id)

    ranks = wait_for(running_ranks, 180, "the gang to train again", processes, interval=0.05)
    with session_scope(database_url) as session:
        request_cancel(session, job_id)
    cancelled = wait_for(lambda: finished(job_id), 60, "the cancel", processes, interval=0.05)
    assert cancelled.status == "cancelled"
    wait_for(lambda: gone(ranks), 30, "every host's rank to end after the cancel", processes)
    recorded = [m.step for m in metrics(database_url, job_id)]
    assert recorded == list(range(1, cancelled.last_step + 1)) and cancelled.last_step < steps  # each once
    assert len(events(database_url, job_id, "resumed")) == 2


def test_a_gang_waiting_behind_one_gpu_jobs_gets_its_reservation_and_starts_before_a_later_one(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, wait_worker_ready,
        bucket_env, tmp_path):
    start_hosts(processes, pool, 2, tmp_path, bucket_env)
    wait_worker_ready(pool, processes, count=2)
    first = submit(spec(tiny_spec, pool, 1, name="first", grpo={"max_steps": 6, "loss_type": "bnpo"}))
    gang = submit(spec(tiny_spec, pool, 2, name="gang"))
    later = submit(spec(tiny_spec, pool, 1, name="later"))
    processes.scheduler(**bucket_env)
    # The first 1-GPU job takes one host; the gang cannot form and reserves the other, which the
    # 1-GPU job queued after it may not take.
    wait_for(lambda: job_of(gang).pending_reason == "gang_forming"
             and job_of(later).pending_reason == "reserved", 120, "the gang's reservation", processes,
             interval=0.1)
    assert job_of(later).status == "queued"
    runs = {job_id: wait_for(lambda j=job_id: finished(j), 300, f"job {job_id} to end", processes,
                             interval=0.5) for job_id in (first, gang, later)}
    assert all(run.status == "succeeded" for run in runs.values()), {j: r.error for j, r in runs.items()}
    assert runs[first].finished_at <= runs[gang].started_at  # the gang took both hosts once free
    assert runs[gang].started_at < runs[later].started_at
