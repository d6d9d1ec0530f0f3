"""Every ``/v1`` request of a team member pays its cost from its team's bucket
(:mod:`api.limits.rate_limits`, :mod:`api.store.rate_buckets`): before it runs, one token plus its body's
size; a bucket that cannot pay is a 429 ``rate_limited`` with ``Retry-After``. A route whose answer
carries specs charges their size afterwards (:func:`charge_answer`). Admin keys and the operator
token are not limited: an admin throttled in an incident could not even raise a team's limit.

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

from api.domain.errors import RateLimited
from api.http.deps import PrincipalDep, SettingsDep
from api.http.spec_intake import media_type
from api.http.yaml_body import YAML_MEDIA_TYPES
from api.limits.rate_limits import COST_UNIT_BYTES, YAML_WEIGHT, Bucket, bucket_kind, bucket_of, cost_of
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
    weight = YAML_WEIGHT if media_type(conn.headers.get("content-type")) in YAML_MEDIA_TYPES else 1
    wait = await _buckets(conn.app.state).take(principal.team_id, kind, bucket,
                                               cost_of(_body_size(conn), bucket, weight))
    if wait > 0:
        seconds = max(1, math.ceil(wait))
        raise RateLimited(f"your team is over its {kind} limit ({bucket.rate:g} per second, bursts of "
                          f"{bucket.burst}; a request costs one more per {COST_UNIT_BYTES // 1024} KiB it "
                          f"carries); retry in {seconds} s", retry_after=seconds)
    conn.state.rate_bucket = _Paid(principal.team_id, kind, bucket)


@dataclass(frozen=True)
class _Paid:
    """The bucket a request paid from, for what its answer costs on top."""

    team_id: int
    kind: str
    bucket: Bucket


def _body_size(conn: HTTPConnection) -> int:
    """The body's bytes as the size limit counted them (a chunked body too; a WebSocket: 0)."""
    return int(getattr(conn.state, "body_bytes", 0))


async def charge_answer(conn: HTTPConnection, size: int) -> None:
    """Charge an answer of ``size`` bytes (beyond its first :data:`COST_UNIT_BYTES`, which the
    request paid) to the bucket the request paid from; nothing for an unlimited caller."""
    paid: _Paid | None = getattr(conn.state, "rate_bucket", None)
    extra = size // COST_UNIT_BYTES
    if paid is not None and extra > 0:
        await _buckets(conn.app.state).charge(paid.team_id, paid.kind, paid.bucket, extra)
