"""Whether a scheduler is running, as a reader can tell: the leader stamps ``keys.scheduler_pass``
after every pass (``api.store.bus.mark_scheduler_pass``). A stamp older than
:func:`stale_after_seconds`, or none at all, means no scheduler leads this namespace: waiting jobs
then say ``no_scheduler`` instead of a reason from the scheduler's last pass, which would read as
if someone were still deciding.

The bound is twice the leader lock's lifetime: when a leader dies, another scheduler can only
take over once its lock expires, so a gap that long is a normal failover, not an outage.
"""

from __future__ import annotations

from datetime import datetime

from api.settings import Settings
from api.store.tables import utcnow

NO_SCHEDULER = "no_scheduler"  # a job's pending_reason while no scheduler runs (never stored)
MIN_LEADER_TTL_S = 5.0


def leader_ttl_seconds(settings: Settings) -> float:
    """How long the leader lock outlives its holder's last renewal: ten passes, at least 5 s, so
    a slow pass (a large queue, a slow database) does not lose the lock to a standby."""
    return max(MIN_LEADER_TTL_S, 10 * settings.scheduler_interval_seconds)


def stale_after_seconds(settings: Settings) -> float:
    return 2 * leader_ttl_seconds(settings)


def pass_age_seconds(stamp: bytes | str | None, now: datetime | None = None) -> float | None:
    """Seconds since the stamp (negative ages, a clock ahead of ours, read as 0); None: no stamp."""
    if not stamp:
        return None
    passed = datetime.fromisoformat(stamp.decode() if isinstance(stamp, bytes) else stamp)
    return max(0.0, ((now or utcnow()) - passed).total_seconds())


def scheduler_alive(age_seconds: float | None, settings: Settings) -> bool:
    return age_seconds is not None and age_seconds <= stale_after_seconds(settings)
