"""The scheduler's side of the store: the cluster's state (:mod:`api.domain.cluster_state`) that the
scheduling policy decides on, and the writes that carry out a plan (dispatch to a worker, ask a
job to yield, pending reasons).

Reads select only the columns the policy needs (never a job's spec): a tick reads every waiting
and holding job, and 10,000 of them must stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, bindparam, or_, select, update
from sqlalchemy.orm import Session

from api.domain import cluster_state
from api.domain.lifecycle import HOLDING_STATUSES, WAITING_STATUSES, JobStatus, Transition
from api.schemas.jobs import as_utc
from api.store.clock import db_now
from api.store.gangs import placement_record, record_hosts
from api.store.jobs import transition
from api.store.pools import PoolSize
from api.store.tables import Allocation, Job, Pool, Team
from api.store.teams import quotas_by_team
from api.store.telemetry import add_event
from api.vocabulary import Heartbeat

_JOBS = Job.__table__
# Older allocations weigh under 2**-12 of a fresh one: not worth reading.
USAGE_HORIZON_HALF_LIVES = 12


def epoch(value: datetime) -> float:
    return as_utc(value).timestamp()  # SQLite hands back naive datetimes; every stored time is UTC


@dataclass(frozen=True)
class WaitingInfo:
    """What the queue view shows of a waiting job beyond what the policy needs."""

    name: str
    pending_reason: str | None


@dataclass
class SchedulingState:
    cluster: cluster_state.ClusterState
    # name -> (held, its recorded size: largest worker, all live workers' GPUs); the scheduler
    # compares the size with the heartbeats, to write it only when it changed
    pools: dict[str, tuple[bool, PoolSize]]
    team_names: dict[int, str]
    waiting_info: dict[int, WaitingInfo] = field(default_factory=dict)


def gang_of(placement: list[dict] | None) -> tuple[cluster_state.Share, ...]:
    """A holding job's shares on the hosts after its first (none for a job on one worker)."""
    others = (placement or [])[1:]
    return tuple(cluster_state.Share(host["worker"], tuple(host["devices"])) for host in others)


def schedulable_workers(heartbeats: list[Heartbeat], holding: list[cluster_state.HoldingJob],
                        ) -> list[cluster_state.Worker]:
    """Live workers as the policy sees them. Devices a worker reports in use by a job SQL no
    longer gives it (its lease was lost; the child is stopping) stay busy until it reports them
    free; the devices of jobs SQL does give it are counted from SQL (they may not have started)."""
    assigned = {(job.id, job.worker_id) for job in holding}
    assigned |= {(job.id, share.worker_id) for job in holding for share in job.gang}
    workers = []
    for beat in heartbeats:
        busy = {device for job_id, devices in beat.jobs.items() if (job_id, beat.worker_id) not in assigned
                for device in devices}
        workers.append(cluster_state.Worker(beat.worker_id, beat.pool, beat.gpus, tuple(sorted(busy)),
                                            frozenset(beat.capabilities)))
    return workers


