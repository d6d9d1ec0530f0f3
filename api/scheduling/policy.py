"""The scheduling policy: a pure function from the cluster's state to the scheduler's decisions.

No I/O, no clock, no randomness: :func:`plan` sees a :class:`api.cluster_state.ClusterState`
snapshot (built by ``api.scheduling.scheduler`` from SQL and worker heartbeats) and returns a
:class:`Plan`, so every rule below is unit-tested on hand-built states
(``tests/api/test_policy.py``) and timed by ``benchmarks/scheduler_decision.py``.

The rules, per pool (pools are independent):

* Capacity is what live workers advertise, device by device. A worker owns ``gpus`` devices
  (indices ``0..gpus-1``); its free devices are those that neither a job holding it (by the
  indices recorded with the dispatch; a holder with none recorded holds the whole worker) nor the
  worker itself (``Worker.busy``: jobs SQL no longer gives it, still stopping) is using. A job's
  GPUs all come from one worker (gang: all of them or none), so a job needing ``g`` GPUs needs a
  worker with at least ``g`` free devices. Of the workers that fit, the one with the fewest free
  devices is taken (best fit: big free blocks stay whole for big jobs), and the job gets its
  ``g`` lowest free indices. Several jobs share a worker on disjoint devices.
* A job runs only on a worker that advertises every capability it requires
  (``WaitingJob.requires``, e.g. ``code_sandbox`` for the code_tests reward): the other workers
  of its pool do not exist for it, neither for placement nor for preemption.
* Order: priority class first (high, normal, low). Within a class, the next job is the oldest
  waiting job of the team with the lowest fair-share key
  ``(gpus the team holds in the pool + its recent usage) / weight``; every job placed in the
  order adds its GPUs to its team's count, so teams take turns in proportion to their weights
  (progressive filling). Recent usage is the team's GPU count averaged over the past with a
  half-life (:func:`api.cluster_state.decayed_usage`), so a team that just had the pool for hours waits behind
  one that did not. Ties go to the older job (lower id).
* A job requeued after a fault waits out its backoff (``WaitingJob.backoff``) before anything
  else is considered for it; it keeps its place in the order meanwhile.
* A job is dispatched when its pool is not held, its team stays within its quota for the pool,
  and a worker has enough free devices for it. Otherwise it is skipped and the next job is tried:
  a smaller job behind a blocked one is backfilled into what is free.
* Preemption: a ``high`` job that could not be placed for want of free devices, whose team is
  within its quota including this job (and those this pass already preempts for), may preempt
  one running job of *another* team that is over its fair share of the pool (pool GPUs x weight
  / sum of the weights of teams with jobs in the pool), has a lower priority, and whose devices
  plus its worker's devices still free after this pass's dispatches are enough for the high
  job: preemption frees exactly the victim's devices. The victim is the lowest-priority one,
  newest first. A running job already asked to yield is counted as devices about to free up, so
  the same high job never preempts twice. A high job that claims such devices also takes the
  free devices of that worker it needs beyond them, which no later claim of the pass counts.
* Every job left waiting gets a ``pending_reason`` (one of :data:`PENDING_REASONS`) and its
  1-based position in its pool's order.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from api.cluster_state import ClusterState, HoldingJob, Share, WaitingJob, Worker
from api.vocabulary import PRIORITIES

PRIORITY_ORDER = tuple(reversed(PRIORITIES))  # most urgent first

# Why a waiting job was not dispatched in the last pass, most specific first.
PENDING_REASONS = (
    "pool_held",  # an admin held dispatch into the job's pool
    "no_workers",  # no live worker serves the pool
    "no_capable_worker",  # no live worker of the pool advertises every capability the job requires
    "too_large",  # no capable live worker of the pool has as many GPUs as the job asks for
    "backoff",  # requeued after a fault or a lost worker: waits out its backoff before a retry
    "quota_exceeded",  # the team would exceed its GPU quota for the pool
    "preempting",  # a lower-priority job is checkpointing to make room for this one
    "lower_priority",  # free devices that fit went to a job of a higher priority class
    "fair_share",  # free devices that fit went to a job ahead in the same class (another team's turn)
    "no_capacity",  # no worker that is large enough has that many devices free
)


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
    pending: dict[int, str] = field(default_factory=dict)  # job id -> a PENDING_REASONS entry
    position: dict[int, int] = field(default_factory=dict)  # job id -> 1-based place in its pool
    fair_share: dict[tuple[int, str], float] = field(default_factory=dict)  # (team, pool) -> GPUs


# Reasons that mean "no worker has enough free devices now": the only ones preemption can help.
_WANTS_A_WORKER = frozenset({"lower_priority", "fair_share", "no_capacity"})


def _rank(priority: str) -> int:
    # An unknown priority sorts after "low" instead of failing the whole tick.
    return PRIORITY_ORDER.index(priority) if priority in PRIORITY_ORDER else len(PRIORITY_ORDER)


def _weight(state: ClusterState, team_id: int) -> float:
    team = state.teams.get(team_id)
    return 1.0 if team is None else team.weight


def _quota(state: ClusterState, team_id: int, pool: str) -> int | None:
    team = state.teams.get(team_id)
    return None if team is None else team.quotas.get(pool)


@dataclass
class _Pool:
    """One pool's slice of the state; ``held`` is team -> GPUs of its holding jobs (all statuses)."""

    name: str
    workers: list[Worker] = field(default_factory=list)
    waiting: list[WaitingJob] = field(default_factory=list)
    holding: list[HoldingJob] = field(default_factory=list)
    held: dict[int, int] = field(default_factory=lambda: defaultdict(int))


