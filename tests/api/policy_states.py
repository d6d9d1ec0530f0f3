"""Hand-built cluster states for the scheduling policy's tests (``test_policy.py``,
``test_policy_preemption.py``): a worker, a waiting job and a holder of pool ``a`` by default, a
cluster from them, and which worker each dispatched job got."""

from __future__ import annotations

from api.domain.cluster_state import ClusterState, HoldingJob, WaitingJob, Worker
from api.scheduling.policy import Plan

SANDBOX = frozenset({"code_sandbox"})


def worker(worker_id: str, gpus: int = 1, pool: str = "a",
           capabilities: frozenset[str] = frozenset()) -> Worker:
    return Worker(worker_id, pool, gpus, capabilities=capabilities)


def job(job_id: int, team: int, gpus: int = 1, priority: str = "normal", pool: str = "a",
        requires: frozenset[str] = frozenset()) -> WaitingJob:
    return WaitingJob(job_id, team, pool, gpus, priority, requires=requires)


def hold(job_id: int, team: int, worker_id: str | None, gpus: int = 1, priority: str = "normal",
         since: float = 0.0, pool: str = "a", status: str = "running", preempt: bool = False,
         devices: tuple[int, ...] = ()) -> HoldingJob:
    return HoldingJob(job_id, team, pool, gpus, priority, worker_id, status, since, preempt, devices)


def cluster(workers=(), waiting=(), holding=(), teams=(), **extra) -> ClusterState:
    return ClusterState(tuple(workers), tuple(waiting), tuple(holding), {t.id: t for t in teams}, **extra)


def placed(result: Plan) -> dict[int, str]:
    return {d.job_id: d.worker_id for d in result.dispatch}
