"""The cluster as the scheduling policy sees it: live workers, waiting and holding jobs, teams,
held pools, and each team's recent usage of each pool. Plain data, no I/O: the store builds it
from SQL and the workers' heartbeats (:func:`api.store.dispatching.load_state`) and
:func:`api.scheduling.policy.plan` decides on it, so it sits outside both and the store never
imports the scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["ClusterState", "HoldingJob", "Interval", "Share", "Team", "WaitingJob", "Worker", "decayed_usage"]


@dataclass(frozen=True)
class Worker:
    worker_id: str
    pool: str
    gpus: int  # devices 0..gpus-1
    busy: tuple[int, ...] = ()  # devices it reports in use by jobs SQL no longer gives it
    capabilities: frozenset[str] = frozenset()  # what its jobs may use besides devices


@dataclass(frozen=True)
class WaitingJob:
    id: int
    team_id: int
    pool: str
    gpus: int
    priority: str  # one of PRIORITY_ORDER
    backoff: bool = False  # requeued after a fault, its backoff not over yet: not dispatched
    requires: frozenset[str] = frozenset()  # capabilities its worker must advertise (its rewards')


@dataclass(frozen=True)
class Share:
    """One host's part of a job that spans hosts (a gang): a worker and the device indices the
    job holds on it."""

    worker_id: str
    devices: tuple[int, ...]


@dataclass(frozen=True)
class HoldingJob:
    """A job holding its GPUs (dispatched, running or cancelling) on ``worker_id`` and, for a job
    spanning hosts (a gang), on the workers of ``gang`` too."""

    id: int
    team_id: int
    pool: str
    gpus: int
    priority: str
    worker_id: str | None
    status: str  # dispatched | running | cancelling
    since: float  # when it was dispatched (epoch seconds): newest is preempted first
    preempt_requested: bool = False
    devices: tuple[int, ...] = ()  # its indices on the worker; none recorded: the whole worker
    # A gang's shares on its other hosts, in node-rank order (``worker_id`` is node 0's); empty
    # for a job on one worker.
    gang: tuple[Share, ...] = ()


@dataclass(frozen=True)
class Team:
    id: int
    weight: float  # > 0
    quotas: dict[str, int] = field(default_factory=dict)  # pool -> max GPUs held at once; absent: none


@dataclass(frozen=True)
class ClusterState:
    workers: tuple[Worker, ...]
    waiting: tuple[WaitingJob, ...]  # any order; plan() orders them
    holding: tuple[HoldingJob, ...]
    teams: dict[int, Team]  # a job whose team is missing here counts as weight 1, no quota
    held_pools: frozenset[str] = frozenset()
    recent_usage: dict[tuple[int, str], float] = field(default_factory=dict)  # (team, pool) -> GPUs


@dataclass(frozen=True)
class Interval:
    """GPUs a team held in a pool from ``start`` to ``end`` (None: still holding)."""

    team_id: int
    pool: str
    gpus: int
    start: float
    end: float | None


def decayed_usage(
    intervals: Iterable[Interval], now: float, half_life: float
) -> dict[tuple[int, str], float]:
    """Each (team, pool)'s GPU count averaged over the past with weight ``2**(-age/half_life)``,
    normalised so that holding ``g`` GPUs forever reads ``g``: ``ln2/H * integral of
    gpus(t) * 2**(-(now-t)/H) dt``. Closed form per interval, so it is exact at any tick rate."""
    rate = math.log(2) / half_life
    usage: dict[tuple[int, str], float] = {}
    for item in intervals:
        end = now if item.end is None else min(item.end, now)
        start = min(item.start, end)
        # integral over [start, end] of exp(-rate (now - t)) dt, times rate
        share = math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))
        key = (item.team_id, item.pool)
        usage[key] = usage.get(key, 0.0) + item.gpus * share
    return usage
