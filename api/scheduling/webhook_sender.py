"""The webhook sender: a thread of the scheduler process (``grpo scheduler``, hence ``grpo dev``)
that POSTs the deliveries job transitions left in the outbox (:mod:`api.store.webhooks`).

Never on the API's request path nor the worker's. Deliveries are sent concurrently, each in a
thread of its own as soon as it is due and a slot is free, never waiting for others to finish:
at most ``GRPO_WEBHOOK_MAX_IN_FLIGHT`` requests at once, of which at most
``GRPO_WEBHOOK_MAX_IN_FLIGHT_PER_TEAM`` of one team and ``…_PER_DESTINATION`` to one host and
port (:class:`InFlight`), so a team's slow or hanging receivers hold only its own slots and
another team's delivery starts at once. Each request goes through the egress guard
(:mod:`grpo_core.egress`): the address it connects to is checked (a refused one fails the
delivery at once, ``destination_not_allowed``, and nothing is sent), no redirect is followed, and
connect, send and answer together end within ``GRPO_WEBHOOK_TIMEOUT_SECONDS``. The answer's body
is never read. What is recorded is a status code, a duration and an error class
(:data:`ERROR_CLASSES`): never exception text, which would tell a team what answered where.

Every scheduler process runs one, leader or not: taking a delivery is row-guarded
(:mod:`api.store.webhook_deliveries`), so more senders only share the work. Signed as
:mod:`api.security.webhook_signing` says, with the secret :mod:`api.security.secret_box` unseals.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait
from urllib.parse import urlsplit

import httpx
from sqlalchemy.exc import SQLAlchemyError

from api.security.secret_box import SecretBox, SecretKeyError
from api.security.webhook_signing import signed_headers
from api.settings import Settings
from api.store.clock import Backoff
from api.store.db import session_scope
from api.store.webhook_deliveries import DueDelivery, record_attempt, take_due
from grpo_core.egress import DestinationRefused, EgressPolicy, guarded_client

log = logging.getLogger(__name__)

ERROR_CLASSES = ("timeout", "connect_failed", "tls", "http_status", "destination_not_allowed")
# A taken delivery is left alone this long beyond its request's deadline before another sender
# may take it again: time for the result to be written.
LEASE_MARGIN_SECONDS = 60.0


def destination(url: str) -> str:
    """What the per-destination cap counts: the URL's host and port."""
    parts = urlsplit(url)
    return f"{(parts.hostname or '').lower()}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


class InFlight:
    """The requests in flight, by team and by destination, under their caps (thread-safe)."""

    def __init__(self, per_team: int, per_destination: int) -> None:
        self.per_team = per_team
        self.per_destination = per_destination
        self.teams: Counter[int] = Counter()
        self.destinations: Counter[str] = Counter()
        self.lock = threading.Lock()

    def take(self, team_id: int, url: str) -> bool:
        where = destination(url)
        with self.lock:
            if self.teams[team_id] >= self.per_team or self.destinations[where] >= self.per_destination:
                return False
            self.teams[team_id] += 1
            self.destinations[where] += 1
            return True

    def give_back(self, team_id: int, url: str) -> None:
        where = destination(url)
        with self.lock:
            self.teams[team_id] -= 1
            self.destinations[where] -= 1

    def full_teams(self) -> list[int]:
        with self.lock:
            return [team for team, count in self.teams.items() if count >= self.per_team]

    def total(self) -> int:
        with self.lock:
            return sum(self.teams.values())


def error_class(exc: httpx.HTTPError) -> str:
    """The class of a failed request, from the exception's type and causes (never its text)."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return "tls"
        cause = cause.__cause__ or cause.__context__
    return "connect_failed"


class WebhookSender:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.backoff = Backoff(settings.webhook_retry_seconds, settings.webhook_retry_max_seconds)
        self.box = SecretBox.from_key(settings.secret_key)
        self.client = guarded_client(EgressPolicy.from_cidrs(settings.webhook_networks),
                                     settings.webhook_timeout_seconds)
        self.in_flight = InFlight(settings.webhook_max_in_flight_per_team,
                                  settings.webhook_max_in_flight_per_destination)
        self.pool = ThreadPoolExecutor(settings.webhook_max_in_flight, thread_name_prefix="webhook")
        self.finished = threading.Event()  # set when a request ends: its slot is free again

    def dispatch(self) -> list[Future[None]]:
        """Take what is due and fits the free slots, start sending each; never waits for them."""
        free = self.settings.webhook_max_in_flight - self.in_flight.total()
        if free <= 0:
            return []
        lease = self.settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS
        with session_scope(self.settings.database_url) as session:
            due = take_due(session, free, lease, self.in_flight, self.in_flight.full_teams())
        return [self.pool.submit(self.attempt, delivery) for delivery in due]

    def send_due(self) -> int:
        """One pass that waits for what it started (tests, a one-off run); how many were sent."""
        started = self.dispatch()
        wait(started)
        return len(started)

    def attempt(self, delivery: DueDelivery) -> None:
        """Send one delivery and record how it went; its slot is given back whatever happens."""
        try:
            status_code, error, duration_ms = self.post(delivery)
            with session_scope(self.settings.database_url) as session:
                outcome = record_attempt(session, delivery, status_code=status_code, error=error,
                                         duration_ms=duration_ms, backoff=self.backoff,
                                         max_attempts=self.settings.webhook_max_attempts,
                                         final=error == "destination_not_allowed")
            if outcome != "delivered":
                log.info("webhook delivery %s, attempt %s: %s (%s)", delivery.id, delivery.attempt,
                         outcome, error or status_code)
        except (SecretKeyError, SQLAlchemyError) as exc:  # left due again after its lease
            log.error("webhook delivery %s not sent or not recorded: %s", delivery.id, exc)
        except Exception:  # noqa: BLE001 - a bug in one delivery must not stop the others
            log.exception("webhook delivery %s failed", delivery.id)
        finally:
            self.in_flight.give_back(delivery.team_id, delivery.url)
            self.finished.set()

    def post(self, delivery: DueDelivery) -> tuple[int | None, str | None, int]:
        """``(status code, error class, milliseconds)`` of one attempt; no status code when none
        came back. The answer's body is not read."""
        if self.box is None:
            raise SecretKeyError("GRPO_SECRET_KEY is not set: deliveries cannot be signed")
        secret = self.box.open(delivery.sealed_secret)
        headers = signed_headers(delivery.id, secret, int(time.time()), delivery.body)
        started = time.monotonic()
        status_code, error = None, None
        try:
            with self.client.stream("POST", delivery.url, content=delivery.body, headers=headers) as answer:
                status_code = answer.status_code
            error = None if 200 <= status_code < 300 else "http_status"
        except DestinationRefused:
            error = "destination_not_allowed"
        except httpx.HTTPError as exc:
            error = error_class(exc)
        except httpx.InvalidURL:  # a spelling urlsplit took at registration and httpx does not
            error = "connect_failed"
        return status_code, error, round((time.monotonic() - started) * 1000)

    def run(self, stop: threading.Event) -> None:
        """Start what is due whenever a slot frees or ``webhook_poll_seconds`` pass, until ``stop``;
        a failed pass is logged and retried, never fatal."""
        try:
            while not stop.is_set():
                self.finished.clear()
                try:
                    self.dispatch()
                except SQLAlchemyError as exc:
                    log.warning("webhook pass failed: %s", exc)
                except Exception:  # noqa: BLE001 - a bug in one pass must not stop notifications
                    log.exception("webhook pass failed")
                self.finished.wait(self.settings.webhook_poll_seconds)
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
