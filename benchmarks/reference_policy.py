"""A deliberately naive scheduling policy, and seeded synthetic cluster states to run it on.

``reference_plan`` follows the rules of ``api.scheduling.policy`` word for word, with no heap, no bisect and
no incremental bookkeeping: after every pop it re-sorts all remaining jobs of the class by the
fair-share key, and every total (GPUs held, quota use, fair share, a worker's free devices) is
summed again from the raw lists when it is needed. It is O(N^2 log N) per pool, so it is only for cross-checks
(``tests/api/test_policy.py``) and as the baseline of ``benchmarks/scheduler_decision.py``.
Preemption is included, in the same naive style, and so are jobs spanning hosts (gangs): their
shares and the hosts the first waiting gang reserves, the latter by trying every set of hosts.

``random_state`` builds the states both of them use. Not a package: import it by file path
(the test) or with ``benchmarks/`` on ``sys.path`` (the benchmark).
"""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import combinations

from api.domain.cluster_state import ClusterState, HoldingJob, Share, Team, WaitingJob, Worker
from api.scheduling.policy import PRIORITY_ORDER, Dispatch, Plan, Preemption

WANTS_A_WORKER = ("lower_priority", "fair_share", "no_capacity")


def rank(priority: str) -> int:
    return PRIORITY_ORDER.index(priority) if priority in PRIORITY_ORDER else len(PRIORITY_ORDER)


def weight(state: ClusterState, team_id: int) -> float:
    return state.teams[team_id].weight if team_id in state.teams else 1.0


def quota(state: ClusterState, team_id: int, pool: str) -> int | None:
    return state.teams[team_id].quotas.get(pool) if team_id in state.teams else None


def holding_gpus(state: ClusterState, team_id: int, pool: str) -> int:
    return sum(h.gpus for h in state.holding if h.pool == pool and h.team_id == team_id)


def naive_order(state: ClusterState, pool: str) -> list[WaitingJob]:
    order: list[WaitingJob] = []
    for cls in sorted({rank(j.priority) for j in state.waiting if j.pool == pool}):
        remaining = [j for j in state.waiting if j.pool == pool and rank(j.priority) == cls]
        while remaining:
            counted = {}  # team -> GPUs held plus GPUs of every job already taken in the order
            for job in remaining:
                taken = sum(j.gpus for j in order if j.team_id == job.team_id)
                counted[job.team_id] = holding_gpus(state, job.team_id, pool) + taken

            def key(job: WaitingJob, counted: dict[int, int] = counted) -> tuple[float, int]:
                usage = state.recent_usage.get((job.team_id, pool), 0.0)
                return (counted[job.team_id] + usage) / weight(state, job.team_id), job.id

            remaining.sort(key=key)
            order.append(remaining.pop(0))
    return order


def hosts_of(item: HoldingJob | Dispatch) -> list[Share]:
    """Every host of a holder or a dispatch, node 0 first."""
    return [Share(item.worker_id, item.devices), *item.gang]


def devices_of(holder: HoldingJob, worker: Worker) -> list[int]:
    """The holder's devices on ``worker`` (none recorded: all of them)."""
    found = [host.devices for host in hosts_of(holder) if host.worker_id == worker.worker_id]
    return [d for devices in found for d in (devices or range(worker.gpus))]


def free_of(state: ClusterState, worker: Worker, dispatched: list[Dispatch]) -> list[int]:
    """The worker's free devices, summed again from the raw lists every time."""
    taken = list(worker.busy)
    taken += [d for h in state.holding for d in devices_of(h, worker)]
    taken += [d for x in dispatched for host in hosts_of(x) if host.worker_id == worker.worker_id
              for d in host.devices]
    return sorted(d for d in range(worker.gpus) if d not in taken)


def form_gang(job: WaitingJob, usable: list[Worker], free: dict[str, int]) -> list[tuple[str, int]] | None:
    """Fewest hosts: the ones with the most free devices whole, the last one best fit."""
    ranked = sorted(usable, key=lambda w: (-free[w.worker_id], w.worker_id))
    for k in range(1, len(ranked) + 1):
        whole = ranked[:k - 1]
        left = job.gpus - sum(free[w.worker_id] for w in whole)
        rest = [w for w in ranked[k - 1:] if free[w.worker_id] >= left > 0]
        if rest:
            last = min(rest, key=lambda w: (free[w.worker_id], w.worker_id))
            shares = [(w.worker_id, free[w.worker_id]) for w in whole] + [(last.worker_id, left)]
            return sorted(shares, key=lambda s: (-s[1], s[0]))
    return None


