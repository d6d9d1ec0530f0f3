"""Token buckets for a team's requests: what is limited, and the arithmetic. Pure; the buckets'
state lives in Redis (:mod:`api.store.rate_buckets`), and :mod:`api.http.rate_limit` applies them.

Each team has two buckets, shared by all its keys and all API processes: **reads** (``GET``,
``HEAD``, and opening a job's stream) and **writes** (every other method: submits, clones,
cancels, PATCH, ...). Writes are kept apart so a team polling its dashboards never uses up its
submissions, nor a submit flood its reads; each bucket holds ``burst`` tokens and refills at its
rate.

A request costs what it makes the API carry: one token, plus one per :data:`COST_UNIT_BYTES` of
its body (taken before it runs; one burst at most, so a bucket can always pay) and of the specs
in its answer (a page with specs, a job: charged after, and the bucket may go into debt, which
delays the team's next requests until it is repaid; concurrent large reads are each charged in
full, so running them side by side gains nothing). A megabyte spec then costs what
128 small requests do (a whole default write burst), and a team's limit bounds the API's work
for it, not just its count of requests: at the default write limit, a megabyte spec every ten
seconds, while a spec of a few kilobytes costs one token as any other request. A request the
bucket cannot pay is refused for as long as the tokens take to refill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from api.schemas.admin import TeamLimits

COST_UNIT_BYTES = 8 * 1024
# A YAML body's bytes count four times: even through libyaml, a spec's YAML takes ~20 times the
# CPU of its JSON to parse (measured: 0.15 s against 8 ms for half a megabyte).
YAML_WEIGHT = 4
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
    """``limits``: effective ones (:func:`api.limits.team_limits.effective_team_limits`), no field None."""
    if kind == "reads":
        return Bucket(float(limits.reads_per_second or 0), int(limits.read_burst or 0))
    return Bucket(float(limits.writes_per_second or 0), int(limits.write_burst or 0))


def cost_of(size: int, bucket: Bucket, weight: int = 1) -> int:
    """Tokens a request carrying ``size`` bytes takes (at most the bucket's burst); ``weight``:
    :data:`YAML_WEIGHT` for a YAML body."""
    return min(bucket.burst, 1 + max(0, size) * weight // COST_UNIT_BYTES)


def refilled(tokens: float | None, elapsed: float, bucket: Bucket) -> float:
    """What a bucket that held ``tokens`` (None: never used, so full) holds ``elapsed`` s later."""
    held = bucket.burst if tokens is None else tokens
    return min(bucket.burst, held + max(0.0, elapsed) * bucket.rate)


def take_tokens(tokens: float | None, elapsed: float, bucket: Bucket, cost: int) -> tuple[float, float]:
    """``(tokens left, wait)`` after a request of ``cost``: ``wait`` is 0 when it may go, else the
    seconds until the bucket holds ``cost`` again (the request is refused and takes nothing)."""
    available = refilled(tokens, elapsed, bucket)
    if available >= cost:
        return available - cost, 0.0
    return available, (cost - available) / bucket.rate


def charge_tokens(tokens: float | None, elapsed: float, bucket: Bucket, cost: int) -> float:
    """Tokens left after charging ``cost`` for work already done: never refused, and as deep into
    debt as the work was (a floor would let requests running side by side pay less than their
    answers' size)."""
    return refilled(tokens, elapsed, bucket) - cost
