"""The sender's side of webhook deliveries: take the ones due, record how each attempt went.

Taking is one short transaction, never held across the HTTP request: the due rows are selected
``FOR UPDATE SKIP LOCKED`` (Postgres; SQLite, which has no row locks and serialises writers,
ignores it), then each is moved by an UPDATE guarded by what made it due, so two senders never
both take one. Taking counts the attempt and pushes ``next_attempt_at`` past the request's
``lease``: a sender that dies mid-request leaves the delivery due again after it (at least once).
An attempt's result is written only if nobody took the delivery again meanwhile. Which due
deliveries a sender takes is bounded by its in-flight caps (:class:`Slots`): per team and per
destination, so one team's backlog of slow receivers never fills every slot.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.store.clock import Backoff, db_now
from api.store.tables import Webhook, WebhookDelivery

_D = WebhookDelivery.__table__
# Candidates looked at per delivery wanted: those of a team or destination at its cap are passed over.
CANDIDATES_PER_SLOT = 4


@dataclass(frozen=True)
class DueDelivery:
    """What one attempt needs: whose, where, the secret to sign with (sealed, as stored:
    :mod:`api.security.secret_box`), and the exact body bytes."""

    id: int
    attempt: int
    team_id: int
    url: str
    sealed_secret: str
    body: bytes


class Slots(Protocol):
    """The sender's in-flight counts: ``take`` reserves a slot for a team's request to a URL, or
    says there is none; ``give_back`` returns one taken for nothing."""

    def take(self, team_id: int, url: str) -> bool: ...

    def give_back(self, team_id: int, url: str) -> None: ...


def take_due(session: Session, limit: int, lease_seconds: float, slots: Slots,
             full_teams: Collection[int] = ()) -> list[DueDelivery]:
    """Up to ``limit`` due deliveries, oldest due first, each with a slot from ``slots``, now this
    sender's for ``lease_seconds``. Teams in ``full_teams`` are not looked at, so a team with a
    long backlog at its cap never hides another team's deliveries from the candidates."""
    now = db_now(session)
    due = (_D.c.status == "pending") & (_D.c.next_attempt_at <= now)
    candidates = session.execute(
        select(_D.c.id, Webhook.team_id, Webhook.url).join(Webhook, Webhook.id == _D.c.webhook_id)
        .where(due, Webhook.team_id.notin_(list(full_teams))).order_by(_D.c.next_attempt_at)
        .limit(limit * CANDIDATES_PER_SLOT).with_for_update(skip_locked=True, of=_D)).all()
    taken = []
    for delivery_id, team_id, url in candidates:
        if len(taken) == limit:
            break
        if not slots.take(team_id, url):
            continue
        row = session.execute(
            update(_D).where(_D.c.id == delivery_id, due)
            .values(attempts=_D.c.attempts + 1, next_attempt_at=now + timedelta(seconds=lease_seconds))
            .returning(_D.c.id, _D.c.attempts, _D.c.webhook_id, _D.c.payload)).first()
        if row is None:  # another sender took it between the two statements (SQLite)
            slots.give_back(team_id, url)
            continue
        hook = session.get(Webhook, row.webhook_id)
        body = json.dumps(row.payload, separators=(",", ":"), sort_keys=True).encode()
        taken.append(DueDelivery(id=row.id, attempt=row.attempts, team_id=team_id, url=url,
                                 sealed_secret=hook.secret, body=body))
    return taken


def record_attempt(session: Session, delivery: DueDelivery, *, status_code: int | None,
                   error: str | None, duration_ms: int | None, max_attempts: int, backoff: Backoff,
                   final: bool = False) -> str | None:
    """The attempt's outcome: a 2xx ``status_code`` is ``delivered``; anything else is tried again
    after ``backoff`` (with jitter, so receivers back up don't get every retry at once) until
    ``max_attempts``, or at once when ``final`` (a destination refused), then ``failed``. ``error``
    is a class, never text from the attempt. The status written; None when another sender took
    the delivery again meanwhile (its lease ran out), whose result is the one that counts."""
    now = db_now(session)
    changes: dict[str, object] = {"last_status_code": status_code, "last_error": error,
                                  "last_duration_ms": duration_ms}
    if status_code is not None and 200 <= status_code < 300:
        outcome = "delivered"
        changes["delivered_at"] = now
    elif final or delivery.attempt >= max_attempts:
        outcome = "failed"
    else:
        outcome = "pending"
        wait = backoff.delay(delivery.attempt) * random.uniform(0.75, 1.25)  # noqa: S311 - not a secret
        changes["next_attempt_at"] = now + timedelta(seconds=wait)
    changes["status"] = outcome
    moved = session.execute(update(_D).where(_D.c.id == delivery.id, _D.c.status == "pending",
                                             _D.c.attempts == delivery.attempt).values(**changes))
    return outcome if moved.rowcount == 1 else None