def load_state(session: Session, heartbeats: list[Heartbeat], now: datetime, half_life: float,
               ) -> SchedulingState:
    """Everything :func:`api.scheduling.policy.plan` needs: SQL read in one transaction, plus the live
    workers' heartbeats (``api.store.bus.live_workers``). ``now``: the database's clock
    (:func:`api.store.clock.db_now`), which requeue backoffs are timed by."""
    # Core on the session's connection: the ORM's per-row bookkeeping was most of a 10k-job read.
    conn = session.connection()
    waiting, info = [], {}
    c = _JOBS.c
    waiting_rows = conn.execute(select(c.id, c.team_id, c.pool, c.gpus, c.priority, c.name, c.pending_reason,
                                       c.retry_at, c.required_capabilities)
                                .where(c.status.in_(WAITING_STATUSES)).order_by(c.id))
    requirements: dict[tuple[str, ...], frozenset[str]] = {(): frozenset()}  # one set per distinct list
    for job_id, team_id, pool, gpus, priority, name, reason, retry_at, required in waiting_rows:
        backing_off = retry_at is not None and as_utc(retry_at) > now
        key = tuple(required or ())
        requires = requirements.setdefault(key, frozenset(key))
        waiting.append(cluster_state.WaitingJob(job_id, team_id, pool, gpus, priority, backing_off, requires))
        info[job_id] = WaitingInfo(name, reason)
    holding = [
        cluster_state.HoldingJob(row.id, row.team_id, row.pool, row.gpus, row.priority, row.worker_id,
                                 row.status, epoch(row.dispatched_at) if row.dispatched_at else 0.0,
                                 bool(row.preempt_requested), tuple(row.devices or ()),
                                 gang_of(row.placement))
        for row in conn.execute(
            select(c.id, c.team_id, c.pool, c.gpus, c.priority, c.worker_id, c.status, c.dispatched_at,
                   c.preempt_requested, c.devices, c.placement).where(c.status.in_(HOLDING_STATUSES))
        )
    ]
    quotas = quotas_by_team(session)
    teams, names = {}, {}
    for team_id, name, weight in session.execute(select(Team.id, Team.name, Team.weight)):
        teams[team_id] = cluster_state.Team(team_id, weight, quotas.get(team_id, {}))
        names[team_id] = name
    pools = {name: (bool(held), PoolSize(most, total)) for name, held, most, total in
             session.execute(select(Pool.name, Pool.held, Pool.max_worker_gpus, Pool.total_gpus))}
    horizon = now - timedelta(seconds=USAGE_HORIZON_HALF_LIVES * half_life)
    recent = or_(Allocation.ended_at.is_(None), Allocation.ended_at > horizon)
    intervals = [
        cluster_state.Interval(row.team_id, row.pool, row.gpus, epoch(row.started_at),
                               epoch(row.ended_at) if row.ended_at else None)
        for row in session.execute(
            select(Allocation.team_id, Allocation.pool, Allocation.gpus, Allocation.started_at,
                   Allocation.ended_at).where(recent)
        )
    ]
    cluster = cluster_state.ClusterState(
        workers=tuple(schedulable_workers(heartbeats, holding)), waiting=tuple(waiting),
        holding=tuple(holding), teams=teams,
        held_pools=frozenset(name for name, (held, _) in pools.items() if held),
        recent_usage=cluster_state.decayed_usage(intervals, now.timestamp(), half_life),
    )
    return SchedulingState(cluster, pools, names, info)


def dispatch_job(session: Session, job_id: int, worker_id: str, devices: tuple[int, ...] | None = None,
                 gang: tuple[cluster_state.Share, ...] = ()) -> int | None:
    """A waiting job is promised to ``devices`` of ``worker_id`` (None: the whole worker, as before
    devices were recorded) and, for a gang, to the devices of each of ``gang``'s workers too: it
    holds them from now (the transition opens an allocation, which quotas and fair share count)
    until it leaves the holding statuses. Only that worker may claim it (a gang's other hosts join
    it: :mod:`api.store.gangs`), and each host's child sees only its own devices. The dispatch's
    number (``jobs.dispatches``), which its message carries: only a delivery of this dispatch may
    claim it. None when the job was no longer waiting."""
    recorded = None if devices is None else list(devices)
    hosts = [(worker_id, tuple(devices or ())), *((share.worker_id, share.devices) for share in gang)]
    placement = None if devices is None else placement_record(hosts)
    # The database's clock: the lease reaper and the claim window compare it with their own reading.
    values = {"worker_id": worker_id, "devices": recorded, "dispatched_at": db_now(session),
              "pending_reason": None, "preempt_requested": False, "retry_at": None, "placement": placement,
              "dispatches": _JOBS.c.dispatches + 1}
    where = worker_id if devices is None else "; ".join(
        f"{host} devices {','.join(map(str, shares))}" for host, shares in hosts)
    data: dict = {"devices": recorded}
    if gang:
        data["placement"] = placement
    if transition(session, job_id, via=Transition.DISPATCH, values=values, message=f"dispatched to {where}",
                  data=data) is None:
        return None
    if gang:
        record_hosts(session, job_id, hosts)
    return session.execute(select(_JOBS.c.dispatches).where(_JOBS.c.id == job_id)).scalar_one()


