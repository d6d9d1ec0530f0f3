"""The live side of the service, in Redis: each job's stream of messages and worker heartbeats.
Every key is named by :class:`api.redis_keys.RedisKeys` (the deployment's namespace).

Job stream (``keys.job_stream``): entries ``{"type": metrics|event|samples|status, "data": <json>}``,
capped with ``MAXLEN ~``. Readers never rely on it for history (SQL has that); it only carries
what happens after a reader connects.

Worker capacity: ``keys.worker(worker_id)`` holds a JSON heartbeat with a TTL, so a worker that
dies simply disappears from the capacity view when its key expires.

Counters ``keys.stat(name)`` (``COUNTERS``) count scheduler actions since Redis started; the
API's ``/metrics`` reports them as Prometheus counters (a reset reads as a counter reset).

The queue as the scheduler last ordered it: ``keys.queue`` (JSON: ``updated_at`` and the waiting
jobs in dispatch order per pool) and ``keys.queue_positions`` (hash: job id -> position), both
replaced in one transaction whenever the order changes; ``keys.scheduler_pass`` holds the time
of the leader's latest pass, so a reader can tell a quiet queue from a stopped scheduler
(``api.scheduling.liveness``).

Clients come from :func:`connect` / :func:`connect_async`, whose timeouts are shorter than a
lease: a frozen Redis must fail a call, not hang the thread that renews the lease.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from api.redis_keys import RedisKeys
from api.settings import Settings
from api.store import outbox
from api.vocabulary import Heartbeat

log = logging.getLogger(__name__)

MESSAGE_TYPES = ("metrics", "event", "samples", "status")
# Service-wide (Prometheus counters read them).
COUNTERS = ("dispatches", "preemptions", "unclaimed_dispatches")
MAX_SOCKET_TIMEOUT_S = 10.0  # a healthy Redis answers in milliseconds; longer lease or not


@dataclass(frozen=True)
class ClientTimeouts:
    socket: float  # any call: a frozen Redis raises TimeoutError after this
    connect: float
    health_check: float  # a connection idle this long is PINGed before use (a dead peer is found)


def client_timeouts(settings: Settings, blocking_read_seconds: float = 0.0) -> ClientTimeouts:
    """A third of the lease (at most :data:`MAX_SOCKET_TIMEOUT_S`): the lease thread writes to
    Redis between renewals, so a call that hangs longer could let the lease expire under a
    healthy job. ``blocking_read_seconds``: a client that blocks on XREAD this long waits longer,
    or a quiet stream would read as a dead socket."""
    socket_s = min(settings.lease_seconds / 3, MAX_SOCKET_TIMEOUT_S)
    if blocking_read_seconds:
        socket_s = max(socket_s, blocking_read_seconds + 1.0)
    return ClientTimeouts(socket=socket_s, connect=min(socket_s, 2.0), health_check=socket_s)


def connect(settings: Settings) -> redis.Redis:
    """The Redis client of the worker, the scheduler and the API's publisher."""
    timeouts = client_timeouts(settings)
    return redis.Redis.from_url(settings.redis_url, socket_timeout=timeouts.socket,
                                socket_connect_timeout=timeouts.connect,
                                health_check_interval=timeouts.health_check)


def connect_async(settings: Settings) -> aioredis.Redis:
    """The web process's client; it also tails job streams (XREAD BLOCK)."""
    timeouts = client_timeouts(settings, blocking_read_seconds=settings.stream_block_seconds)
    return aioredis.Redis.from_url(settings.redis_url, socket_timeout=timeouts.socket,
                                   socket_connect_timeout=timeouts.connect,
                                   health_check_interval=timeouts.health_check)


def encode(kind: str, data: dict[str, Any]) -> dict[str, str]:
    if kind not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type '{kind}'; valid: {', '.join(MESSAGE_TYPES)}")
    return {"type": kind, "data": json.dumps(data, separators=(",", ":"))}


def decode(fields: dict) -> dict[str, Any]:
    """A stream entry's fields (bytes or str) → ``{"type": ..., **data}`` as sent to clients."""

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else value

    kind = text(fields.get(b"type", fields.get("type")))
    data = json.loads(text(fields.get(b"data", fields.get("data"))))
    return {"type": kind, "data": data}


def publish(client, keys: RedisKeys, job_id: int, kind: str, data: dict[str, Any], maxlen: int) -> str:
    """XADD one message (sync client: the worker)."""
    return client.xadd(keys.job_stream(job_id), encode(kind, data), maxlen=maxlen, approximate=True)


def publisher(client, keys: RedisKeys, maxlen: int) -> outbox.Publish:
    """What :func:`api.store.db.session_scope` calls after a commit: XADD every staged message
    (one round trip). Best effort: a failed publish only delays live readers until their next
    SQL re-check, and must never undo or fail the write it announces."""

    def publish_staged(messages: list[outbox.Message]) -> None:
        try:
            pipe = client.pipeline(transaction=False)
            for message in messages:
                pipe.xadd(keys.job_stream(message.job_id), encode(message.kind, message.data), maxlen=maxlen,
                          approximate=True)
            pipe.execute()
        except RedisError as exc:
            log.warning("could not publish %d message(s) for live readers: %s", len(messages), exc)

    return publish_staged


def advertise_worker(client, keys: RedisKeys, beat: Heartbeat, ttl_seconds: float) -> None:
    client.set(keys.worker(beat.worker_id), beat.to_json(), px=int(ttl_seconds * 1000))


def live_workers(client, keys: RedisKeys) -> list[Heartbeat]:
    """Heartbeats of every worker of the namespace whose key has not expired."""
    found = list(client.scan_iter(match=keys.workers_pattern, count=500))
    return _heartbeats(client.mget(found) if found else [])


async def live_workers_async(client, keys: RedisKeys) -> list[Heartbeat]:
    """:func:`live_workers` with an asyncio client (the web process)."""
    found = [key async for key in client.scan_iter(match=keys.workers_pattern, count=500)]
    return _heartbeats(await client.mget(found) if found else [])


def _heartbeats(values: list[Any]) -> list[Heartbeat]:
    # A key that expired between SCAN and MGET reads None: that worker just left.
    beats = (Heartbeat.from_json(v) for v in values if v is not None)
    return [beat for beat in beats if beat is not None]


def publish_queue(client, keys: RedisKeys, entries: list[dict[str, Any]], updated_at: str) -> None:
    """Replace the queue snapshot (sync client: the scheduler)."""
    pipe = client.pipeline(transaction=True)
    pipe.set(keys.queue, json.dumps({"updated_at": updated_at, "entries": entries}, separators=(",", ":")))
    pipe.delete(keys.queue_positions)
    if entries:
        pipe.hset(keys.queue_positions, mapping={entry["job_id"]: entry["position"] for entry in entries})
    pipe.execute()


def mark_scheduler_pass(client, keys: RedisKeys, at: str) -> None:
    client.set(keys.scheduler_pass, at)


def count(client, keys: RedisKeys, name: str) -> None:
    if name not in COUNTERS:
        raise ValueError(f"unknown counter '{name}'; valid: {', '.join(COUNTERS)}")
    client.incr(keys.stat(name))


async def read_counters(client, keys: RedisKeys) -> dict[str, int]:
    values = await client.mget([keys.stat(name) for name in COUNTERS])
    return {name: int(value or 0) for name, value in zip(COUNTERS, values, strict=True)}
