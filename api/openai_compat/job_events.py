"""A job's events as OpenAI's ``fine_tuning.job.event``: each lifecycle event of the job (queued,
dispatched, running, checkpoint, warnings, failed...) is a ``message`` event, its text the
event's message (its type where it has none), its ``data`` the event's with the event's type in
this service under ``event``. Per-step metrics are not events here: ``GET /v1/jobs/{id}/metrics``
has them."""

from __future__ import annotations

from typing import Literal

from api.openai_compat.ids import event_ref
from api.openai_compat.job_object import unix
from api.schemas.fine_tuning import FineTuningJobEvent
from api.schemas.jobs import EventRead

LEVELS: dict[str, Literal["info", "warn", "error"]] = {"info": "info", "warning": "warn", "error": "error"}


def job_event(event: EventRead) -> FineTuningJobEvent:
    return FineTuningJobEvent(id=event_ref(event.id), created_at=unix(event.ts),
                              level=LEVELS.get(event.level, "info"), message=event.message or event.type,
                              type="message", data={**event.data, "event": event.type})
