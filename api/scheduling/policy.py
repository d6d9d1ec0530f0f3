"""The scheduling policy: a pure function from the cluster's state to the scheduler's decisions.

No I/O, no clock, no randomness: :func:`plan` sees a :class:`api.domain.cluster_state.ClusterState`
snapshot (built by ``api.scheduling.scheduler`` from SQL and worker heartbeats) and returns a
:class:`Plan`, so every rule below is unit-tested on hand-built states
(``tests/api/test_policy.py``, ``tests/api/test_policy_preemption.py``,
``tests/api/test_policy_gangs.py``) and timed by ``benchmarks/scheduler_decision.py``. Placement
is here; preemption, the pass's last step in a pool, is :mod:`api.scheduling.preemption`; the
records both write are :mod:`api.scheduling.plan_parts`.

The rules, per pool (pools are independent):

* Capacity is what live workers advertise, device by device. A worker owns ``gpus`` devices
  (indices ``0..gpus-1``); its free devices are those that neither a job holding it (by the
  indices recorded with the dispatch, on each of its hosts: node 0's and every share of
  ``HoldingJob.gang``; a holder with none recorded holds the whole worker) nor the worker itself
  (``Worker.busy``: jobs SQL no longer gives it, still stopping) is using. A gang with a dead
  host is requeued by the reaper; until then its devices on its live hosts count as held. A job
  that fits one capable worker (``g`` GPUs, a worker of at least ``g``) gets all of them from one
  worker, never split: it needs a worker with at least ``g`` free devices. Of the workers that
  fit, the one with the fewest free devices is taken (best fit: big free blocks stay whole for
  big jobs), and the job gets its ``g`` lowest free indices. Several jobs share a worker on
  disjoint devices.
* A job larger than every capable worker of its pool is a gang: it starts on several capable
  workers at once, all of them or none, each host's share a whole number of devices (its lowest
  free indices there). Fewest hosts: the workers with the most free devices are taken whole until
  what is left fits one worker, which is the best fit for it
  (:func:`api.scheduling.gang_placement.gang_shares`). Node 0 (``Dispatch.worker_id``) is the
  host with the biggest share; the others are ``Dispatch.gang`` in node-rank order (share
  descending, then worker id). A job larger than all capable workers together is ``too_large``.
* Reservation: the first gang in a pool's order that cannot start for want of free devices
  (``gang_forming``) reserves the hosts it waits for: the fewest whose sizes hold it, preferring
  those with the most devices free now (:func:`api.scheduling.gang_placement.reserved_shares`).
  The devices free on them now, up to its share of each, go to no job after it in this pass
  (such a job that would have fit but for them is ``reserved``); later jobs are still backfilled
  onto the other workers and onto devices beyond the reserved shares. The policy keeps no state:
  the reservation is chosen again each pass, and since the reserved hosts only gain free devices
  as their jobs end, the same hosts stay chosen until the gang starts. Other gangs that cannot
  start wait (``gang_forming``) without reserving.
* A job runs only on a worker that advertises every capability it requires
  (``WaitingJob.requires``, e.g. ``code_sandbox`` for the code_tests reward): the other workers
  of its pool do not exist for it, neither for placement nor for preemption.
* Quotas and the fair-share order count all of a gang's GPUs, on every host.
* Order: priority class first (high, normal, low). Within a class, the next job is the oldest
  waiting job of the team with the lowest fair-share key
  ``(gpus the team holds in the pool + its recent usage) / weight``; every job placed in the
  order adds its GPUs to its team's count, so teams take turns in proportion to their weights
  (progressive filling). Recent usage is the team's GPU count averaged over the past with a
  half-life (:func:`api.domain.cluster_state.decayed_usage`), so a team that just had the pool
  for hours waits behind one that did not. Ties go to the older job (lower id).
* A job requeued after a fault waits out its backoff (``WaitingJob.backoff``) before anything
  else is considered for it; it keeps its place in the order meanwhile.
* A job is dispatched when its pool is not held, its team stays within its quota for the pool,
  and a worker (for a gang, its capable workers together) has enough free devices for it, not
  counting those reserved for a gang ahead of it. Otherwise it is skipped and the next job is
  tried: a smaller job behind a blocked one is backfilled into what is free.
* Preemption: a ``high`` job that could not be placed for want of free devices, whose team is
  within its quota including this job (and those this pass already preempts for), may preempt
  one running job of *another* team that is over its fair share of the pool (pool GPUs x weight
  / sum of the weights of teams with jobs in the pool), has a lower priority, and whose devices
  plus its worker's devices still free after this pass's dispatches are enough for the high
  job: preemption frees exactly the victim's devices. A victim may be a gang whose every host is
  live: it frees its devices on every host, and the room counted is that of the one host the
  high job would use (free plus the gang's devices there; the host with the most room, then the
  lowest id). Free devices reserved for a gang count only for a high job ahead of that gang in
  the order. The victim is the lowest-priority one, newest first. A running job already asked to
  yield is counted as devices about to free up, so the same high job never preempts twice. A
  high job that claims such devices also takes the free devices of that worker it needs beyond
  them, which no later claim of the pass counts. A gang never preempts (it reserves instead),
  nor does a job waiting on a reservation (the devices it wants are promised to a gang ahead).
* Every job left waiting gets a ``pending_reason`` (one of :data:`PENDING_REASONS`) and its
  1-based position in its pool's order.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Iterator

from api.domain.cluster_state import ClusterState, HoldingJob, Share, WaitingJob
from api.scheduling.gang_placement import Capacity, hosts_held
from api.scheduling.plan_parts import (
    PRIORITY_ORDER,
    Dispatch,
    Placed,
    Plan,
    Pool,
    Preemption,
    held_on,
    priority_rank,
    team_quota,
)
from api.scheduling.preemption import preempt

# The policy is the scheduler's one entry point: the plan's records live in plan_parts (under this
# module and preemption alike) but are read as policy.Plan, policy.Dispatch, policy.Preemption.
__all__ = [
    "PENDING_REASONS",
    "PRIORITY_ORDER",
    "Dispatch",
    "Plan",
    "Preemption",
    "fair_shares",
    "free_devices",
    "held_devices",
    "plan",
]

# Why a waiting job was not dispatched in the last pass, most specific first.
PENDING_REASONS = (
    "pool_held",  # an admin held dispatch into the job's pool
    "no_workers",  # no live worker serves the pool
    "no_capable_worker",  # no live worker of the pool advertises every capability the job requires
    "too_large",  # no capable live worker of the pool has as many GPUs as the job asks for
    "backoff",  # requeued after a fault or a lost worker: waits out its backoff before a retry
    "quota_exceeded",  # the team would exceed its GPU quota for the pool
    "preempting",  # a lower-priority job is checkpointing to make room for this one
    "reserved",  # free devices that fit are held back for a gang ahead of it in the order
    "gang_forming",  # needs more GPUs than any one worker: waits for enough free across workers
    "lower_priority",  # free devices that fit went to a job of a higher priority class
    "fair_share",  # free devices that fit went to a job ahead in the same class (another team's turn)
    "no_capacity",  # no worker that is large enough has that many devices free
)


def _weight(state: ClusterState, team_id: int) -> float:
    team = state.teams.get(team_id)
    return 1.0 if team is None else team.weight


def _pools(state: ClusterState) -> list[Pool]:
    pools: dict[str, Pool] = {}

    def get(name: str) -> Pool:
        if name not in pools:
            pools[name] = Pool(name)
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


def _order(state: ClusterState, pool: Pool) -> Iterator[WaitingJob]:
    """The pool's waiting jobs in dispatch order: class by class, and within a class the oldest job
    of the team with the lowest ``(GPUs + recent usage) / weight``, where every job taken adds its
    GPUs whether or not it is placed, so the order is the future dispatch order. One heap entry per
    team: only the team just served changes its key, so each step is O(log teams)."""
    queues: dict[tuple[int, int], deque[WaitingJob]] = defaultdict(deque)
    for job in sorted(pool.waiting, key=lambda j: j.id):
        queues[(priority_rank(job.priority), job.team_id)].append(job)
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
    """The devices ``holder`` keeps busy on its worker (node 0's, for a gang; of ``worker_gpus``):
    those recorded with its dispatch, or all of them for a job dispatched before devices were
    recorded."""
    return held_on(holder.devices, worker_gpus)


def free_devices(state: ClusterState) -> dict[str, list[int]]:
    """Every live worker's free device indices, ascending (see the module docstring)."""
    taken = {w.worker_id: set(w.busy) for w in state.workers}
    sizes = {w.worker_id: w.gpus for w in state.workers}
    for holder in state.holding:
        for worker_id, devices in hosts_held(holder):
            if worker_id in taken:  # a holder's host that is dead frees nothing and takes nothing
                taken[worker_id] |= held_on(devices, sizes[worker_id])
    return {w.worker_id: [d for d in range(w.gpus) if d not in taken[w.worker_id]] for w in state.workers}


def _dispatch(job: WaitingJob, shares: list[tuple[str, int]], devices: dict[str, list[int]]) -> Dispatch:
    """The dispatch of ``job`` with ``shares`` (worker, count) in node-rank order: the lowest free
    indices of each worker, taken from ``devices``."""
    hosts = []
    for worker_id, count in shares:
        ids, devices[worker_id] = devices[worker_id][:count], devices[worker_id][count:]
        hosts.append(Share(worker_id, tuple(ids)))
    return Dispatch(job.id, hosts[0].worker_id, hosts[0].devices, tuple(hosts[1:]))


def _place(state: ClusterState, pool: Pool, devices: dict[str, list[int]], result: Plan) -> Placed:
    """Dispatch the pool's jobs in order onto its workers' free devices (best fit, or as a gang;
    ``devices`` is updated as they are taken), reserve for the first gang that cannot start, and
    give every other job its reason and position."""
    capacity = Capacity(pool.workers, devices, classes=len(PRIORITY_ORDER) + 1)
    real_held = dict(pool.held)  # grows with this pass's dispatches: quotas bind within one pass
    left: list[WaitingJob] = []
    reserved_at: int | None = None
    for job in _order(state, pool):
        quota = team_quota(state, job.team_id, pool.name)
        groups, biggest, total = capacity.usable(job.requires)
        gang = job.gpus > biggest
        if pool.name in state.held_pools:
            reason = "pool_held"
        elif not pool.workers:
            reason = "no_workers"
        elif not groups:
            reason = "no_capable_worker"
        elif total < job.gpus:
            reason = "too_large"
        elif job.backoff:
            reason = "backoff"
        elif quota is not None and real_held.get(job.team_id, 0) + job.gpus > quota:
            reason = "quota_exceeded"
        else:
            rank = priority_rank(job.priority)
            if gang:
                shares = capacity.take_gang(job.gpus, groups, rank)
            else:
                worker_id = capacity.take(job.gpus, groups, rank)
                shares = None if worker_id is None else [(worker_id, job.gpus)]
            if shares is not None:
                real_held[job.team_id] = real_held.get(job.team_id, 0) + job.gpus
                result.dispatch.append(_dispatch(job, shares, devices))
                continue
            if capacity.fits_but_for_reservation(job.gpus, groups, gang):
                reason = "reserved"
            elif gang:
                reason = "gang_forming"
                if reserved_at is None:  # the first gang that waits for devices holds them as they free
                    capacity.reserve(job.gpus, groups)
                    reserved_at = len(left) + 1
            else:
                reason = capacity.why_not(job.gpus, groups, rank)
        left.append(job)
        result.pending[job.id] = reason
        result.position[job.id] = len(left)
    return Placed(left, real_held, capacity.reserved, reserved_at)


def _fair_shares(state: ClusterState, pool: Pool) -> dict[int, float]:
    """Pool GPUs x weight / the sum of the weights of the teams with jobs (waiting or holding) here."""
    teams = sorted({job.team_id for job in pool.waiting} | {job.team_id for job in pool.holding})
    total_weight = sum(_weight(state, team) for team in teams)
    pool_gpus = sum(w.gpus for w in pool.workers)
    return {team: pool_gpus * _weight(state, team) / total_weight for team in teams}


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
        placed = _place(state, pool, devices, result)
        fair = _fair_shares(state, pool)
        result.fair_share.update({(team, pool.name): share for team, share in fair.items()})
        free = {w.worker_id: len(devices[w.worker_id]) for w in pool.workers}
        preempt(state, pool, placed, fair, free, result)
    return result
