"""The live side of the service, in Redis: each job's stream of messages and worker heartbeats.

Stream ``grpo:job:{id}``: entries ``{"type": metrics|event|samples|status, "data": <json>}``,
capped with ``MAXLEN ~``. Readers never rely on it for history (SQL has that); it only carries
what happens after a reader connects.

Worker capacity: key ``grpo:worker:{worker_id}`` holds a JSON heartbeat with a TTL, so a worker
that dies simply disappears from the capacity view when its key expires.

Counters ``grpo:stats:{name}`` (``COUNTERS``) count scheduler actions since Redis started; the
API's ``/metrics`` reports them as Prometheus counters (a reset reads as a counter reset).

The queue as the scheduler last ordered it: ``grpo:queue`` (JSON: ``updated_at`` and the waiting
jobs in dispatch order per pool) and ``grpo:queue:positions`` (hash: job id -> position), both
replaced in one transaction whenever the order changes; ``grpo:scheduler:pass`` holds the time
of the leader's latest pass, so a reader can tell a quiet queue from a stopped scheduler.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from redis.exceptions import RedisError

from api.store import outbox
from api.vocabulary import Heartbeat

log = logging.getLogger(__name__)

MESSAGE_TYPES = ("metrics", "event", "samples", "status")
WORKER_PREFIX = "grpo:worker:"
QUEUE_KEY = "grpo:queue"
QUEUE_POSITIONS_KEY = "grpo:queue:positions"
SCHEDULER_PASS_KEY = "grpo:scheduler:pass"
STATS_PREFIX = "grpo:stats:"  # service-wide counters (Prometheus counters read them)
COUNTERS = ("dispatches", "preemptions")


def stream_key(job_id: int) -> str:
    return f"grpo:job:{job_id}"


def worker_key(worker_id: str) -> str:
    return f"{WORKER_PREFIX}{worker_id}"


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


def publish(client, job_id: int, kind: str, data: dict[str, Any], maxlen: int) -> str:
    """XADD one message (sync client: the worker)."""
    return client.xadd(stream_key(job_id), encode(kind, data), maxlen=maxlen, approximate=True)


def publisher(client, maxlen: int) -> outbox.Publish:
    """What :func:`api.store.db.session_scope` calls after a commit: XADD every staged message
    (one round trip). Best effort: a failed publish only delays live readers until their next
    SQL re-check, and must never undo or fail the write it announces."""

    def publish_staged(messages: list[outbox.Message]) -> None:
        try:
            pipe = client.pipeline(transaction=False)
            for message in messages:
                pipe.xadd(stream_key(message.job_id), encode(message.kind, message.data), maxlen=maxlen,
                          approximate=True)
            pipe.execute()
        except RedisError as exc:
            log.warning("could not publish %d message(s) for live readers: %s", len(messages), exc)

    return publish_staged


def advertise_worker(client, beat: Heartbeat, ttl_seconds: float) -> None:
    client.set(worker_key(beat.worker_id), beat.to_json(), px=int(ttl_seconds * 1000))


def live_workers(client) -> list[Heartbeat]:
    """Heartbeats of every worker whose key has not expired."""
    keys = list(client.scan_iter(match=f"{WORKER_PREFIX}*", count=500))
    return _heartbeats(client.mget(keys) if keys else [])


async def live_workers_async(client) -> list[Heartbeat]:
    """:func:`live_workers` with an asyncio client (the web process)."""
    keys = [key async for key in client.scan_iter(match=f"{WORKER_PREFIX}*", count=500)]
    return _heartbeats(await client.mget(keys) if keys else [])


def _heartbeats(values: list[Any]) -> list[Heartbeat]:
    # A key that expired between SCAN and MGET reads None: that worker just left.
    beats = (Heartbeat.from_json(v) for v in values if v is not None)
    return [beat for beat in beats if beat is not None]


def publish_queue(client, entries: list[dict[str, Any]], updated_at: str) -> None:
    """Replace the queue snapshot (sync client: the scheduler)."""
    pipe = client.pipeline(transaction=True)
    pipe.set(QUEUE_KEY, json.dumps({"updated_at": updated_at, "entries": entries}, separators=(",", ":")))
    pipe.delete(QUEUE_POSITIONS_KEY)
    if entries:
        pipe.hset(QUEUE_POSITIONS_KEY, mapping={entry["job_id"]: entry["position"] for entry in entries})
    pipe.execute()


def mark_scheduler_pass(client, at: str) -> None:
    client.set(SCHEDULER_PASS_KEY, at)


def count(client, name: str) -> None:
    if name not in COUNTERS:
        raise ValueError(f"unknown counter '{name}'; valid: {', '.join(COUNTERS)}")
    client.incr(f"{STATS_PREFIX}{name}")


async def read_counters(client) -> dict[str, int]:
    values = await client.mget([f"{STATS_PREFIX}{name}" for name in COUNTERS])
    return {name: int(value or 0) for name, value in zip(COUNTERS, values, strict=True)}
