"""Transient database errors on the worker's reporting path, retried.

A dropped connection (Postgres restarted, a session terminated by an operator or a failover, a
network blip) is the infrastructure's fault, not the job's: the write is tried again, backing
off, for up to ``GRPO_DB_RETRY_SECONDS``. Every write retried this way is idempotent (a step's
record is keyed by job and step, a transition is guarded by the job's status), so a retry whose
first try did commit changes nothing. A database away for longer raises
:class:`DatabaseUnavailable`, which ends the attempt without failing the job.

Errors the database gives for the statement itself (a constraint, bad data, a bug in our SQL)
are not transient: retrying cannot help, they propagate at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import exc

log = logging.getLogger(__name__)
T = TypeVar("T")

DATABASE_UNAVAILABLE = "database_unavailable"
FIRST_DELAY_SECONDS = 0.1
MOST_DELAY_SECONDS = 5.0


class DatabaseUnavailable(Exception):
    """The database stayed unreachable for the whole retry budget."""

    code = DATABASE_UNAVAILABLE


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is about reaching the database rather than about the statement: a
    connection lost or refused (``OperationalError``, an invalidated connection, the driver's
    ``InterfaceError`` on a closed one) or the pool's own timeout/disconnect."""
    if isinstance(error, exc.DBAPIError):
        return error.connection_invalidated or isinstance(error, exc.OperationalError | exc.InterfaceError)
    return isinstance(error, exc.DisconnectionError | exc.TimeoutError)


def retry_transient(fn: Callable[[], T], budget_seconds: float, what: str = "database call",
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, tried again through transient errors with exponential backoff and jitter
    (0.1 s doubling to 5 s), until it succeeds or ``budget_seconds`` have passed since the first
    try: then :class:`DatabaseUnavailable`, chained to the last error. ``fn`` must be safe to run
    twice (its first try may have committed before the connection dropped)."""
    deadline = time.monotonic() + budget_seconds
    delay = FIRST_DELAY_SECONDS
    tries = 0
    while True:
        try:
            return fn()
        except Exception as error:
            if not is_transient(error):
                raise
            tries += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise DatabaseUnavailable(
                    f"the database was unreachable for {budget_seconds:g} s ({what}, {tries} tries): "
                    f"{_first_line(error)}") from error
            if tries == 1:
                log.warning("%s failed, retrying for up to %g s: %s", what, budget_seconds,
                            _first_line(error))
            # Full jitter on the upper half: workers that lost the database together do not all
            # come back on the same tick.
            sleep(min(left, delay * random.uniform(0.5, 1.0)))
            delay = min(MOST_DELAY_SECONDS, delay * 2)


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__
