"""The webhook sender: a thread of the scheduler process (``grpo scheduler``, hence ``grpo dev``)
that POSTs the deliveries job transitions left in the outbox (:mod:`api.store.webhooks`).

Never on the API's request path nor the worker's: a receiver that is down or slow delays only
its own deliveries. Each pass takes up to :data:`BATCH` due deliveries and sends them at once,
one thread each, every request bounded by ``GRPO_WEBHOOK_TIMEOUT_SECONDS`` and no redirect
followed (a redirect is an answer other than 2xx, so it is retried like one). Every scheduler
process runs one, leader or not: taking a delivery is row-guarded
(:mod:`api.store.webhook_deliveries`), so more senders only share the work. Signed as
:mod:`api.webhook_signing` says.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy.exc import SQLAlchemyError

from api.settings import Settings
from api.store.clock import Backoff
from api.store.db import session_scope
from api.store.webhook_deliveries import DueDelivery, record_attempt, take_due
from api.webhook_signing import signed_headers

log = logging.getLogger(__name__)

BATCH = 8
# A taken delivery is left alone this long beyond its request's timeout before another sender
# may take it again: time for the result to be written.
LEASE_MARGIN_SECONDS = 60.0


class WebhookSender:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.backoff = Backoff(settings.webhook_retry_seconds, settings.webhook_retry_max_seconds)
        self.client = httpx.Client(timeout=settings.webhook_timeout_seconds, follow_redirects=False,
                                   trust_env=False)
        self.pool = ThreadPoolExecutor(BATCH, thread_name_prefix="webhook")

    def send_due(self) -> int:
        """One pass: take what is due, send it, record each outcome; how many were sent."""
        lease = self.settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS
        with session_scope(self.settings.database_url) as session:
            due = take_due(session, BATCH, lease)
        for delivery, (status_code, error) in zip(due, self.pool.map(self.post, due), strict=True):
            with session_scope(self.settings.database_url) as session:
                outcome = record_attempt(session, delivery, status_code=status_code, error=error,
                                         max_attempts=self.settings.webhook_max_attempts,
                                         backoff=self.backoff)
            if outcome != "delivered":
                log.info("webhook delivery %s, attempt %s: %s (%s)", delivery.id, delivery.attempt,
                         outcome, error or status_code)
        return len(due)

    def post(self, delivery: DueDelivery) -> tuple[int | None, str | None]:
        """``(status code, error)`` of one attempt; no status code when none came back."""
        headers = signed_headers(delivery.id, delivery.secret, int(time.time()), delivery.body)
        try:
            response = self.client.post(delivery.url, content=delivery.body, headers=headers)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        ok = 200 <= response.status_code < 300
        return response.status_code, None if ok else f"HTTP {response.status_code}"

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop``; a failed pass is logged and retried, never fatal. A
        pass that found a full batch is followed at once by the next."""
        try:
            while not stop.is_set():
                sent = 0
                try:
                    sent = self.send_due()
                except SQLAlchemyError as exc:
                    log.warning("webhook pass failed: %s", exc)
                except Exception:  # noqa: BLE001 - a bug in one pass must not stop notifications
                    log.exception("webhook pass failed")
                if sent < BATCH:
                    stop.wait(self.settings.webhook_poll_seconds)
        finally:
            self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


def start(settings: Settings, stop: threading.Event) -> threading.Thread:
    """The sender, running in a daemon thread until ``stop``."""
    thread = threading.Thread(target=WebhookSender(settings).run, args=(stop,), name="webhook-sender",
                              daemon=True)
    thread.start()
    return thread
