"""The one clock that times leases and backoffs: the database's.

Workers, schedulers and API processes run on different hosts whose clocks drift; a lease stamped
by a worker 20 s behind and judged by a scheduler's clock looks expired on every renewal. So
every time that one process writes and another compares (``heartbeat_at``, ``dispatched_at``,
``retry_at``) is read from the database, which all of them share. On SQLite (one host) that is
the host's clock, the same for every process.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from api.settings import Settings

# SQLite's CURRENT_TIMESTAMP has whole seconds; this has milliseconds, in UTC, in the format
# SQLAlchemy stores datetimes in there.
_SQLITE_NOW = func.strftime("%Y-%m-%d %H:%M:%f", "now")


def db_now(session: Session) -> datetime:
    """The database's current time, as an aware UTC datetime (Postgres: the transaction's start)."""
    if session.get_bind().dialect.name == "sqlite":
        text = session.execute(select(_SQLITE_NOW)).scalar_one()
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    return session.execute(select(func.now())).scalar_one().astimezone(UTC)


@dataclass(frozen=True)
class Backoff:
    """How long a requeued job waits before it may be dispatched again: ``first`` seconds after
    its first attempt, doubling per attempt, at most ``most``; so a fault that repeats at once
    (a database still starting, a bad node) does not burn the attempt limit in seconds."""

    first: float = 0.0
    most: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> Backoff:
        """``GRPO_REQUEUE_BACKOFF_SECONDS`` and ``GRPO_REQUEUE_BACKOFF_MAX_SECONDS``."""
        return cls(settings.requeue_backoff_seconds, settings.requeue_backoff_max_seconds)

    def delay(self, attempts: int) -> float:
        """Seconds to wait after ``attempts`` attempts (0 or 1: ``first``)."""
        return min(self.most, self.first * 2 ** max(0, attempts - 1))

    def until(self, now: datetime, attempts: int) -> datetime | None:
        """When the job may run again, on the database's clock; None: at once."""
        seconds = self.delay(attempts)
        return now + timedelta(seconds=seconds) if seconds > 0 else None
