"""GPU pools: named sets of workers. Workers register theirs (:func:`ensure_pool`); operators
create pools ahead of their workers and hold one to stop dispatch into it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from api.domain.errors import Conflict, NotFound
from api.schemas.admin import PoolLimits, PoolRead
from api.store._checks import check_name
from api.store._rows import dialect_insert
from api.store.tables import Pool, utcnow
from api.vocabulary import Heartbeat

_POOLS = Pool.__table__


def _read(pool: Pool) -> PoolRead:
    return PoolRead(name=pool.name, held=pool.held, max_worker_gpus=pool.max_worker_gpus,
                    total_gpus=pool.total_gpus, limits=PoolLimits.model_validate(pool.limits or {}),
                    created_at=pool.created_at)


def _insert(session: Session, name: str) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING: two processes registering one pool at once both
    succeed (one inserts), where a check-then-insert would fail one of them. True if inserted."""
    stmt = dialect_insert(session.get_bind().dialect.name, _POOLS).values(
        name=check_name(name, "pool"), held=False, max_worker_gpus=None, created_at=utcnow())
    # RETURNING, not rowcount: psycopg reports -1 for this statement.
    stmt = stmt.on_conflict_do_nothing(index_elements=["name"]).returning(_POOLS.c.name)
    return session.execute(stmt).first() is not None


def ensure_pool(session: Session, name: str) -> None:
    """The pool ``name`` exists afterwards (idempotent)."""
    _insert(session, name)


def create_pool(session: Session, name: str) -> PoolRead:
    if not _insert(session, name):
        raise Conflict(f"pool '{name}' already exists", param="name")
    return get_pool(session, name)


def get_pool(session: Session, name: str) -> PoolRead:
    # populate_existing: an UPDATE above bypassed the identity map, which may hold the old row.
    pool = session.get(Pool, name, populate_existing=True)
    if pool is None:
        raise NotFound(f"pool '{name}' not found", param="pool")
    return _read(pool)


@dataclass(frozen=True)
class PoolSize:
    """What a pool's live workers offered when the scheduler last saw them change (None: never seen)."""

    largest_worker: int | None  # ``max_worker_gpus``: the most GPUs one job gets on one host
    total: int | None  # ``total_gpus``: the most a job spanning hosts (a gang) may ask for


_ADMISSION = (select(_POOLS.c.max_worker_gpus, _POOLS.c.total_gpus, _POOLS.c.limits)
              .where(_POOLS.c.name == bindparam("name")))


def admission(session: Session, name: str) -> tuple[PoolSize, PoolLimits] | None:
    """The pool's size and limit overrides, None if there is no such pool: what the submit path
    checks, one prebuilt Core select (an ORM ``get`` of the row cost as much as inserting the job)."""
    row = session.execute(_ADMISSION, {"name": name}).first()
    return None if row is None else (PoolSize(row[0], row[1]), PoolLimits.model_validate(row[2] or {}))


def set_limits(session: Session, name: str, limits: PoolLimits) -> PoolRead:
    """Replace the pool's overrides (a null field: the default). Jobs already accepted keep running."""
    _update(session, name, limits=limits.model_dump(exclude_none=True) or None)
    return get_pool(session, name)


def list_pools(session: Session) -> list[PoolRead]:
    return [_read(pool) for pool in session.scalars(select(Pool).order_by(Pool.name))]


def _update(session: Session, name: str, **values: object) -> None:
    stmt = update(Pool).where(Pool.name == name).values(**values).execution_options(synchronize_session=False)
    if session.execute(stmt).rowcount != 1:
        raise NotFound(f"pool '{name}' not found", param="pool")


def set_held(session: Session, name: str, held: bool) -> PoolRead:
    """Hold (True) stops dispatch into the pool; running jobs go on. Resume (False) undoes it."""
    _update(session, name, held=held)
    return get_pool(session, name)


def sizes_from_heartbeats(heartbeats: Iterable[Heartbeat]) -> dict[str, PoolSize]:
    """Each served pool's size as its live workers advertise it: the largest worker's GPUs and
    the GPUs of all of them together."""
    seen: dict[str, PoolSize] = {}
    for beat in heartbeats:
        was = seen.get(beat.pool, PoolSize(0, 0))
        seen[beat.pool] = PoolSize(max(was.largest_worker or 0, beat.gpus), (was.total or 0) + beat.gpus)
    return seen


def register_live_pool(session: Session, name: str, heartbeats: Iterable[Heartbeat]) -> bool:
    """Record pool ``name`` with its size if a live worker among ``heartbeats`` serves it (what the
    scheduler's next tick would do): a job submitted the moment a new pool's first worker
    advertises is not refused as naming an unknown pool. False if no live worker serves it."""
    size = sizes_from_heartbeats(beat for beat in heartbeats if beat.pool == name).get(name)
    if size is None:
        return False
    record_pool(session, name, size)
    return True


def record_pool(session: Session, name: str, size: PoolSize) -> None:
    """Pool ``name`` exists afterwards, with ``size`` (what its live workers offer)."""
    ensure_pool(session, name)
    set_size(session, name, size)


def set_size(session: Session, name: str, size: PoolSize) -> None:
    """The largest GPU count a live worker of the pool advertises and the GPUs of all its live
    workers together (None: no live worker seen)."""
    _update(session, name, max_worker_gpus=size.largest_worker, total_gpus=size.total)
