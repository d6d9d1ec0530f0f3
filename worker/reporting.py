"""The trainer's callbacks in the service: every record goes to SQL first (the system of record,
idempotent per step), then to the job's Redis Stream for live readers.

Publishing after the commit (:mod:`api.store.outbox`) means a reader that sees a stream entry
can always find it in SQL; a failed publish only delays live readers until their next SQL
re-check (they read history from SQL).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from api.store import outbox
from api.store.db import session_scope
from api.store.jobs import set_progress, stop_request
from api.store.telemetry import (
    add_event,
    forget_checkpoints,
    record_checkpoint,
    record_metrics,
    record_samples,
)
from grpo_core.callbacks import WARNING_EVENTS, TrainerCallback, json_safe


class JobReporter(TrainerCallback):
    """Each hook is one transaction; the store functions stage what the job's stream carries
    (metrics, samples, events) and ``publish`` (:func:`api.store.bus.publisher`; None: nobody
    listens) sends it once the transaction has committed."""

    def __init__(self, database_url: str, job_id: int, publish: outbox.Publish | None) -> None:
        self.database_url = database_url
        self.job_id = job_id
        self.publish = publish

    def _session(self) -> AbstractContextManager[Session]:
        return session_scope(self.database_url, publish=self.publish)

    def on_step(self, record: dict[str, Any]) -> None:
        record = json_safe(record)
        with self._session() as session:
            record_metrics(session, self.job_id, record)
            set_progress(session, self.job_id, int(record["step"]))

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        with self._session() as session:
            record_samples(session, self.job_id, step, json_safe(rows))

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        with self._session() as session:
            add_event(session, self.job_id, type, message, json_safe(data),
                      level="warning" if type in WARNING_EVENTS else "info")

    def on_checkpoint(self, step: int, path: Path) -> None:
        with self._session() as session:
            record_checkpoint(session, self.job_id, step, str(path))
            set_progress(session, self.job_id, step, checkpoint=str(path))

    def on_checkpoints_removed(self, steps: list[int]) -> None:
        with self._session() as session:
            forget_checkpoints(session, self.job_id, steps)

    def stop_request(self) -> str | None:
        """What the job has been asked to do (:func:`api.store.jobs.stop_request`)."""
        with self._session() as session:
            return stop_request(session, self.job_id)
