"""Per-team webhooks: the registry behind ``/v1/webhooks`` and the outbox a job's final
transition fills (:func:`enqueue_job_event`, called by :func:`api.store.jobs.transition` in the
transaction that moves the job, so a committed ending always has its deliveries and a rolled-back
one has none), as does an eval point's metric row (:func:`enqueue_eval_event`, called by
:func:`api.store.telemetry.record_metrics` in the transaction that writes the row). Sending
them is :mod:`api.store.webhook_deliveries` and the scheduler process's sender. Every read is
scoped like jobs: ``team_id=None`` is an admin's view of every team; another team's webhook is
not found."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from api.domain_errors import NotFound
from api.lifecycle import Action
from api.schemas.jobs import JobRead
from api.schemas.webhooks import DeliveryRead, WebhookCreated, WebhookRead
from api.store.clock import db_now
from api.store.metric_series import final_records
from api.store.tables import Job, Webhook, WebhookDelivery, utcnow
from api.webhook_signing import new_secret


def _read(row: Webhook) -> WebhookRead:
    return WebhookRead(id=row.id, team_id=row.team_id, url=row.url, events=row.events,
                       created_at=row.created_at)


def create_webhook(session: Session, team_id: int, url: str, events: list[str]) -> WebhookCreated:
    """Register it with a new secret, returned this once."""
    row = Webhook(team_id=team_id, url=url, events=events, secret=new_secret(), created_at=utcnow())
    session.add(row)
    session.flush()
    return WebhookCreated(**_read(row).model_dump(), secret=row.secret)


def _owned(session: Session, webhook_id: int, team_id: int | None) -> Webhook:
    row = session.get(Webhook, webhook_id)
    if row is None or (team_id is not None and row.team_id != team_id):
        raise NotFound(f"webhook {webhook_id} not found", param="webhook_id")
    return row


def get_webhook(session: Session, webhook_id: int, team_id: int | None) -> WebhookRead:
    return _read(_owned(session, webhook_id, team_id))


def list_webhooks(session: Session, team_id: int | None) -> list[WebhookRead]:
    query = select(Webhook).order_by(Webhook.id)
    if team_id is not None:
        query = query.where(Webhook.team_id == team_id)
    return [_read(row) for row in session.scalars(query)]


def delete_webhook(session: Session, webhook_id: int, team_id: int | None) -> WebhookRead:
    """Remove it and its deliveries (pending ones are not sent); say what it was."""
    removed = get_webhook(session, webhook_id, team_id)
    session.execute(delete(Webhook).where(Webhook.id == webhook_id))
    return removed


def list_deliveries(session: Session, webhook_id: int, team_id: int | None, after: int = 0,
                    limit: int = 50) -> list[DeliveryRead]:
    """The webhook's deliveries, newest first; ``after``: the last id seen (0: from the newest)."""
    _owned(session, webhook_id, team_id)
    query = (select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
             .order_by(WebhookDelivery.id.desc()).limit(limit))
    if after:
        query = query.where(WebhookDelivery.id < after)
    return [DeliveryRead(id=row.id, webhook_id=row.webhook_id, job_id=row.job_id, event=row.event,
                         status=row.status, attempts=row.attempts,
                         next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
                         last_status_code=row.last_status_code, last_error=row.last_error,
                         created_at=row.created_at, delivered_at=row.delivered_at)
            for row in session.scalars(query)]


def job_event_payload(event: str, job: JobRead, occurred_at: str, metrics: dict[str, Any] | None = None,
                      eval_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a job event's delivery POSTs: the event's name, when it happened, the job as a
    summary (no spec, no traceback: a receiver that wants more reads the job with a key), how it
    ended (its last step's record and its last eval point's metrics, ``{"step", "values"}``, or
    null) and where its final model downloads from (null unless it succeeded)."""
    error = None if job.error is None else {"code": job.error.code, "message": job.error.message}
    summary = {"id": job.id, "name": job.name, "team_id": job.team_id, "status": job.status,
               "tags": job.tags, "last_step": job.last_step, "error": error,
               "created_at": job.created_at.isoformat(),
               "finished_at": job.finished_at.isoformat() if job.finished_at else None}
    model = f"/v1/jobs/{job.id}/model" if Action.DOWNLOAD_MODEL in job.actions else None
    return {"type": event, "created_at": occurred_at, "data": {
        "job": summary, "metrics": metrics, "eval_metrics": eval_metrics, "model_download_path": model}}


def enqueue_job_event(session: Session, job: JobRead, event: str) -> int:
    """One pending delivery of ``event`` per webhook of the job's team that wants it, due now;
    how many. In the caller's transaction: this is the outbox."""
    return _enqueue(session, job.team_id, job.id, event,
                    lambda occurred_at: job_event_payload(event, job, occurred_at,
                                                          *final_records(session, job.id)))


EVAL_EVENT = "job.eval"


def enqueue_eval_event(session: Session, job_id: int, step: int, metrics: dict[str, Any]) -> int:
    """A ``job.eval`` delivery per webhook of the job's team that wants it: the eval point's step
    and ``metrics``. In the caller's transaction, the one that writes the step's metric row."""
    job = session.execute(select(Job.team_id, Job.name).where(Job.id == job_id)).one()

    def payload(occurred_at: str) -> dict[str, Any]:
        summary = {"id": job_id, "name": job.name, "team_id": job.team_id}
        return {"type": EVAL_EVENT, "created_at": occurred_at,
                "data": {"job": summary, "step": step, "metrics": metrics}}

    return _enqueue(session, job.team_id, job_id, EVAL_EVENT, payload)


def _enqueue(session: Session, team_id: int, job_id: int, event: str,
             payload: Callable[[str], dict[str, Any]]) -> int:
    """The pending deliveries of ``event``, due now, with ``payload(now)``; how many."""
    hooks = session.execute(select(Webhook.id, Webhook.events).where(Webhook.team_id == team_id)).all()
    wanted = [hook_id for hook_id, events in hooks if event in events]
    if not wanted:
        return 0
    now = db_now(session)
    body = payload(now.isoformat())
    session.add_all(WebhookDelivery(webhook_id=hook_id, job_id=job_id, event=event, payload=body,
                                    status="pending", attempts=0, next_attempt_at=now, created_at=now)
                    for hook_id in wanted)
    return len(wanted)
