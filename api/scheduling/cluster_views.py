"""``GET /v1/cluster`` and ``GET /v1/queue``: their wire schemas and the pure functions that build
them from what the scheduler sees (``api.store.dispatching.SchedulingState``, worker heartbeats,
the policy's fair shares) or published (the queue snapshot).

A job spanning hosts (a gang) is one job everywhere: it is listed once among the running jobs,
with its placement (every worker and its devices, node-rank order) and its total GPUs, and each
worker it holds devices on names its share (``WorkerView.gangs``). SQL is the truth of what a
worker is promised: a holder's ``gang`` (from ``jobs.placement``) makes its followers' devices
busy even before their heartbeats report the job.

Scoping: a member sees every pool, worker and team's usage against its quota (that is what
explains a wait), but only its own team's jobs; another team's job appears nowhere by id or
name. An admin sees everything.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from api.domain.cluster_state import HoldingJob, Share
from api.scheduling import policy
from api.scheduling.liveness import NO_SCHEDULER
from api.schemas.jobs import HostPlacement, UtcDatetime
from api.store.dispatching import SchedulingState
from api.store.pools import PoolSize
from api.vocabulary import Heartbeat


class DeviceView(BaseModel):
    index: int  # the scheduler's index on its worker (what CUDA_VISIBLE_DEVICES maps it to is the worker's)
    busy: bool  # held by a job SQL gives it, or used by one its heartbeat reports
    job_id: int | None  # the job on it; None also when the job is another team's (members)


class GangShareView(BaseModel):
    """A worker's part of a job spanning hosts (a gang)."""

    job_id: int
    node_rank: int  # 0 is the host that runs the rendezvous and reports the job's steps
    hosts: int  # how many workers the job spans
    devices: list[int] | None  # its indices on this worker; None: all (node 0 dispatched before devices were)


class WorkerView(BaseModel):
    worker_id: str
    hostname: str | None
    gpus: int
    gpu_model: str | None
    gpu_memory_mb: int | None
    memory_mb: int | None
    busy: bool  # any of its devices is
    devices: list[DeviceView]
    capabilities: list[str] = []  # checked at its start, e.g. code_sandbox (the code_tests reward)
    gangs: list[GangShareView] = []  # its shares of jobs spanning hosts that the caller may see


class PoolView(BaseModel):
    name: str
    held: bool
    max_worker_gpus: int | None
    gpus_total: int  # advertised by live workers
    gpus_busy: int
    gpus_free: int
    waiting: int
    workers: list[WorkerView]


class TeamPoolUsage(BaseModel):
    held_gpus: int
    quota: int | None  # None: no quota in this pool
    fair_share: float | None  # pool GPUs x weight / sum of weights of teams with jobs in the pool
    recent_gpus: float  # GPUs held, averaged over the past with the fair-share half-life
    waiting: int


class TeamView(BaseModel):
    team_id: int
    team: str
    weight: float
    pools: dict[str, TeamPoolUsage]


class RunningView(BaseModel):
    job_id: int
    team: str | None
    pool: str
    gpus: int
    priority: str
    status: str
    worker_id: str | None  # node 0's, for a job spanning hosts
    devices: list[int] | None  # its indices on worker_id; None: dispatched before they were recorded
    # Every worker it holds devices on, node-rank order: one, or several for a gang (gpus is the total).
    placement: list[HostPlacement]
    preempt_requested: bool


class ClusterView(BaseModel):
    pools: list[PoolView]
    teams: list[TeamView]
    running: list[RunningView]


class QueueEntry(BaseModel):
    job_id: int
    name: str
    team: str | None
    pool: str
    gpus: int
    priority: str
    position: int
    pending_reason: str | None


class QueueView(BaseModel):
    updated_at: UtcDatetime | None  # when the scheduler last changed the order
    scheduler_pass_at: UtcDatetime | None  # its latest pass; old means no scheduler is running
    waiting: dict[str, int]  # every team's waiting jobs per pool
    items: list[QueueEntry]  # the caller's (an admin: everyone's), in dispatch order per pool


