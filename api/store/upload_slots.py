"""Each team's uploads in flight (``POST /v1/files``), bounded by ``GRPO_MAX_UPLOADS_PER_TEAM``
across every API process: an upload spools its whole file to the API host's disk before it is
checked, so without a bound one team's parallel uploads could fill the disk every team's uploads
need. A slot is taken before the body is read and given back once the upload is done with.

The slots are a Redis sorted set per team (:meth:`api.redis_keys.RedisKeys.upload_slots`): one
random token per upload, scored by when it was last renewed on the Redis server's clock. The
process holding a slot renews it every quarter of :data:`SLOT_SECONDS` while its upload runs, however
long that takes; a slot whose process died without giving it back (a crash, a kill) stops being
renewed and is dropped once older than :data:`SLOT_SECONDS`, on the next take, so a lost slot costs
its team two minutes at most (a fixed lifetime would have had to outlast the slowest upload: hours).

A Redis outage must not turn into refusals or 5xx, as for the rate limits
(:mod:`api.store.rate_buckets`): the process then counts its own uploads per team for
:data:`~api.store.rate_buckets.LOCAL_SECONDS` (each process then allows the whole limit). A slot
is given back where it was taken; one whose return Redis missed expires as a lost one does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from api.domain.errors import RateLimited
from api.redis_keys import RedisKeys
from api.store.rate_buckets import LOCAL_SECONDS, REDIS_TIMEOUT_SECONDS

log = logging.getLogger(__name__)

# How long a slot outlives its last renewal: only a slot its process lost waits this long to be
# dropped. Renewed every quarter of it, so a renewal late by a busy event loop or a slow Redis
# round trip does not lose a live upload its slot.
SLOT_SECONDS = 120.0
RETRY_AFTER_SECONDS = 5

# Drop the stale slots, then take one if fewer than the limit (ARGV[1]) are held; 1: taken.
_TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local lifetime = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - lifetime)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('EXPIRE', KEYS[1], lifetime)
return 1
"""

# Re-score a slot still held; one dropped meanwhile is not taken again behind the limit's back.
_RENEW = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local clock = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(clock[1]) + tonumber(clock[2]) / 1000000, ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""


class UploadSlots:
    """One per API process (on ``app.state``); used from the event loop only."""

    kind = "upload slots"  # in its log lines

    def __init__(self, redis: aioredis.Redis, keys: RedisKeys,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._redis = redis
        self._take_script = redis.register_script(_TAKE)
        self._renew_script = redis.register_script(_RENEW)
        self._keys = keys
        self._clock = clock
        self._local: dict[int, set[str]] = {}  # team id -> tokens taken in this process while Redis is out
        self._redis_from = 0.0

    def _key(self, team_id: int) -> str:
        """The team's sorted set of slots (another kind of slot names its own: ``api.store.trial_slots``)."""
        return self._keys.upload_slots(team_id)

    def _refusal(self, limit: int) -> RateLimited:
        return _all_taken(limit)

    @asynccontextmanager
    async def held(self, team_id: int, limit: int) -> AsyncIterator[None]:
        """Hold one of the team's ``limit`` slots while the block runs; RateLimited (429) when
        all are taken."""
        token = secrets.token_hex(8)
        asked_redis = self._clock() >= self._redis_from
        in_redis = await self._take(team_id, limit, token)
        renewing = asyncio.create_task(self._renew(team_id, token)) if in_redis else None
        try:
            yield
        finally:
            if renewing is not None:
                renewing.cancel()
                await self._give_back(team_id, token)
            else:
                self._local[team_id].discard(token)
                if asked_redis:  # a take that timed out here may have run there: its token would
                    await self._give_back(team_id, token)  # hold a slot, unrenewed, for SLOT_SECONDS

    async def _take(self, team_id: int, limit: int, token: str) -> bool:
        """Take a slot under ``token``; True when Redis holds it, False when this process does."""
        if self._clock() >= self._redis_from:
            try:
                async with asyncio.timeout(REDIS_TIMEOUT_SECONDS):
                    args = [limit, token, math.ceil(SLOT_SECONDS)]
                    taken = await self._take_script(keys=[self._key(team_id)], args=args)
                if not taken:
                    raise self._refusal(limit)
                return True
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("%s: Redis did not answer (%s); counting in this process for %g s",
                            self.kind, exc.__class__.__name__, LOCAL_SECONDS)
                self._redis_from = self._clock() + LOCAL_SECONDS
        held = self._local.setdefault(team_id, set())
        if len(held) >= limit:
            raise self._refusal(limit)
        held.add(token)
        return False

    async def _renew(self, team_id: int, token: str) -> None:
        """Keep ``token``'s slot young until cancelled; a failed renewal is retried at the next
        turn (the slot expires only after several in a row)."""
        key = self._key(team_id)
        while True:
            await asyncio.sleep(SLOT_SECONDS / 4)
            try:
                async with asyncio.timeout(REDIS_TIMEOUT_SECONDS):
                    await self._renew_script(keys=[key], args=[token, math.ceil(SLOT_SECONDS)])
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("%s: Redis did not renew a slot (%s); retrying in %g s",
                            self.kind, exc.__class__.__name__, SLOT_SECONDS / 4)

    async def _give_back(self, team_id: int, token: str) -> None:
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_SECONDS):
                await self._redis.zrem(self._key(team_id), token)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("%s: Redis did not take back a slot (%s); it expires within %g s",
                        self.kind, exc.__class__.__name__, SLOT_SECONDS)


def _all_taken(limit: int) -> RateLimited:
    return RateLimited(f"your team already has {limit} uploads in progress, the most it may have at once "
                       f"(GRPO_MAX_UPLOADS_PER_TEAM); retry once one has finished",
                       retry_after=RETRY_AFTER_SECONDS, param="file")
