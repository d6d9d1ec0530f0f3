"""Preemption, the last step of a scheduling pass in a pool: once its jobs are placed
(:func:`api.scheduling.policy.plan`), a waiting ``high`` job that wants devices claims some that
are about to free, or else asks one running job of a team over its fair share to yield. The rules
are the "Preemption" item of :mod:`api.scheduling.policy`'s docstring; they are tested through
:func:`~api.scheduling.policy.plan` in ``tests/api/test_policy_preemption.py``."""

from __future__ import annotations

from collections import defaultdict

from api.domain.cluster_state import ClusterState, HoldingJob, WaitingJob
from api.scheduling.gang_placement import hosts_held
from api.scheduling.plan_parts import Placed, Plan, Pool, Preemption, held_on, priority_rank, team_quota

# Reasons that mean "no worker has enough free devices now": the only ones preemption can help.
_WANTS_A_WORKER = frozenset({"lower_priority", "fair_share", "no_capacity"})


def _all_live(holder: HoldingJob, live: dict[str, int]) -> bool:
    return all(worker_id in live for worker_id, _ in hosts_held(holder))


def _victims(pool: Pool, live: dict[str, int]) -> list[HoldingJob]:
    """The pool's jobs that may be asked to yield, most preferred first: the lowest priority, then
    the newest. Only running jobs whose every host is live: a job still starting or cancelling
    frees its devices anyway, one on a dead worker frees nothing, and a gang with a dead host is
    requeued by the reaper."""
    candidates = [
        h
        for h in pool.holding
        if h.status == "running" and not h.preempt_requested and priority_rank(h.priority) > 0
        and _all_live(h, live)
    ]
    return sorted(candidates, key=lambda h: (-priority_rank(h.priority), -h.since, -h.id))


def preempt(
    state: ClusterState,
    pool: Pool,
    placed: Placed,
    fair: dict[int, float],
    free: dict[str, int],
    result: Plan,
) -> None:
    """Let the pool's waiting ``high`` jobs that want devices claim some that are about to free, or
    else ask one running job of a team over its fair share to yield (see the module docstring).
    ``free`` is worker -> devices still free after this pass's dispatches, reserved ones included:
    only a job ahead of the reserving gang may count those."""
    live = {w.worker_id: w.gpus for w in pool.workers}
    capabilities = {w.worker_id: w.capabilities for w in pool.workers}
    high = [job for job in placed.left
            if priority_rank(job.priority) == 0 and result.pending[job.id] in _WANTS_A_WORKER]
    # The quota check counts what the team will hold once this pass's preemptions land, so two
    # high jobs of one team cannot together overshoot its quota through preemption.
    reserved = defaultdict(int, placed.real_held)

    def room(holder: HoldingJob, job: WaitingJob) -> tuple[int, str]:
        """The devices ``job`` would get on one host from ``holder`` leaving (that host's free ones
        and the holder's there), on the host where that is most: none on a host it cannot use."""
        behind = placed.reserved_at is not None and result.position[job.id] > placed.reserved_at
        best = (0, "")
        for worker_id, devices in sorted(hosts_held(holder), key=lambda host: host[0] or ""):
            if worker_id in live and job.requires <= capabilities[worker_id]:
                spare = max(0, free[worker_id] - (placed.reserved.get(worker_id, 0) if behind else 0))
                best = max(best, (spare + len(held_on(devices, live[worker_id])), worker_id),
                           key=lambda pair: pair[0])
        return best

    def claim(job: WaitingJob, holder: HoldingJob, worker_id: str) -> bool:
        quota = team_quota(state, job.team_id, pool.name)
        if quota is not None and reserved[job.team_id] + job.gpus > quota:
            return False
        reserved[job.team_id] += job.gpus
        result.pending[job.id] = "preempting"
        devices = dict(hosts_held(holder))[worker_id]
        free[worker_id] -= max(0, job.gpus - len(held_on(devices, live[worker_id])))
        return True

    # Devices whose job was already asked to yield are about to free: they go to a high job before
    # any new victim is chosen, so a preemption in flight is never doubled.
    freeing = [h for h in pool.holding
               if h.status == "running" and h.preempt_requested and _all_live(h, live)]
    remaining = []
    for job in high:
        fits = [(room(h, job), h) for h in freeing]
        fits = [(found, h) for found, h in fits if found[0] >= job.gpus]
        if not fits:
            remaining.append(job)
            continue
        (_, worker_id), holder = min(fits, key=lambda pair: (pair[0], pair[1].id))
        if claim(job, holder, worker_id):
            freeing.remove(holder)

    victims = _victims(pool, live)
    held = defaultdict(int, pool.held)  # less the victims already chosen in this pass
    for job in remaining:
        if not victims:
            break
        chosen = next(
            (
                (h, found[1])
                for h in victims
                if h.team_id != job.team_id and held[h.team_id] > fair[h.team_id]
                and (found := room(h, job))[0] >= job.gpus
            ),
            None,
        )
        if chosen is not None and claim(job, *chosen):
            victim = chosen[0]
            victims.remove(victim)
            held[victim.team_id] -= victim.gpus  # all its GPUs, on every host
            result.preempt.append(Preemption(victim.id, job.id))
