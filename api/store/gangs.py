"""A job that spans hosts (a gang), for the length of one dispatch: its hosts (``job_hosts``), each
host's join and lease, the rendezvous its ranks meet at, and the condition under which a host is
lost.

Node 0 is the job's own worker (``jobs.worker_id``): it claims the job as any worker does
(:func:`api.store.attempts.claim`), its lease is the job's (``jobs.heartbeat_at``), it picks the
rendezvous port and publishes it here, and its rank 0 reports every step. Every other host
*joins*: it takes its row once (a duplicate delivery finds it taken), renews that row as its own
lease, and reads the stop requests through it like node 0. Any host that joined may record how the
attempt ended (:func:`api.store.jobs.held_by`); the first record wins, the others find the job no
longer theirs. The rows go when the job stops holding GPUs (:func:`api.store.jobs.release_hosts`),
so a host's lease can never outlive the dispatch it was for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, insert, or_, select, update
from sqlalchemy.orm import Session

from api.domain.lifecycle import ACTIVE_STATUSES, HOLDING_STATUSES
from api.store.clock import db_now
from api.store.tables import Job, JobHost

_HOSTS = JobHost.__table__
_JOBS = Job.__table__


@dataclass(frozen=True)
class HostPart:
    """One host's part of a gang's attempt: its node rank, the devices it holds, and how many
    ranks each node runs (node-rank order), from which every rank's global rank follows."""

    node_rank: int
    devices: tuple[int, ...]
    node_sizes: tuple[int, ...]

    @property
    def leads(self) -> bool:
        return self.node_rank == 0

    @property
    def rank_offset(self) -> int:
        """The global rank of this host's first rank (ranks are numbered in node order)."""
        return sum(self.node_sizes[:self.node_rank])


def placement_record(hosts: list[tuple[str, tuple[int, ...]]]) -> list[dict[str, Any]]:
    """``jobs.placement`` for a dispatch onto ``hosts`` (worker id, devices), node-rank order."""
    return [{"worker": worker_id, "devices": list(devices)} for worker_id, devices in hosts]


def record_hosts(session: Session, job_id: int, hosts: list[tuple[str, tuple[int, ...]]]) -> None:
    """A gang's rows for a new dispatch, node 0 first; none joined yet."""
    session.execute(insert(_HOSTS), [{"job_id": job_id, "node_rank": rank, "worker_id": worker_id}
                                     for rank, (worker_id, _) in enumerate(hosts)])


def part_of(placement: list[dict[str, Any]] | None, node_rank: int) -> HostPart | None:
    """Host ``node_rank``'s part of a gang placed as ``placement``; None for a job on one worker."""
    if not placement or len(placement) < 2:
        return None
    sizes = tuple(len(host["devices"]) for host in placement)
    return HostPart(node_rank, tuple(placement[node_rank]["devices"]), sizes)


def job_held(job_id: int, dispatch: int | None = None) -> ColumnElement[bool]:
    """The job still holds its GPUs (dispatched or running, not deleted): its gang's rows count;
    with ``dispatch``, only while that is still the job's current dispatch."""
    held = [_JOBS.c.id == job_id, _JOBS.c.status.in_(sorted(HOLDING_STATUSES)), _JOBS.c.deleted_at.is_(None)]
    if dispatch is not None:
        held.append(_JOBS.c.dispatches == dispatch)
    return select(_JOBS.c.id).where(*held).exists()


def joined_host(job_id: int, worker_id: str) -> ColumnElement[bool]:
    """``worker_id``'s row of the job's gang, once it joined."""
    return and_(_HOSTS.c.job_id == job_id, _HOSTS.c.worker_id == worker_id, _HOSTS.c.joined_at.is_not(None))


