"""Per-team webhooks: the registry behind ``/v1/webhooks`` and the outbox a job's final
transition fills (:func:`enqueue_job_event`, called by :func:`api.store.jobs.transition` in the
transaction that moves the job, so a committed ending always has its deliveries and a rolled-back
one has none), as does an eval point's metric row (:func:`enqueue_eval_event`, called by
:func:`api.store.telemetry.record_metrics` in the transaction that writes the row) and a health
alert (:func:`enqueue_alert_event`, :func:`api.store.job_health.record_alert`). Sending
them is :mod:`api.store.webhook_deliveries` and the scheduler process's sender. Every read is
scoped like jobs: ``team_id=None`` is an admin's view of every team; another team's webhook is
not found."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from api.domain.errors import Conflict, NotFound
from api.domain.lifecycle import Action
from api.schemas.jobs import JobRead
from api.schemas.webhooks import DeliveryRead, WebhookCreated, WebhookRead
from api.security.secret_box import SecretBox, SecretKeyError
from api.security.webhook_signing import new_secret
from api.store.clock import db_now
from api.store.metric_series import final_records
from api.store.tables import Job, Team, Webhook, WebhookDelivery, utcnow


def _read(row: Webhook) -> WebhookRead:
    return WebhookRead(id=row.id, team_id=row.team_id, url=row.url, events=row.events,
                       created_at=row.created_at)


def create_webhook(session: Session, team_id: int, url: str, events: list[str], box: SecretBox,
                   max_per_team: int) -> WebhookCreated:
    """Register it with a new secret, returned this once and stored sealed by ``box``; a team
    already at ``max_per_team`` webhooks is a :class:`Conflict`. The team's row is written first
    (an UPDATE that changes nothing), so registrations racing each other are counted one after the
    other: Postgres locks the row, SQLite takes its one write lock before the count is read."""
    session.execute(update(Team).where(Team.id == team_id).values(weight=Team.weight))
    count = session.scalar(select(func.count()).select_from(Webhook).where(Webhook.team_id == team_id))
    if count >= max_per_team:
        raise Conflict(f"the team has {count} webhooks, its limit (GRPO_WEBHOOK_MAX_PER_TEAM: "
                       f"{max_per_team}); delete one first", param="url")
    secret = new_secret()
    row = Webhook(team_id=team_id, url=url, events=events, secret=box.seal(secret), created_at=utcnow())
    session.add(row)
    session.flush()
    return WebhookCreated(**_read(row).model_dump(), secret=secret)


def secrets_readable(session: Session, box: SecretBox | None, *, reseal: bool) -> int:
    """Check that every stored webhook secret can be read (:class:`SecretKeyError` if not: no key
    while webhooks exist, or no key that decrypts them); with ``reseal``, also store each under
    the first key (plain ones from before encryption sealed, an older key's rotated). How many."""
    rows = session.scalars(select(Webhook).order_by(Webhook.id)).all()
    if rows and box is None:
        raise SecretKeyError(f"{len(rows)} webhooks are stored and their deliveries are signed: set "
                             "GRPO_SECRET_KEY (docs/operators.md, Webhooks)")
    for row in rows:
        if reseal:
            row.secret = box.reseal(row.secret)
        else:
            box.open(row.secret)
    return len(rows)


def _owned(session: Session, webhook_id: int, team_id: int | None) -> Webhook:
    row = session.get(Webhook, webhook_id)
    if row is None or (team_id is not None and row.team_id != team_id):
        raise NotFound(f"webhook {webhook_id} not found", param="webhook_id")
    return row


def get_webhook(session: Session, webhook_id: int, team_id: int | None) -> WebhookRead:
    return _read(_owned(session, webhook_id, team_id))


def list_webhooks(session: Session, team_id: int | None, after: int = 0,
                  limit: int = 50) -> list[WebhookRead]:
    """Oldest first; ``after``: the last id seen. Only ids are compared, never looked up, so an
    id of another team's webhook pages exactly as an unknown one would."""
    query = select(Webhook).where(Webhook.id > after).order_by(Webhook.id).limit(limit)
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
    """The webhook's deliveries, newest first; ``after``: the last id seen (0: from the newest),
    compared, never looked up (another webhook's delivery id pages as an unknown one)."""
    _owned(session, webhook_id, team_id)
    query = (select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
             .order_by(WebhookDelivery.id.desc()).limit(limit))
    if after:
        query = query.where(WebhookDelivery.id < after)
    return [DeliveryRead(id=row.id, webhook_id=row.webhook_id, job_id=row.job_id, event=row.event,
                         status=row.status, attempts=row.attempts,
                         next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
                         last_status_code=row.last_status_code, last_error=row.last_error,
                         last_duration_ms=row.last_duration_ms,
                         created_at=row.created_at, delivered_at=row.delivered_at)
            for row in session.scalars(query)]


def job_event_payload(event: str, job: JobRead, occurred_at: str, metrics: dict[str, Any] | None = None,
                      eval_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a job event's delivery POSTs: the event's name, when it happened, the job as a
    summary (no spec, no traceback: a receiver that wants more reads the job with a key), how it
    ended (its last step's record and its last eval point's metrics, ``{"step", "values"}``, or
    null) and where its final model downloads from (null unless it succeeded)."""
    error = None if job.error is None else {"code": job.error.code, "message": job.error.message}
    # `kind` tells a serving job's end (its model unloaded once idle) from a training job's.
    summary = {"id": job.id, "name": job.name, "kind": job.kind, "team_id": job.team_id, "status": job.status,
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


EVAL_EVENT, ALERT_EVENT = "job.eval", "job.alert"


def enqueue_eval_event(session: Session, job_id: int, step: int, metrics: dict[str, Any]) -> int:
    """A ``job.eval`` delivery per webhook of the job's team that wants it: the eval point's step
    and ``metrics``. In the caller's transaction, the one that writes the step's metric row."""
    return _enqueue_running_job_event(session, job_id, EVAL_EVENT, {"step": step, "metrics": metrics})


def enqueue_alert_event(session: Session, job_id: int, alert: dict[str, Any]) -> int:
    """A ``job.alert`` delivery per webhook of the job's team that wants it: the health rule that
    tripped (``{rule, action, step, value, threshold, window, message}``). In the caller's
    transaction, the one that records the alert event."""
    return _enqueue_running_job_event(session, job_id, ALERT_EVENT, {"alert": alert})


BUDGET_EVENT = "job.budget"


def enqueue_budget_event(session: Session, job_id: int, budget: dict[str, Any]) -> int:
    """A ``job.budget`` delivery per webhook of the job's team that wants it: the job was paused
    by a GPU-hour budget (``{budget: "job"|"team", used_gpu_hours, limit_gpu_hours}``, a team's
    with its ``team``, ``period`` and ``period_end``). In the caller's transaction, the one that
    pauses the job (:mod:`api.store.budgets`)."""
    return _enqueue_running_job_event(session, job_id, BUDGET_EVENT, {"budget": budget})


def _enqueue_running_job_event(session: Session, job_id: int, event: str, data: dict[str, Any]) -> int:
    """``event`` about a job while it trains: the job as ``{id, name, team_id}`` beside ``data``."""
    job = session.execute(select(Job.team_id, Job.name).where(Job.id == job_id)).one()

    def payload(occurred_at: str) -> dict[str, Any]:
        summary = {"id": job_id, "name": job.name, "team_id": job.team_id}
        return {"type": event, "created_at": occurred_at, "data": {"job": summary, **data}}

    return _enqueue(session, job.team_id, job_id, event, payload)


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
