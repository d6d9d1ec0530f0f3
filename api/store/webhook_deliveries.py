"""The sender's side of webhook deliveries: take the ones due, record how each attempt went.

Taking is one short transaction, never held across the HTTP request: the due rows are selected
``FOR UPDATE SKIP LOCKED`` (Postgres; SQLite, which has no row locks and serialises writers,
ignores it), then each is moved by an UPDATE guarded by what made it due, so two senders never
both take one. Taking counts the attempt and pushes ``next_attempt_at`` past the request's
``lease``: a sender that dies mid-request leaves the delivery due again after it (at least once).
An attempt's result is written only if nobody took the delivery again meanwhile.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.store.clock import Backoff, db_now
from api.store.tables import Webhook, WebhookDelivery

_D = WebhookDelivery.__table__
MAX_ERROR_CHARS = 1_000


@dataclass(frozen=True)
class DueDelivery:
    """What one attempt needs: where, the secret to sign with, and the exact body bytes."""

    id: int
    attempt: int
    url: str
    secret: str
    body: bytes


def take_due(session: Session, limit: int, lease_seconds: float) -> list[DueDelivery]:
    """Up to ``limit`` due deliveries, oldest due first, now this sender's for ``lease_seconds``."""
    now = db_now(session)
    due = (_D.c.status == "pending") & (_D.c.next_attempt_at <= now)
    ids = session.scalars(select(_D.c.id).where(due).order_by(_D.c.next_attempt_at).limit(limit)
                          .with_for_update(skip_locked=True)).all()
    taken = []
    for delivery_id in ids:
        row = session.execute(
            update(_D).where(_D.c.id == delivery_id, due)
            .values(attempts=_D.c.attempts + 1, next_attempt_at=now + timedelta(seconds=lease_seconds))
            .returning(_D.c.id, _D.c.attempts, _D.c.webhook_id, _D.c.payload)).first()
        if row is None:  # another sender took it between the two statements (SQLite)
            continue
        hook = session.get(Webhook, row.webhook_id)
        body = json.dumps(row.payload, separators=(",", ":"), sort_keys=True).encode()
        taken.append(DueDelivery(id=row.id, attempt=row.attempts, url=hook.url, secret=hook.secret,
                                 body=body))
    return taken


def record_attempt(session: Session, delivery: DueDelivery, *, status_code: int | None, error: str | None,
                   max_attempts: int, backoff: Backoff) -> str | None:
    """The attempt's outcome: a 2xx ``status_code`` is ``delivered``; anything else is tried again
    after ``backoff`` (with jitter, so receivers back up don't get every retry at once) until
    ``max_attempts``, then ``failed``. The status written; None when another sender took the
    delivery again meanwhile (its lease ran out), whose result is the one that counts."""
    now = db_now(session)
    changes: dict[str, object] = {"last_status_code": status_code,
                                  "last_error": error[:MAX_ERROR_CHARS] if error else None}
    if status_code is not None and 200 <= status_code < 300:
        outcome = "delivered"
        changes["delivered_at"] = now
    elif delivery.attempt >= max_attempts:
        outcome = "failed"
    else:
        outcome = "pending"
        wait = backoff.delay(delivery.attempt) * random.uniform(0.75, 1.25)  # noqa: S311 - not a secret
        changes["next_attempt_at"] = now + timedelta(seconds=wait)
    changes["status"] = outcome
    moved = session.execute(update(_D).where(_D.c.id == delivery.id, _D.c.status == "pending",
                                             _D.c.attempts == delivery.attempt).values(**changes))
    return outcome if moved.rowcount == 1 else None
