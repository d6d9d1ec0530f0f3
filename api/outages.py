"""What a backend outage raises: the database or Redis did not answer (connection refused or
dropped, a timeout, a pool exhausted). The service's trouble, not the request's, so callers answer
"try again later" (HTTP 503, WebSocket close 1013) rather than a server error."""

from __future__ import annotations

import redis.exceptions
import sqlalchemy.exc

DATABASE_DOWN = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.TimeoutError)
REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
OUTAGES = (*DATABASE_DOWN, *REDIS_DOWN)


def backend_down(exc: BaseException) -> str | None:
    """Which backend ``exc`` says is unavailable ("the database", "redis"), or None."""
    if isinstance(exc, DATABASE_DOWN):
        return "the database"
    if isinstance(exc, REDIS_DOWN):
        return "redis"
    return None
