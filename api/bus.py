"""The live side of the service, in Redis: each job's stream of messages and worker heartbeats.

Stream ``grpo:job:{id}``: entries ``{"type": metrics|event|samples|status, "data": <json>}``,
capped with ``MAXLEN ~``. Readers never rely on it for history (SQL has that); it only carries
what happens after a reader connects.

Worker capacity: key ``grpo:worker:{worker_id}`` holds a JSON heartbeat with a TTL, so a worker
that dies simply disappears from the capacity view when its key expires.
"""

from __future__ import annotations

import json
from typing import Any

MESSAGE_TYPES = ("metrics", "event", "samples", "status")
WORKER_PREFIX = "grpo:worker:"


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


def advertise_worker(client, worker_id: str, info: dict[str, Any], ttl_seconds: float) -> None:
    client.set(worker_key(worker_id), json.dumps(info), px=int(ttl_seconds * 1000))


def live_workers(client) -> list[dict[str, Any]]:
    """Heartbeats of every worker whose key has not expired."""
    keys = list(client.scan_iter(match=f"{WORKER_PREFIX}*", count=500))
    values = client.mget(keys) if keys else []
    return [json.loads(v) for v in values if v is not None]
