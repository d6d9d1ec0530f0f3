"""Every ``/v1`` request of a team member takes a token from its team's bucket
(:mod:`api.rate_limits`, :mod:`api.store.rate_buckets`); an empty bucket is a 429 ``rate_limited``
with ``Retry-After``. Admin keys and the operator token are not limited: an admin throttled in an
incident could not even raise a team's limit.

The team's limits are read from SQL once per ``GRPO_AUTH_CACHE_SECONDS`` per process (as keys
are), so the hot path is one Redis call; an admin's change through this process applies at once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from api.errors import RateLimited
from api.http.deps import PrincipalDep, SettingsDep
from api.rate_limits import bucket_kind, bucket_of
from api.schemas.admin import TeamLimits
from api.settings import Settings
from api.store.db import session_scope
from api.store.rate_buckets import TeamBuckets
from api.store.team_admission import team_limits


@dataclass
class TeamLimitsCache:
    """Each team's effective limits for ``ttl`` seconds (0: not kept); event loop only."""

    ttl: float
    entries: dict[int, tuple[TeamLimits, float]]

    def get(self, team_id: int) -> TeamLimits | None:
        entry = self.entries.get(team_id)
        return entry[0] if entry is not None and entry[1] > time.monotonic() else None

    def put(self, team_id: int, limits: TeamLimits) -> None:
        if self.ttl > 0:
            self.entries[team_id] = (limits, time.monotonic() + self.ttl)

    def evict(self, team_id: int) -> None:
        self.entries.pop(team_id, None)


def limits_cache(state: Any) -> TeamLimitsCache:
    """The app's cache (``app.state``), made on first use."""
    cache = getattr(state, "team_limits_cache", None)
    if cache is None:
        cache = state.team_limits_cache = TeamLimitsCache(state.settings.auth_cache_seconds, {})
    return cache


def _buckets(state: Any) -> TeamBuckets:
    buckets = getattr(state, "team_buckets", None)
    if buckets is None:
        buckets = state.team_buckets = TeamBuckets(state.redis, state.settings.redis_keys)
    return buckets


def _read_limits(settings: Settings, team_id: int) -> TeamLimits:
    with session_scope(settings.database_url) as session:
        return team_limits(session, team_id, settings)


async def enforce_rate_limit(conn: HTTPConnection, principal: PrincipalDep, settings: SettingsDep) -> None:
    if principal.is_admin:
        return
    cache = limits_cache(conn.app.state)
    limits = cache.get(principal.team_id)
    if limits is None:
        limits = await run_in_threadpool(_read_limits, settings, principal.team_id)
        cache.put(principal.team_id, limits)
    kind = bucket_kind(conn.scope["type"], conn.scope.get("method"))
    bucket = bucket_of(limits, kind)
    wait = await _buckets(conn.app.state).take(principal.team_id, kind, bucket)
    if wait > 0:
        seconds = max(1, math.ceil(wait))
        raise RateLimited(f"your team is over its {kind} limit ({bucket.rate:g} per second, bursts of "
                          f"{bucket.burst}); retry in {seconds} s", retry_after=seconds)
