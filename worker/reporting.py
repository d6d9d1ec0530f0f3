"""The trainer's callbacks in the service: every record goes to SQL first (the system of record,
idempotent per step), then to the job's Redis Stream for live readers.

Publishing after the commit (:mod:`api.store.outbox`) means a reader that sees a stream entry
can always find it in SQL; a failed publish only delays live readers until their next SQL
re-check (they read history from SQL).

Each hook's transaction is retried through a dropped connection (:mod:`worker.retrying`): every
one is idempotent (a step's record per job, attempt and step; an event per its timestamp), so a
retry whose first try committed changes nothing. A database away for longer than the budget
raises :class:`worker.retrying.DatabaseUnavailable`, which ends the attempt, not the job.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from api.store import outbox
from api.store.attempts import set_progress, stop_request
from api.store.db import session_scope
from api.store.job_health import record_alert, record_best
from api.store.tables import utcnow
from api.store.telemetry import (
    add_event_once,
    count_unscored_rows,
    forget_checkpoints,
    has_event,
    record_checkpoint,
    record_metrics,
    record_samples,
)
from grpo_core.json_values import json_safe
from grpo_core.run.callbacks import ALERT_EVENT, BEST_CHECKPOINT_EVENT, WARNING_EVENTS, TrainerCallback
from grpo_core.spec.size_checks import PROMPTS_OVER_ROWS
from worker.fencing import AttemptFence
from worker.retrying import retry_transient

T = TypeVar("T")
# Warnings a job is told once, whichever attempt (or the submit) found them first.
ONCE_PER_JOB = frozenset({PROMPTS_OVER_ROWS})


class JobReporter(TrainerCallback):
    """Each hook is one transaction, retried through transient errors for ``retry_seconds``; the
    store functions stage what the job's stream carries (metrics, samples, events) and
    ``publish`` (:func:`api.store.bus.publisher`; None: nobody listens) sends it once the
    transaction has committed. ``attempt``: the job's attempt this process trains (its step
    records replace those of earlier attempts). ``fence``: every write is refused
    (:class:`worker.fencing.StaleAttempt`) once a newer attempt owns the job, checked in its own
    transaction (None: unfenced, for tools that write as no attempt)."""

    def __init__(self, database_url: str, job_id: int, publish: outbox.Publish | None,
                 attempt: int | None = None, retry_seconds: float = 0.0,
                 fence: AttemptFence | None = None) -> None:
        self.database_url = database_url
        self.job_id = job_id
        self.publish = publish
        self.attempt = attempt
        self.retry_seconds = retry_seconds
        self.fence = fence

    def _write(self, what: str, body: Callable[[Session], T], fenced: bool = True) -> T:
        """``body`` in a transaction of its own, the whole transaction retried."""
        def once() -> T:
            with session_scope(self.database_url, publish=self.publish) as session:
                if fenced and self.fence is not None:
                    self.fence.guard(session, what)
                return body(session)

        return retry_transient(once, self.retry_seconds, f"job {self.job_id}: {what}")

    def on_step(self, record: dict[str, Any]) -> None:
        record = json_safe(record)
        step = int(record["step"])

        def write(session: Session) -> None:
            record_metrics(session, self.job_id, record, self.attempt)
            set_progress(session, self.job_id, step)

        self._write(f"step {step}'s metrics", write)

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        rows = json_safe(rows)
        self._write(f"step {step}'s samples",
                    lambda session: record_samples(session, self.job_id, step, rows))

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        data, ts = json_safe(data), utcnow()  # the event's identity across retries
        level = "warning" if type in WARNING_EVENTS else "info"

        def write(session: Session) -> None:
            if type in ONCE_PER_JOB and has_event(session, self.job_id, type):
                return  # told already: at submit (an uploaded dataset's rows), or by an earlier attempt
            added = add_event_once(session, self.job_id, type, message, data, ts, level)
            if not added:
                return
            if type == "reward_unscored":  # the job's sum, counted once with its event
                count_unscored_rows(session, self.job_id, int(data.get("rows", 0)))
            elif type == ALERT_EVENT:  # the badge and the job.alert webhook, with the event
                record_alert(session, self.job_id, data)
            elif type == BEST_CHECKPOINT_EVENT:
                record_best(session, self.job_id, data)

        self._write(f"event {type}", write)

    def on_checkpoint(self, step: int, path: Path) -> None:
        def write(session: Session) -> None:
            record_checkpoint(session, self.job_id, step, str(path), self.attempt)
            set_progress(session, self.job_id, step, checkpoint=str(path))

        self._write(f"step {step}'s checkpoint", write)

    def on_checkpoints_removed(self, steps: list[int]) -> None:
        self._write("checkpoints removed", lambda session: forget_checkpoints(session, self.job_id, steps))

    def stop_request(self) -> str | None:
        """What the job has been asked to do (:func:`api.store.attempts.stop_request`)."""
        return self._write("stop request", lambda session: stop_request(session, self.job_id), fenced=False)