def _pools(state: ClusterState) -> list[_Pool]:
    pools: dict[str, _Pool] = {}

    def get(name: str) -> _Pool:
        if name not in pools:
            pools[name] = _Pool(name)
        return pools[name]

    for worker in state.workers:
        get(worker.pool).workers.append(worker)
    for job in state.waiting:
        get(job.pool).waiting.append(job)
    for holder in state.holding:
        pool = get(holder.pool)
        pool.holding.append(holder)
        pool.held[holder.team_id] += holder.gpus
    return [pools[name] for name in sorted(pools)]  # sorted: the dispatch list is deterministic


def _order(state: ClusterState, pool: _Pool) -> Iterator[WaitingJob]:
    """The pool's waiting jobs in dispatch order: class by class, and within a class the oldest job
    of the team with the lowest ``(GPUs + recent usage) / weight``, where every job taken adds its
    GPUs whether or not it is placed, so the order is the future dispatch order. One heap entry per
    team: only the team just served changes its key, so each step is O(log teams)."""
    queues: dict[tuple[int, int], deque[WaitingJob]] = defaultdict(deque)
    for job in sorted(pool.waiting, key=lambda j: j.id):
        queues[(_rank(job.priority), job.team_id)].append(job)
    counted = dict(pool.held)  # carries over from class to class

    def entry(team: int, queue: deque[WaitingJob]) -> tuple[float, int, int]:
        usage = counted.get(team, 0) + state.recent_usage.get((team, pool.name), 0.0)
        return usage / _weight(state, team), queue[0].id, team  # equal keys: the older next job

    for rank in sorted({rank for rank, _ in queues}):
        heap = [entry(team, queue) for (r, team), queue in queues.items() if r == rank]
        heapq.heapify(heap)
        while heap:
            team = heapq.heappop(heap)[2]
            queue = queues[(rank, team)]
            job = queue.popleft()
            counted[team] = counted.get(team, 0) + job.gpus
            if queue:
                heapq.heappush(heap, entry(team, queue))
            yield job


def held_devices(holder: HoldingJob, worker_gpus: int) -> frozenset[int]:
    """The devices ``holder`` keeps busy on its worker (of ``worker_gpus``): those recorded with its
    dispatch, or all of them for a job dispatched before devices were recorded."""
    return frozenset(holder.devices) if holder.devices else frozenset(range(worker_gpus))


def free_devices(state: ClusterState) -> dict[str, list[int]]:
    """Every live worker's free device indices, ascending (see the module docstring)."""
    taken = {w.worker_id: set(w.busy) for w in state.workers}
    sizes = {w.worker_id: w.gpus for w in state.workers}
    for holder in state.holding:
        if holder.worker_id in taken:  # a holder of a dead worker frees nothing and takes nothing
            taken[holder.worker_id] |= held_devices(holder, sizes[holder.worker_id])
    return {w.worker_id: [d for d in range(w.gpus) if d not in taken[w.worker_id]] for w in state.workers}