def reservation(job: WaitingJob, usable: list[Worker], free: dict[str, int]) -> dict[str, int]:
    """Of the sets of fewest hosts whose sizes hold the job, the one whose hosts ranked by (most
    free, biggest, id) come first; each host's share by its size in that rank, capped by its free."""
    def key(w: Worker) -> tuple[int, int, str]:
        return -free[w.worker_id], -w.gpus, w.worker_id

    for k in range(1, len(usable) + 1):
        sets = [sorted(c, key=key) for c in combinations(usable, k) if sum(w.gpus for w in c) >= job.gpus]
        if sets:
            chosen = min(sets, key=lambda c: [key(w) for w in c])
            shares, left = {}, job.gpus
            for w in chosen:
                shares[w.worker_id] = min(w.gpus, left, free[w.worker_id])
                left -= min(w.gpus, left)
            return {w: n for w, n in shares.items() if n}
    return {}


def capable(worker: Worker, job: WaitingJob) -> bool:
    return all(capability in worker.capabilities for capability in job.requires)


def reference_plan(state: ClusterState) -> Plan:
    result = Plan()
    pools = {x.pool for x in (*state.workers, *state.waiting, *state.holding)}
    for pool in sorted(pools):
        workers = [w for w in state.workers if w.pool == pool]
        given: list[tuple[int, WaitingJob, Worker]] = []  # (free devices the worker had, the job, it)
        placed: list[WaitingJob] = []
        reserved: dict[str, int] = {}
        reserved_at: int | None = None
        order = naive_order(state, pool)
        for job in order:
            limit = quota(state, job.team_id, pool)
            after = holding_gpus(state, job.team_id, pool) + job.gpus
            after += sum(j.gpus for j in placed if j.team_id == job.team_id)
            usable = [w for w in workers if capable(w, job)]
            free = {w.worker_id: len(free_of(state, w, result.dispatch)) - reserved.get(w.worker_id, 0)
                    for w in workers}
            gang = all(w.gpus < job.gpus for w in usable)
            fits = [w for w in usable if free[w.worker_id] >= job.gpus]
            shares = form_gang(job, usable, free) if gang else None
            with_reserved = {w: n + reserved.get(w, 0) for w, n in free.items()}
            if pool in state.held_pools:
                reason = "pool_held"
            elif not workers:
                reason = "no_workers"
            elif not usable:
                reason = "no_capable_worker"
            elif sum(w.gpus for w in usable) < job.gpus:
                reason = "too_large"
            elif job.backoff:
                reason = "backoff"
            elif limit is not None and after > limit:
                reason = "quota_exceeded"
            elif fits and not gang:
                best = min(fits, key=lambda w: (free[w.worker_id], w.worker_id))
                devices = free_of(state, best, result.dispatch)
                given.append((free[best.worker_id], job, best))
                placed.append(job)
                result.dispatch.append(Dispatch(job.id, best.worker_id, tuple(devices[:job.gpus])))
                continue
            elif shares:
                hosts = []
                for worker_id, count in shares:
                    w = next(w for w in workers if w.worker_id == worker_id)
                    given.append((free[worker_id], job, w))
                    hosts.append(Share(worker_id, tuple(free_of(state, w, result.dispatch)[:count])))
                placed.append(job)
                node0, *others = hosts
                result.dispatch.append(Dispatch(job.id, node0.worker_id, node0.devices, tuple(others)))
                continue
            elif reserved and gang and sum(with_reserved[w.worker_id] for w in usable) >= job.gpus:
                reason = "reserved"
            elif reserved and not gang and any(with_reserved[w.worker_id] >= job.gpus for w in usable):
                reason = "reserved"
            elif gang:
                reason = "gang_forming"
                if reserved_at is None:
                    reserved = reservation(job, usable, free)
                    reserved_at = 1 + sum(1 for j in order[:order.index(job)] if j.id in result.pending)
            elif any(n >= job.gpus and rank(j.priority) < rank(job.priority) and capable(w, job)
                     for n, j, w in given):
                reason = "lower_priority"
            elif any(n >= job.gpus and rank(j.priority) == rank(job.priority) and capable(w, job)
                     for n, j, w in given):
                reason = "fair_share"
            else:
                reason = "no_capacity"
            result.pending[job.id] = reason
        left = [j for j in order if j.id in result.pending]
        result.position.update({j.id: place for place, j in enumerate(left, start=1)})
        _reference_preempt(state, pool, workers, placed, left, result, reserved, reserved_at)
    return result


