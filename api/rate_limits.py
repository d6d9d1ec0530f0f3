"""Token buckets for a team's requests: what is limited, and the arithmetic. Pure; the buckets'
state lives in Redis (:mod:`api.store.rate_buckets`), and :mod:`api.http.rate_limit` applies them.

Each team has two buckets, shared by all its keys and all API processes: **reads** (``GET``,
``HEAD``, and opening a job's stream) and **writes** (every other method: submits, clones,
cancels, PATCH, ...). Writes are kept apart so a team polling its dashboards never uses up its
submissions, nor a submit flood its reads; each bucket holds ``burst`` tokens and refills at its
rate, and a request takes one token or is refused for as long as one token takes to refill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from api.schemas.admin import TeamLimits

BucketKind = Literal["reads", "writes"]
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Bucket:
    rate: float  # tokens added per second
    burst: int  # tokens it holds when full


def bucket_kind(scope_type: str, method: str | None) -> BucketKind:
    """A WebSocket handshake (a stream opened) is a read, like the GET it upgrades."""
    if scope_type == "websocket" or (method or "GET").upper() in _READ_METHODS:
        return "reads"
    return "writes"


def bucket_of(limits: TeamLimits, kind: BucketKind) -> Bucket:
    """``limits``: effective ones (:func:`api.team_limits.effective_team_limits`), no field None."""
    if kind == "reads":
        return Bucket(float(limits.reads_per_second or 0), int(limits.read_burst or 0))
    return Bucket(float(limits.writes_per_second or 0), int(limits.write_burst or 0))


def take_token(tokens: float | None, elapsed: float, bucket: Bucket) -> tuple[float, float]:
    """``(tokens left, wait)``: a bucket that held ``tokens`` (None: never used, so full) and has
    refilled for ``elapsed`` seconds since, after one request. ``wait`` is 0 when the request may
    go, else the seconds until one token is back (the request is refused and takes nothing)."""
    held = bucket.burst if tokens is None else tokens
    available = min(bucket.burst, held + max(0.0, elapsed) * bucket.rate)
    if available >= 1:
        return available - 1, 0.0
    return available, (1 - available) / bucket.rate