class _Capacity:
    """A pool's free devices during one pass, its workers grouped by the capabilities they
    advertise (a handful of distinct sets, usually one): a job looks only at the groups that cover
    what it requires, and takes the best fit among them."""

    def __init__(self, workers: list[Worker], devices: dict[str, list[int]]) -> None:
        self.free: dict[frozenset[str], list[tuple[int, str]]] = {}  # (free devices, worker), ascending
        biggest: dict[frozenset[str], int] = {}  # the most GPUs a worker of the group has
        for worker in workers:
            group = self.free.setdefault(worker.capabilities, [])
            biggest[worker.capabilities] = max(biggest.get(worker.capabilities, 0), worker.gpus)
            if devices[worker.worker_id]:
                group.append((len(devices[worker.worker_id]), worker.worker_id))
        for group in self.free.values():
            group.sort()
        self._biggest = biggest
        # Most free devices a worker of each group had when it went to a job of each class in this
        # pass (``given``), and to a job of any class ahead of each class (``above``): a job that
        # finds nothing free learns whether room it could have used went to a higher class or to
        # its own. Kept as running maxima, since most of a long queue asks.
        classes = len(PRIORITY_ORDER) + 1
        self.given = {caps: [0] * classes for caps in self.free}
        self.above = {caps: [0] * classes for caps in self.free}
        self._usable: dict[frozenset[str], tuple[list[frozenset[str]], int]] = {}

    def usable(self, requires: frozenset[str]) -> tuple[list[frozenset[str]], int]:
        """The groups whose workers advertise everything in ``requires``, and the most GPUs one of
        their workers has (memoised: a queue holds few distinct requirements)."""
        found = self._usable.get(requires)
        if found is None:
            groups = [caps for caps in self.free if requires <= caps]
            biggest = max((self._biggest[caps] for caps in groups), default=0)
            found = self._usable[requires] = (groups, biggest)
        return found

    def take(self, gpus: int, groups: list[frozenset[str]], rank: int) -> tuple[str, int] | None:
        """The worker of ``groups`` with the fewest free devices, at least ``gpus``, for a job of
        class ``rank``: its id and how many devices it had free; None when none fits."""
        best: tuple[tuple[int, str], frozenset[str], int] | None = None
        for caps in groups:
            group = self.free[caps]
            fit = bisect_left(group, (gpus, ""))
            if fit < len(group) and (best is None or group[fit] < best[0]):
                best = (group[fit], caps, fit)
        if best is None:
            return None
        (count, worker_id), caps, fit = best
        del self.free[caps][fit]
        if count > gpus:
            insort(self.free[caps], (count - gpus, worker_id))
        given, above = self.given[caps], self.above[caps]
        given[rank] = max(given[rank], count)
        for lower in range(rank + 1, len(above)):
            above[lower] = max(above[lower], count)
        return worker_id, count

    def why_not(self, gpus: int, groups: list[frozenset[str]], rank: int) -> str:
        """Why a job of class ``rank`` found no worker of ``groups`` with ``gpus`` free devices."""
        for caps in groups:
            if self.above[caps][rank] >= gpus:
                return "lower_priority"
        for caps in groups:
            if self.given[caps][rank] >= gpus:
                return "fair_share"
        return "no_capacity"


def _place(
    state: ClusterState, pool: _Pool, devices: dict[str, list[int]], result: Plan
) -> tuple[list[WaitingJob], dict[int, int]]:
    """Dispatch the pool's jobs in order onto its workers' free devices (best fit; ``devices`` is
    updated as they are taken) and give every other job its reason and position; returns the
    jobs left waiting, in order, and team -> GPUs held once this pass's dispatches run."""
    capacity = _Capacity(pool.workers, devices)
    real_held = dict(pool.held)  # grows with this pass's dispatches: quotas bind within one pass
    left: list[WaitingJob] = []
    for job in _order(state, pool):
        quota = _quota(state, job.team_id, pool.name)
        groups, biggest = capacity.usable(job.requires)
        if pool.name in state.held_pools:
            reason = "pool_held"
        elif not pool.workers:
            reason = "no_workers"
        elif not groups:
            reason = "no_capable_worker"
        elif biggest < job.gpus:
            reason = "too_large"
        elif job.backoff:
            reason = "backoff"
        elif quota is not None and real_held.get(job.team_id, 0) + job.gpus > quota:
            reason = "quota_exceeded"
        else:
            rank = _rank(job.priority)
            taken = capacity.take(job.gpus, groups, rank)
            if taken is not None:
                worker_id = taken[0]
                ids, devices[worker_id] = devices[worker_id][:job.gpus], devices[worker_id][job.gpus:]
                real_held[job.team_id] = real_held.get(job.team_id, 0) + job.gpus
                result.dispatch.append(Dispatch(job.id, worker_id, tuple(ids)))
                continue
            reason = capacity.why_not(job.gpus, groups, rank)
        left.append(job)
        result.pending[job.id] = reason
        result.position[job.id] = len(left)
    return left, real_held