def _reference_preempt(
    state: ClusterState,
    pool: str,
    workers: list[Worker],
    placed: list[WaitingJob],
    left: list[WaitingJob],
    result: Plan,
    reserved: dict[str, int],
    reserved_at: int | None,
) -> None:
    teams = {j.team_id for j in state.waiting if j.pool == pool} | {
        h.team_id for h in state.holding if h.pool == pool
    }
    pool_gpus = sum(w.gpus for w in workers)
    fair = {t: pool_gpus * weight(state, t) / sum(weight(state, u) for u in teams) for t in teams}
    for team in teams:
        result.fair_share[(team, pool)] = fair[team]
    live = {w.worker_id: w for w in workers}
    # (high job, the holder whose devices it takes, the host it takes them on)
    claimed: list[tuple[WaitingJob, HoldingJob, str]] = []
    victims: list[HoldingJob] = []

    def within_quota(job: WaitingJob) -> bool:
        limit = quota(state, job.team_id, pool)
        taken = placed + [j for j, _, _ in claimed]
        after = sum(j.gpus for j in taken if j.team_id == job.team_id) + job.gpus
        return limit is None or holding_gpus(state, job.team_id, pool) + after <= limit

    def room_on(holder: HoldingJob, job: WaitingJob, worker: Worker) -> int:
        if not capable(worker, job):
            return 0
        free = len(free_of(state, worker, result.dispatch))
        # a claim takes from the worker's free devices what the holder's own do not cover
        free -= sum(max(0, j.gpus - len(devices_of(h, worker))) for j, h, w in claimed
                    if w == worker.worker_id)
        if reserved_at is not None and result.position[job.id] > reserved_at:
            free = max(0, free - reserved.get(worker.worker_id, 0))
        return free + len(set(devices_of(holder, worker)))

    def room(holder: HoldingJob, job: WaitingJob) -> tuple[int, str]:
        """The most room on one host of the holder, the lowest id among equals."""
        hosts = sorted(host.worker_id for host in hosts_of(holder) if host.worker_id in live)
        options = [(room_on(holder, job, live[w]), w) for w in hosts]
        return max(options, key=lambda o: o[0], default=(0, ""))  # max keeps the first of equals

    def all_live(holder: HoldingJob) -> bool:
        return all(host.worker_id in live for host in hosts_of(holder))

    high = [j for j in left if j.priority == "high" and result.pending[j.id] in WANTS_A_WORKER]
    freeing = [
        h for h in state.holding
        if h.pool == pool and h.status == "running" and h.preempt_requested and all_live(h)
    ]
    remaining = []
    for job in high:
        fits = [h for h in freeing if room(h, job)[0] >= job.gpus]
        if not fits:
            remaining.append(job)
            continue
        if not within_quota(job):
            continue
        holder = min(fits, key=lambda h: (room(h, job), h.id))
        freeing.remove(holder)
        claimed.append((job, holder, room(holder, job)[1]))
        result.pending[job.id] = "preempting"
    for job in remaining:
        if not within_quota(job):
            continue
        candidates = [
            h
            for h in state.holding
            if h.pool == pool and h.status == "running" and not h.preempt_requested
            and rank(h.priority) > 0 and h.team_id != job.team_id and h not in victims
            and all_live(h) and room(h, job)[0] >= job.gpus
            and holding_gpus(state, h.team_id, pool)
            - sum(v.gpus for v in victims if v.team_id == h.team_id) > fair[h.team_id]
        ]
        if candidates:
            victim = max(candidates, key=lambda h: (rank(h.priority), h.since, h.id))
            victims.append(victim)
            claimed.append((job, victim, room(victim, job)[1]))
            result.pending[job.id] = "preempting"
            result.preempt.append(Preemption(victim.id, job.id))


def gang_holders(rng: random.Random, workers: tuple[Worker, ...], spares: dict[str, list[int]],
                 team_ids: list[int], first_id: int) -> list[HoldingJob]:
    """Now and then a gang per pool on what two or three of its workers have spare, sometimes
    with a host that stopped heartbeating."""
    holders = []
    for pool in sorted({w.pool for w in workers}):
        hosts = [w.worker_id for w in workers if w.pool == pool and spares[w.worker_id]]
        if len(hosts) < 2 or rng.random() < 0.5:
            continue
        chosen = rng.sample(hosts, min(len(hosts), rng.choice((2, 3))))
        shares = [Share(w, tuple(sorted(spares[w]))) for w in chosen]
        if rng.random() < 0.2:
            shares.append(Share("gone", (0,)))
        shares.sort(key=lambda share: (-len(share.devices), share.worker_id))
        holders.append(HoldingJob(
            first_id + len(holders), rng.choice(team_ids), pool, sum(len(share.devices) for share in shares),
            rng.choice(PRIORITY_ORDER), shares[0].worker_id, rng.choice(("running", "running", "cancelling")),
            float(rng.randint(0, 5)), preempt_requested=rng.random() < 0.1, devices=shares[0].devices,
            gang=tuple(shares[1:])))
    return holders


