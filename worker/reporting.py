"""The trainer's callbacks in the service: every record goes to SQL first (the system of record,
idempotent per step), then to the job's Redis Stream for live readers.

Publishing after the commit means a reader that sees a stream entry can always find it in SQL;
a failed publish only delays live readers until they reconnect (they read history from SQL).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from api.store import bus
from api.store.db import session_scope
from api.store.jobs import set_progress
from api.store.telemetry import add_event, record_checkpoint, record_metrics, record_samples
from grpo_core.callbacks import TrainerCallback
from worker.heartbeat import JobLease

log = logging.getLogger(__name__)


def json_safe(value: Any) -> Any:
    """NaN/inf become None: JSON has no such numbers and Postgres rejects them in JSON columns."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class Publisher:
    """Best-effort XADD to ``grpo:job:{id}``; the stream is capped (``MAXLEN ~``)."""

    def __init__(self, client, job_id: int, maxlen: int) -> None:
        self.client, self.job_id, self.maxlen = client, job_id, maxlen

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        try:
            bus.publish(self.client, self.job_id, kind, data, self.maxlen)
        except RedisError as exc:
            log.warning("job %s: could not publish %s: %s", self.job_id, kind, exc)


class JobReporter(TrainerCallback):
    def __init__(self, database_url: str, job_id: int, publish: Publisher, lease: JobLease) -> None:
        self.database_url = database_url
        self.job_id = job_id
        self.publish = publish
        self.lease = lease

    def on_step(self, record: dict[str, Any]) -> None:
        record = json_safe(record)
        with session_scope(self.database_url) as session:
            record_metrics(session, self.job_id, record)
            set_progress(session, self.job_id, int(record["step"]))
        self.publish("metrics", record)

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        rows = json_safe(rows)
        with session_scope(self.database_url) as session:
            record_samples(session, self.job_id, step, rows)
        self.publish("samples", {"step": step, "rows": rows})

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        with session_scope(self.database_url) as session:
            event = add_event(session, self.job_id, type, message, json_safe(data))
        self.publish("event", event.model_dump(mode="json"))

    def on_checkpoint(self, step: int, path: Path) -> None:
        with session_scope(self.database_url) as session:
            record_checkpoint(session, self.job_id, step, str(path))
            set_progress(session, self.job_id, step, checkpoint=str(path))

    def should_stop(self) -> bool:
        return self.lease.should_stop()