def _fair_shares(state: ClusterState, pool: _Pool) -> dict[int, float]:
    """Pool GPUs x weight / the sum of the weights of the teams with jobs (waiting or holding) here."""
    teams = sorted({job.team_id for job in pool.waiting} | {job.team_id for job in pool.holding})
    total_weight = sum(_weight(state, team) for team in teams)
    pool_gpus = sum(w.gpus for w in pool.workers)
    return {team: pool_gpus * _weight(state, team) / total_weight for team in teams}


def _victims(pool: _Pool, live: dict[str, int]) -> list[HoldingJob]:
    """The pool's jobs that may be asked to yield, most preferred first: the lowest priority, then
    the newest. Only running jobs on live workers: a job still starting or cancelling frees its
    devices anyway, and one on a dead worker frees nothing."""
    candidates = [
        h
        for h in pool.holding
        if h.status == "running" and not h.preempt_requested and _rank(h.priority) > 0 and h.worker_id in live
    ]
    return sorted(candidates, key=lambda h: (-_rank(h.priority), -h.since, -h.id))


def _preempt(
    state: ClusterState,
    pool: _Pool,
    left: list[WaitingJob],
    real_held: dict[int, int],
    fair: dict[int, float],
    free: dict[str, int],
    result: Plan,
) -> None:
    """Let the pool's waiting ``high`` jobs that want devices claim some that are about to free, or
    else ask one running job of a team over its fair share to yield (see the module docstring).
    ``free`` is worker -> devices still free after this pass's dispatches."""
    live = {w.worker_id: w.gpus for w in pool.workers}
    capabilities = {w.worker_id: w.capabilities for w in pool.workers}
    high = [job for job in left if _rank(job.priority) == 0 and result.pending[job.id] in _WANTS_A_WORKER]
    # The quota check counts what the team will hold once this pass's preemptions land, so two
    # high jobs of one team cannot together overshoot its quota through preemption.
    reserved = defaultdict(int, real_held)

    def room(holder: HoldingJob, job: WaitingJob) -> int:
        """The devices ``job`` would get from ``holder`` leaving; none on a worker it cannot use."""
        if not job.requires <= capabilities[holder.worker_id]:
            return 0
        return free[holder.worker_id] + len(held_devices(holder, live[holder.worker_id]))

    def claim(job: WaitingJob, holder: HoldingJob) -> bool:
        quota = _quota(state, job.team_id, pool.name)
        if quota is not None and reserved[job.team_id] + job.gpus > quota:
            return False
        reserved[job.team_id] += job.gpus
        result.pending[job.id] = "preempting"
        free[holder.worker_id] -= max(0, job.gpus - len(held_devices(holder, live[holder.worker_id])))
        return True

    # Devices whose job was already asked to yield are about to free: they go to a high job before
    # any new victim is chosen, so a preemption in flight is never doubled.
    freeing = [h for h in pool.holding
               if h.status == "running" and h.preempt_requested and h.worker_id in live]
    remaining = []
    for job in high:
        fits = [h for h in freeing if room(h, job) >= job.gpus]
        if not fits:
            remaining.append(job)
            continue
        holder = min(fits, key=lambda h: (room(h, job), h.worker_id, h.id))
        if claim(job, holder):
            freeing.remove(holder)

    victims = _victims(pool, live)
    held = defaultdict(int, pool.held)  # less the victims already chosen in this pass
    for job in remaining:
        if not victims:
            break
        victim = next(
            (
                h
                for h in victims
                if h.team_id != job.team_id and held[h.team_id] > fair[h.team_id] and room(h, job) >= job.gpus
            ),
            None,
        )
        if victim is not None and claim(job, victim):
            victims.remove(victim)
            held[victim.team_id] -= victim.gpus
            result.preempt.append(Preemption(victim.id, job.id))


def fair_shares(state: ClusterState) -> dict[tuple[int, str], float]:
    """Every (team, pool)'s fair share of the pool's GPUs, as :func:`plan` reports it, without
    making the rest of the decision (the cluster view needs only this)."""
    return {(team, pool.name): share for pool in _pools(state)
            for team, share in _fair_shares(state, pool).items()}


def plan(state: ClusterState) -> Plan:
    """The scheduler's decisions for one tick; see the module docstring for the rules."""
    result = Plan()
    devices = free_devices(state)
    for pool in _pools(state):
        left, real_held = _place(state, pool, devices, result)
        fair = _fair_shares(state, pool)
        result.fair_share.update({(team, pool.name): share for team, share in fair.items()})
        free = {w.worker_id: len(devices[w.worker_id]) for w in pool.workers}
        _preempt(state, pool, left, real_held, fair, free, result)
    return result