def random_state(
    rng: random.Random, jobs: int, teams: int, workers: int, pools: tuple[str, ...] = ("a", "b"),
    busy: float = 0.5, edge_cases: bool = True,
) -> ClusterState:
    """A seeded synthetic state: workers packed with holders on disjoint devices (one more while
    a draw is under ``busy``), weights
    0.5-4, some quotas (0 included), mixed priorities, jobs mostly of 1 GPU, some 2 or 4. Values
    come from short lists so that fair-share keys tie often. ``edge_cases`` adds what a benchmark
    does not need: a held pool now and then, holders with no devices recorded, devices a
    worker reports busy outside SQL, jobs for a pool with no workers or too large for any
    worker, holders on workers that stopped heartbeating, gangs holding what is spare on several
    workers, teams missing from ``state.teams``,
    jobs waiting out a requeue backoff, and jobs that require a capability only some workers (or
    none) advertise. Those are drawn last, so the rest of a seed's state does not depend on them."""
    live = tuple(
        Worker(f"w{i:03d}", rng.choice(pools), rng.choice((1, 1, 2, 4, 8))) for i in range(workers)
    )
    if edge_cases:  # now and then a device held by a job SQL no longer gives its worker
        live = tuple(replace(w, busy=(rng.randrange(w.gpus),)) if rng.random() < 0.05 else w for w in live)
    team_map = {
        t: Team(t, rng.choice((0.5, 1.0, 1.0, 2.0, 3.0, 4.0)),
                {p: rng.choice((0, 2, 4, 8, 16)) for p in pools if rng.random() < 0.3})
        for t in range(teams)
    }
    team_ids = list(range(teams + (max(1, teams // 5) if edge_cases else 0)))
    job_pools = (*pools, "nowhere") if edge_cases else pools
    job_gpus = (1, 1, 1, 1, 2, 4, 16) if edge_cases else (1, 1, 1, 1, 1, 2, 4)
    slots = jobs + 9 * workers + 10  # a worker has at most 8 holders
    ids = iter(rng.sample(range(1, 10 * slots), slots))  # unique, unordered
    holders = []
    spares: dict[str, list[int]] = {}  # what each worker has left once packed
    for w in live:  # each worker packed with holders on disjoint devices while the dice say busy
        spare = spares[w.worker_id] = rng.sample(range(w.gpus), w.gpus)
        while spare and rng.random() < busy:
            count = rng.randint(1, len(spare))
            devices, spare = tuple(sorted(spare[:count])), spare[count:]
            spares[w.worker_id] = spare
            if edge_cases and rng.random() < 0.05:  # dispatched before devices were recorded
                devices = ()
            holders.append(HoldingJob(
                next(ids), rng.choice(team_ids), w.pool, count, rng.choice(PRIORITY_ORDER), w.worker_id,
                rng.choice(("running", "running", "running", "dispatched", "cancelling")),
                float(rng.randint(0, 5)), preempt_requested=rng.random() < 0.1, devices=devices))
    if edge_cases:  # holders whose worker is gone: they count for quota and fair share only
        holders += [
            HoldingJob(next(ids), rng.choice(team_ids), rng.choice(pools), rng.choice((1, 2)), "normal",
                       rng.choice((None, "gone")), "running", 0.0)
            for _ in range(rng.randint(0, 2))
        ]
    waiting = tuple(
        WaitingJob(next(ids), rng.choice(team_ids), rng.choice(job_pools), rng.choice(job_gpus),
                   rng.choice(PRIORITY_ORDER), backoff=edge_cases and rng.random() < 0.05)
        for _ in range(jobs)
    )
    usage = {(t, p): rng.choice((0.0, 0.5, 1.0, 3.0)) for t in team_ids for p in pools if rng.random() < 0.5}
    held_pools = frozenset(p for p in pools if edge_cases and rng.random() < 0.05)
    if edge_cases:
        sandboxed = frozenset({"code_sandbox"})
        live = tuple(replace(w, capabilities=sandboxed) if rng.random() < 0.4 else w for w in live)
        waiting = tuple(replace(j, requires=rng.choice((sandboxed, frozenset({"gpu_fp8"}))))
                        if rng.random() < 0.15 else j for j in waiting)
        holders += gang_holders(rng, live, spares, team_ids, first_id=10 * slots)
    return ClusterState(live, waiting, tuple(holders), team_map, held_pools, usage)