def undispatch(session: Session, job_id: int, message: str, *, worker_id: str | None = None,
               guard: ColumnElement[bool] | None = None, data: dict | None = None) -> bool:
    """A dispatched job whose message did not reach its worker goes back to the queue as it was:
    no attempt was used, so none is charged and there is no backoff; the scheduler places it again
    on its next pass. False when it is no longer dispatched (claimed meanwhile, say)."""
    return transition(session, job_id, via=Transition.UNDISPATCH, message=message, worker_id=worker_id,
                      guard=guard, data=data, values={"dispatched_at": None}) is not None


def undispatch_unclaimed(session: Session, window_seconds: float, now: datetime | None = None) -> list[int]:
    """Dispatches no worker claimed within ``window_seconds`` (on the database's clock, as the
    dispatch was stamped), back to the queue: their message was lost on its way (a broker or a
    worker that dropped it), and waiting for the lease would hold the job's GPUs idle for as long.
    The move is guarded by the dispatch's number, so a claim that lands meanwhile keeps its job; a
    delivery of the old dispatch that still arrives is refused (:func:`api.store.attempts.claim`)."""
    c = _JOBS.c
    cutoff = (now or db_now(session)) - timedelta(seconds=window_seconds)
    unclaimed = (c.status == JobStatus.DISPATCHED.value) & (c.dispatched_at < cutoff)
    moved = []
    rows = session.execute(select(c.id, c.worker_id, c.dispatches).where(unclaimed)).all()
    for job_id, worker_id, number in rows:
        message = f"not claimed by {worker_id} within {window_seconds:g} s (dispatch {number}); " \
                  "back to the queue"
        data = {"reason": "not_claimed", "dispatch": number, "claim_window_seconds": window_seconds}
        if undispatch(session, job_id, message, guard=unclaimed & (c.dispatches == number), data=data):
            moved.append(job_id)
    return moved


def request_preempt(session: Session, job_id: int, for_job_id: int) -> bool:
    """Ask a running job to checkpoint and give its worker up to ``for_job_id``; False when it is
    no longer running (it finished, or is being cancelled, which frees the worker anyway)."""
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING.value, Job.preempt_requested.is_(False))
        .values(preempt_requested=True)
        .execution_options(synchronize_session=False)
    )
    if session.execute(stmt).rowcount != 1:
        return False
    add_event(session, job_id, "preempt_requested", f"preempted for job {for_job_id}; checkpointing",
              {"for_job_id": for_job_id}, "warning")
    return True


def yield_preempted(session: Session, job_id: int, worker_id: str, step: int) -> bool:
    """The preempted job checkpointed at ``step``: back to the queue (status ``preempted``),
    where it keeps its place by age and later resumes from that checkpoint."""
    message = f"preempted at step {step}; back in the queue"  # the transition releases its worker
    # A preemption is the scheduler's doing, not a fault: the attempt budget counts machine faults
    # since the job last ran to a clean stop, so a job preempted often keeps all of it.
    return transition(session, job_id, via=Transition.YIELD, message=message, data={"step": step},
                      worker_id=worker_id, values={"heartbeat_at": None, "attempt_base": _JOBS.c.attempt}
                      ) is not None


def set_pending_reasons(session: Session, reasons: dict[int, str | None]) -> None:
    """The scheduler's verdict for waiting jobs, written only where it changed (one statement)."""
    if not reasons:
        return
    stmt = (
        update(_JOBS)
        # OR, not IN: executemany cannot expand an IN list.
        .where(_JOBS.c.id == bindparam("job_id"), or_(*(_JOBS.c.status == s for s in WAITING_STATUSES)))
        .values(pending_reason=bindparam("reason"))
    )
    session.connection().execute(stmt, [{"job_id": k, "reason": v} for k, v in reasons.items()])
