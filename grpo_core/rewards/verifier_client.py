"""HTTP client of a verifier service: rows POSTed in batches, answers checked against a schema.

Wire format (one request per batch of at most ``max_batch_size`` rows)::

    POST <url>   {"items": [{"prompt": str, "completion": str, "columns": {name: value}}, ...]}
    200          {"scores": [number | null, ...]}     # one per item, in order

A null or a malformed entry leaves that row unscorable; a body that is not this shape (or has the
wrong length) leaves the whole batch unscorable. Connection errors, timeouts, 5xx and 429 are
retried with jittered exponential backoff (a 429's or 503's ``Retry-After`` is honoured) until
the attempts or the call's deadline run out; then, and for any other status (a redirect is never
followed: the registered URL is the only address called), the call raises
:class:`~grpo_core.errors.RewardUnavailable`. Messages name the verifier and the status or error
class, never the auth secret.
"""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from grpo_core.errors import RewardUnavailable
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint

__all__ = ["VerifierClient", "VerifierScores"]

MAX_ATTEMPTS = 4
BACKOFF_SECONDS = 0.2  # first retry's mean delay; doubled each time
MAX_BACKOFF_SECONDS = 5.0


class _Reply(BaseModel):
    scores: list[Any]


@dataclass
class VerifierScores:
    scores: list[float | None]  # None: the verifier gave no usable score for the row
    unscored: int = 0  # rows answered null or malformed


def _entry(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    score = float(value)
    return score if math.isfinite(score) else None


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asked to wait (a number or an HTTP date), None if it did not say."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


_slots_lock = threading.Lock()
_slots: dict[tuple[str, int], threading.Semaphore] = {}


def _process_slots(name: str, limit: int) -> threading.Semaphore:
    """One semaphore per verifier in this process: two rewards naming one verifier share its
    ``max_concurrency``, and so do calls abandoned at their time budget, which hold their slots
    until their requests return."""
    with _slots_lock:
        return _slots.setdefault((name, limit), threading.Semaphore(limit))


class VerifierClient:
    """One per bound reward in a job process; ``max_concurrency`` bounds the requests in flight to
    the verifier from the whole process."""

    def __init__(self, name: str, endpoint: VerifierEndpoint, transport: httpx.BaseTransport | None = None,
                 ) -> None:
        self.name, self.endpoint = name, endpoint
        # trust_env off: no proxy or netrc from the worker's environment reaches the verifier.
        self._http = httpx.Client(follow_redirects=False, trust_env=False, headers=endpoint.headers(),
                                  transport=transport)
        self._slots = _process_slots(name, endpoint.max_concurrency)

    def score(self, items: list[dict[str, Any]], budget_seconds: float | None) -> VerifierScores:
        """Scores of ``items`` in order; every request finishes (or is given up) within
        ``budget_seconds`` (None: the attempts alone bound it)."""
        if not items:
            return VerifierScores([])
        if budget_seconds is None:
            budget_seconds = MAX_ATTEMPTS * (self.endpoint.timeout_seconds + MAX_BACKOFF_SECONDS)
        deadline = time.monotonic() + budget_seconds
        size = self.endpoint.max_batch_size
        batches = [items[i:i + size] for i in range(0, len(items), size)]
        with ThreadPoolExecutor(min(len(batches), self.endpoint.max_concurrency),
                                thread_name_prefix=f"verifier-{self.name}") as pool:
            parts = list(pool.map(lambda batch: self._post(batch, deadline), batches))
        return VerifierScores([s for part in parts for s in part.scores], sum(p.unscored for p in parts))

    def _unavailable(self, why: str) -> RewardUnavailable:
        return RewardUnavailable(f"verifier '{self.name}' is unavailable: {why}")

    def _post(self, batch: list[dict[str, Any]], deadline: float) -> VerifierScores:
        last = "no attempt made"
        for attempt in range(1, MAX_ATTEMPTS + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._slots.acquire(timeout=remaining):
                break
            try:
                response = self._http.post(self.endpoint.url, json={"items": batch},
                                           timeout=min(self.endpoint.timeout_seconds, remaining))
            except httpx.TransportError as exc:  # refused, reset, timed out: worth another try
                last, wait = f"{type(exc).__name__}", None
            else:
                if response.is_success:
                    return self._parse(response, len(batch))
                if response.status_code != 429 and response.status_code < 500:
                    redirect = " (redirects are not followed)" if response.is_redirect else ""
                    raise self._unavailable(f"it answered HTTP {response.status_code}{redirect}")
                last, wait = f"HTTP {response.status_code}", _retry_after(response)
            finally:
                self._slots.release()
            if attempt == MAX_ATTEMPTS:
                break
            if wait is None:  # full jitter around the exponential mean, so retries do not march in step
                wait = BACKOFF_SECONDS * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
            wait = min(wait, MAX_BACKOFF_SECONDS)
            if time.monotonic() + wait >= deadline:
                last += ", and no time left in the call's budget to retry"
                break
            time.sleep(wait)
        raise self._unavailable(f"gave up after {attempt} attempt(s); last: {last}")

    def _parse(self, response: httpx.Response, n: int) -> VerifierScores:
        try:
            reply = _Reply.model_validate(response.json())
        except (ValueError, ValidationError):  # not JSON, or not {"scores": [...]}
            return VerifierScores([None] * n, n)
        if len(reply.scores) != n:
            return VerifierScores([None] * n, n)
        scores = [_entry(value) for value in reply.scores]
        return VerifierScores(scores, sum(score is None for score in scores))
