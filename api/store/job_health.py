"""What a job's health watch and best-checkpoint tracking leave on its row (issue 37): the rules
that tripped (``jobs.alerts``, the badge on the job and the jobs list) and its best eval point
(``jobs.best``). Written by the job's reporting process, in the transaction of the event that tells
it; an alert also enqueues its ``job.alert`` webhook deliveries there (the outbox)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.store.tables import Job
from api.store.webhooks import enqueue_alert_event

# What the badge keeps of an alert: the event holds the rest.
_BADGE_FIELDS = ("rule", "action", "step", "value")


def record_alert(session: Session, job_id: int, alert: dict[str, Any]) -> None:
    """The job's latest trip of ``alert["rule"]`` (one entry per rule, in the order they first
    tripped) and the team's ``job.alert`` deliveries."""
    current = session.execute(select(Job.alerts).where(Job.id == job_id)).scalar_one_or_none() or []
    entry = {name: alert.get(name) for name in _BADGE_FIELDS}
    alerts = [entry if old.get("rule") == entry["rule"] else old for old in current]
    if all(old.get("rule") != entry["rule"] for old in current):
        alerts.append(entry)
    session.execute(update(Job).where(Job.id == job_id).values(alerts=alerts)
                    .execution_options(synchronize_session=False))
    enqueue_alert_event(session, job_id, alert)


def record_best(session: Session, job_id: int, best: dict[str, Any]) -> None:
    """The job's best eval point so far, ``{"step", "metric", "value"}``."""
    session.execute(update(Job).where(Job.id == job_id)
                    .values(best={"step": best["step"], "metric": best["metric"], "value": best["value"]})
                    .execution_options(synchronize_session=False))
