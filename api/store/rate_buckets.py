"""The teams' token buckets (:mod:`api.limits.rate_limits`) in Redis, so every API process of a
deployment draws on the same ones: behind a load balancer a per-process bucket would allow a
team the limit once per process, more as replicas are added. One script call per request takes
the token atomically, timed by the Redis server's clock, never a process's.

A Redis outage must not turn into refusals or 5xx: when Redis fails or takes longer than
:data:`REDIS_TIMEOUT_SECONDS`, the process counts on buckets of its own (each process then allows
the whole limit) for :data:`LOCAL_SECONDS` before it tries Redis again, so a frozen Redis costs
one slow request now and then rather than every request its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from api.limits.rate_limits import Bucket, charge_tokens, take_tokens
from api.redis_keys import RedisKeys

log = logging.getLogger(__name__)

REDIS_TIMEOUT_SECONDS = 0.25
LOCAL_SECONDS = 5.0

# take_tokens and charge_tokens in Lua (keep them alike): refill by the time since the last
# request, then take the cost or say how long until the bucket holds it (ARGV[4] "take"), or
# charge it, into debt if need be ("charge"). Floats travel as strings (Lua numbers
# would be cut to integers); the key expires once the bucket would be full again anyway (a debt
# lasts that much longer, so it is never forgiven by the expiry).
_SPEND = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(state[1]), tonumber(state[2])
if tokens == nil or at == nil then tokens, at = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if ARGV[4] == 'charge' then
  tokens = tokens - cost
elseif tokens >= cost then
  tokens = tokens - cost
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return tostring(wait)
"""


class TeamBuckets:
    """One per API process (on ``app.state``); used from the event loop only."""

    def __init__(self, redis: aioredis.Redis, keys: RedisKeys,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._spend_script = redis.register_script(_SPEND)
        self._keys = keys
        self._clock = clock
        self._local: dict[str, tuple[float | None, float]] = {}  # key -> (tokens, when)
        self._redis_from = 0.0

    async def take(self, team_id: int, kind: str, bucket: Bucket, cost: int = 1) -> float:
        """Seconds to wait before the team's request of ``kind`` and ``cost`` may go (0: now; it took
        the tokens)."""
        return await self._spend(team_id, kind, bucket, cost, "take")

    async def charge(self, team_id: int, kind: str, bucket: Bucket, cost: int) -> None:
        """Charge work already done (an answer's size), into debt if need be."""
        await self._spend(team_id, kind, bucket, cost, "charge")

    async def _spend(self, team_id: int, kind: str, bucket: Bucket, cost: int, mode: str) -> float:
        key = self._keys.rate_bucket(team_id, kind)
        if self._clock() >= self._redis_from:
            try:
                async with asyncio.timeout(REDIS_TIMEOUT_SECONDS):
                    args = [bucket.rate, bucket.burst, cost, mode]
                    return float(await self._spend_script(keys=[key], args=args))
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("rate limits: Redis did not answer (%s); counting in this process for %g s",
                            exc.__class__.__name__, LOCAL_SECONDS)
                self._redis_from = self._clock() + LOCAL_SECONDS
        return self._spend_locally(key, bucket, cost, mode)

    def _spend_locally(self, key: str, bucket: Bucket, cost: int, mode: str) -> float:
        now = self._clock()
        tokens, when = self._local.get(key, (None, now))
        if mode == "charge":
            left, wait = charge_tokens(tokens, now - when, bucket, cost), 0.0
        else:
            left, wait = take_tokens(tokens, now - when, bucket, cost)
        self._local[key] = (left, now)
        return wait
