"""The parts one scheduling pass shares between its steps: what the pass decides (:class:`Plan`,
its :class:`Dispatch` and :class:`Preemption` records), a pool's slice of the cluster's state
(:class:`Pool`), what placing a pool's jobs leaves for preemption (:class:`Placed`), and the
small reads of the state both steps make. Placement and the pass itself are
:mod:`api.scheduling.policy`; preemption is :mod:`api.scheduling.preemption`; this module sits
under both so neither imports the other's module back."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from api.domain.cluster_state import ClusterState, HoldingJob, Share, WaitingJob, Worker
from api.vocabulary import PRIORITIES

PRIORITY_ORDER = tuple(reversed(PRIORITIES))  # most urgent first


@dataclass(frozen=True)
class Dispatch:
    job_id: int
    worker_id: str  # the job's worker; for a gang, its first host (node rank 0)
    devices: tuple[int, ...]  # the job's device indices on that worker, ascending
    # A gang's shares on its other hosts, in node-rank order; empty for a job on one worker.
    gang: tuple[Share, ...] = ()


@dataclass(frozen=True)
class Preemption:
    victim_id: int
    for_job_id: int


@dataclass
class Plan:
    dispatch: list[Dispatch] = field(default_factory=list)  # in order
    preempt: list[Preemption] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)  # job id -> a policy.PENDING_REASONS entry
    position: dict[int, int] = field(default_factory=dict)  # job id -> 1-based place in its pool
    fair_share: dict[tuple[int, str], float] = field(default_factory=dict)  # (team, pool) -> GPUs


def priority_rank(priority: str) -> int:
    # An unknown priority sorts after "low" instead of failing the whole tick.
    return PRIORITY_ORDER.index(priority) if priority in PRIORITY_ORDER else len(PRIORITY_ORDER)


def team_quota(state: ClusterState, team_id: int, pool: str) -> int | None:
    team = state.teams.get(team_id)
    return None if team is None else team.quotas.get(pool)


@dataclass
class Pool:
    """One pool's slice of the state; ``held`` is team -> GPUs of its holding jobs (all statuses)."""

    name: str
    workers: list[Worker] = field(default_factory=list)
    waiting: list[WaitingJob] = field(default_factory=list)
    holding: list[HoldingJob] = field(default_factory=list)
    held: dict[int, int] = field(default_factory=lambda: defaultdict(int))


def held_on(devices: tuple[int, ...], worker_gpus: int) -> frozenset[int]:
    return frozenset(devices) if devices else frozenset(range(worker_gpus))


@dataclass
class Placed:
    """What placing a pool's jobs leaves for preemption: the jobs left waiting (in order), team ->
    GPUs held once this pass's dispatches run, the devices reserved for a gang (worker -> count)
    and that gang's position (None: no gang reserved)."""

    left: list[WaitingJob]
    real_held: dict[int, int]
    reserved: dict[str, int]
    reserved_at: int | None