def join(session: Session, job_id: int, worker_id: str, dispatch: int | None = None) -> HostPart | None:
    """``worker_id`` takes its place in the job's gang for this dispatch: its part, or None when it
    has none (not its gang, or a duplicate delivery that finds its place taken, or the job no
    longer held, or ``dispatch``, the number the delivery's message carries, is not the job's
    current one). Its lease starts now, on the database's clock. Node 0 joins through its claim."""
    now = db_now(session)
    row = session.execute(
        update(_HOSTS)
        .where(_HOSTS.c.job_id == job_id, _HOSTS.c.worker_id == worker_id, _HOSTS.c.node_rank > 0,
               _HOSTS.c.joined_at.is_(None), job_held(job_id, dispatch))
        .values(joined_at=now, heartbeat_at=now)
        .returning(_HOSTS.c.node_rank)
    ).first()
    if row is None:
        return None
    placement = session.execute(select(_JOBS.c.placement).where(_JOBS.c.id == job_id)).scalar()
    return part_of(placement, row.node_rank)


def mark_joined(session: Session, job_id: int, worker_id: str) -> None:
    """Node 0's row once its claim succeeded (its lease is the job's own)."""
    session.execute(update(_HOSTS).where(_HOSTS.c.job_id == job_id, _HOSTS.c.node_rank == 0,
                                         _HOSTS.c.worker_id == worker_id)
                    .values(joined_at=db_now(session)).execution_options(synchronize_session=False))


def publish_rendezvous(session: Session, job_id: int, endpoint: str) -> bool:
    """Node 0 names the ``host:port`` its rendezvous listens on; False when the job is no longer
    held (the attempt is over)."""
    return session.execute(
        update(_HOSTS)
        .where(_HOSTS.c.job_id == job_id, _HOSTS.c.node_rank == 0)
        .values(rendezvous=endpoint)
        .execution_options(synchronize_session=False)
    ).rowcount == 1


def rendezvous(session: Session, job_id: int) -> tuple[str, int] | None:
    """``(endpoint, attempt)`` once node 0 has published its rendezvous for the running attempt;
    None before (the attempt number names the rendezvous, so every host agrees on it)."""
    row = session.execute(
        select(_HOSTS.c.rendezvous, _JOBS.c.attempt)
        .join(_JOBS, _JOBS.c.id == _HOSTS.c.job_id)
        .where(_HOSTS.c.job_id == job_id, _HOSTS.c.node_rank == 0, _HOSTS.c.rendezvous.is_not(None),
               _JOBS.c.status.in_(sorted(ACTIVE_STATUSES)))
    ).first()
    return None if row is None else (row.rendezvous, row.attempt)


def finish_host(session: Session, job_id: int, worker_id: str) -> None:
    """A host's part ended cleanly (its ranks returned): its lease need not be renewed any more while
    node 0 finishes (exports and stores the final model, records the outcome)."""
    session.execute(update(_HOSTS).where(_HOSTS.c.job_id == job_id, _HOSTS.c.worker_id == worker_id)
                    .values(finished_at=func.coalesce(_HOSTS.c.finished_at, db_now(session)))
                    .execution_options(synchronize_session=False))


def lost_host(cutoff: datetime, join_cutoff: datetime | None = None) -> ColumnElement[bool]:
    """A running gang one of whose other hosts is lost: it has not joined since a dispatch made
    before ``join_cutoff`` (the claim window's; None: ``cutoff``), whose message it so never had,
    or its lease was last renewed before ``cutoff``, and its part has not ended cleanly. Node 0's
    loss is the job's own lease's expiry (or, before it claimed, the claim window's)."""
    stale = or_(and_(_HOSTS.c.joined_at.is_(None), _JOBS.c.dispatched_at < (join_cutoff or cutoff)),
                _HOSTS.c.heartbeat_at < cutoff)
    return and_(_JOBS.c.status.in_(sorted(ACTIVE_STATUSES)),
                select(_HOSTS.c.job_id)
                .where(_HOSTS.c.job_id == _JOBS.c.id, _HOSTS.c.node_rank > 0, _HOSTS.c.finished_at.is_(None),
                       stale)
                .exists())