def cluster_view(state: SchedulingState, heartbeats: list[Heartbeat],
                 fair_share: dict[tuple[int, str], float], scope: int | None) -> ClusterView:
    """``scope``: the caller's team id, or None for an admin."""
    cluster = state.cluster
    on_worker: dict[str, list[tuple[int, HoldingJob]]] = {}  # worker -> (node rank, job) of each holder
    for job in cluster.holding:
        for rank, share in enumerate(_hosts(job)):
            on_worker.setdefault(share.worker_id, []).append((rank, job))
    pool_names = sorted({*state.pools, *(beat.pool for beat in heartbeats)})
    waiting = _count((job.team_id, job.pool) for job in cluster.waiting)
    pools = []
    for name in pool_names:
        workers = [_worker_view(beat, on_worker.get(beat.worker_id, []), scope)
                   for beat in heartbeats if beat.pool == name]
        total = sum(worker.gpus for worker in workers)
        busy = sum(device.busy for worker in workers for device in worker.devices)
        held, size = state.pools.get(name, (False, PoolSize(None, None)))
        pools.append(PoolView(name=name, held=held, max_worker_gpus=size.largest_worker, gpus_total=total,
                              gpus_busy=busy, gpus_free=total - busy,
                              workers=sorted(workers, key=lambda w: w.worker_id),
                              waiting=sum(n for (_, pool), n in waiting.items() if pool == name)))
    held_gpus = _count(((job.team_id, job.pool) for job in cluster.holding),
                       [job.gpus for job in cluster.holding])
    teams = []
    for team_id, team in sorted(cluster.teams.items()):
        known = (*held_gpus, *waiting, *cluster.recent_usage, *fair_share)
        keys = {key for key in known if key[0] == team_id}
        keys |= {(team_id, pool) for pool in team.quotas}
        usage = {pool: TeamPoolUsage(held_gpus=held_gpus.get((team_id, pool), 0),
                                     quota=team.quotas.get(pool),
                                     fair_share=fair_share.get((team_id, pool)),
                                     recent_gpus=round(cluster.recent_usage.get((team_id, pool), 0.0), 4),
                                     waiting=waiting.get((team_id, pool), 0))
                 for _, pool in sorted(keys)}
        teams.append(TeamView(team_id=team_id, team=state.team_names.get(team_id, str(team_id)),
                              weight=team.weight, pools=usage))
    running = [_running_view(job, state.team_names.get(job.team_id))
               for job in sorted(cluster.holding, key=lambda job: job.id) if scope in (None, job.team_id)]
    return ClusterView(pools=pools, teams=teams, running=running)


def queue_view(snapshot: dict[str, Any] | None, scheduler_pass_at: str | None, scope: int | None,
               pool: str | None = None, scheduler_alive: bool = True) -> QueueView:
    """With no scheduler alive, the last published order stays, but no one is deciding any more:
    every entry says ``no_scheduler`` (``api.scheduling.liveness``)."""
    entries = (snapshot or {}).get("entries", [])
    if not scheduler_alive:
        entries = [{**entry, "pending_reason": NO_SCHEDULER} for entry in entries]
    if pool is not None:
        entries = [entry for entry in entries if entry["pool"] == pool]
    waiting = _count(entry["pool"] for entry in entries)
    mine = [QueueEntry(**{key: entry.get(key) for key in QueueEntry.model_fields})
            for entry in entries if scope in (None, entry["team_id"])]
    return QueueView(updated_at=(snapshot or {}).get("updated_at"), scheduler_pass_at=scheduler_pass_at,
                     waiting=dict(sorted(waiting.items())), items=mine)


def _running_view(job: HoldingJob, team: str | None) -> RunningView:
    """One row per job, a gang's too: its placement names every host."""
    placement = [HostPlacement(worker=share.worker_id, devices=list(share.devices) or None)
                 for share in _hosts(job)]
    return RunningView(job_id=job.id, team=team, pool=job.pool, gpus=job.gpus, priority=job.priority,
                       status=job.status, worker_id=job.worker_id, devices=list(job.devices) or None,
                       placement=placement, preempt_requested=job.preempt_requested)


def _hosts(job: HoldingJob) -> list[Share]:
    """The job's share on each worker, node-rank order (node 0's ``devices`` empty: the whole worker)."""
    return [Share(job.worker_id, job.devices), *job.gang] if job.worker_id else []


def _worker_view(beat: Heartbeat, holders: list[tuple[int, HoldingJob]], scope: int | None) -> WorkerView:
    """Each device of the worker and the job on it: SQL's holders first (by the devices recorded
    with their dispatch, on this worker for a gang's node ``rank``), then jobs only the heartbeat
    reports (an admin sees their ids; their team is not known here)."""
    owner: dict[int, int | None] = {}
    for job_id, devices in beat.jobs.items():
        owner.update(dict.fromkeys(devices, job_id if scope is None else None))
    gangs = []
    for rank, job in holders:
        share = _hosts(job)[rank]
        held = policy.held_devices(job, beat.gpus) if rank == 0 else frozenset(share.devices)
        visible = scope in (None, job.team_id)
        owner.update(dict.fromkeys(held, job.id if visible else None))
        if job.gang and visible:
            gangs.append(GangShareView(job_id=job.id, node_rank=rank, hosts=1 + len(job.gang),
                                       devices=list(share.devices) or None))
    devices = [DeviceView(index=index, busy=index in owner, job_id=owner.get(index))
               for index in range(beat.gpus)]
    return WorkerView(worker_id=beat.worker_id, hostname=beat.hostname, gpus=beat.gpus,
                      gpu_model=beat.gpu_model, gpu_memory_mb=beat.gpu_memory_mb, memory_mb=beat.memory_mb,
                      busy=bool(owner), devices=devices, capabilities=beat.capabilities,
                      gangs=sorted(gangs, key=lambda gang: gang.job_id))


def _count(keys, amounts: list[int] | None = None) -> dict:
    counts: dict = {}
    for index, key in enumerate(keys):
        counts[key] = counts.get(key, 0) + (1 if amounts is None else amounts[index])
    return counts
