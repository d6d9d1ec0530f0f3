"""Who is calling, and as which team.

``api.http.deps.get_principal`` tries, in this order:

* ``Settings.auth == "none"`` (local development): every caller is an admin of team ``default``.
* The operator token ``Settings.api_token``, if set: an admin of team ``default``, for
  bootstrapping and operations (``grpo admin`` on the database is the other way in).
* A team API key (``api.store.api_keys``), looked up by its hash: the key's team, admin if the key is.

Credentials come in ``Authorization: Bearer T`` only (never in a URL, which access logs and
browser histories keep); a WebSocket may instead offer them as a subprotocol or redeem a
single-use stream ticket (``api.http.stream_auth``).

Routes only ever see a :class:`Principal`. Verified keys are kept in a :class:`KeyCache` for
``Settings.auth_cache_seconds``, so the hot path runs no SQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection

from api.domain.errors import ServiceError, Unauthorized
from api.settings import Settings

if TYPE_CHECKING:
    from api.store.teams import KeyGrant


class NotReady(ServiceError):  # noqa: N818 - domain vocabulary, like api.domain.errors
    """The service cannot answer yet (its database is not migrated)."""

    code = "not_ready"


@dataclass(frozen=True)
class Principal:
    """The caller: the team its key belongs to (jobs it submits belong there) and whether the
    key is an admin's, which sees and manages every team's jobs."""

    team_id: int
    is_admin: bool = False
    key_prefix: str | None = None  # None: the operator token, or no auth at all
    # The key's hash and id, so a long-lived connection can re-check that the key still holds
    # and hear of its revocation (:meth:`KeyCache.revocation_watch`).
    key_hash: str | None = field(default=None, repr=False)
    key_id: int | None = field(default=None, repr=False)

    @property
    def scope(self) -> int | None:
        """What store reads take as ``team_id``: the caller's team, or None (every team) for an
        admin. Another team's job is then simply not found."""
        return None if self.is_admin else self.team_id


def presented_token(conn: HTTPConnection) -> str | None:
    """``Authorization: Bearer T``. Only the Bearer scheme is read: a header with another
    scheme, or a bare ``Bearer``, is a wrong token (``""``, which nothing matches), not a
    missing one. A WebSocket may also offer the key as a subprotocol (``api.http.stream_auth``)."""
    header = conn.headers.get("authorization")
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def is_operator_token(settings: Settings, token: str) -> bool:
    expected = settings.api_token
    if expected is None or not token:  # an empty token never matches, whatever is configured
        return False
    # Constant-time, so response timing does not reveal how much of a guess was right.
    return hmac.compare_digest(token.encode(), expected.get_secret_value().encode())


def principal_for_grant(grant: KeyGrant, key_hash: str) -> Principal:
    """The caller a stored key stands for; :class:`Unauthorized` if it was revoked."""
    if grant.revoked:
        raise Unauthorized("API key revoked", param="Authorization")
    return Principal(team_id=grant.team_id, is_admin=grant.is_admin, key_prefix=grant.prefix,
                     key_hash=key_hash, key_id=grant.key_id)


@dataclass
class _Entry:
    key_id: int
    principal: Principal
    expires: float


class KeyCache:
    """Verified keys by hash, each trusted for ``ttl`` seconds (0: not kept). Only valid keys
    are kept, so it holds at most one entry per live key; used from the event loop only.

    A revocation evicts the key; a lookup that began before it could otherwise put the key
    back from a read made before the revocation committed, so :meth:`put` is refused when any
    eviction happened since the lookup began (``generation``, read before the lookup).

    A revocation through this process is also the moment its open streams must stop: each
    watches its key (:meth:`revocation_watch`) and closes when the eviction wakes it."""

    MAX_ENTRIES = 10_000  # a bound, not a tuning knob: well above any deployment's live keys

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.generation = 0
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._watchers: dict[int, set[asyncio.Event]] = {}

    def get(self, key_hash: str) -> Principal | None:
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        if entry.expires <= self._clock():
            del self._entries[key_hash]
            return None
        return entry.principal

    def put(self, key_hash: str, key_id: int, principal: Principal, generation: int) -> None:
        if self.ttl <= 0 or generation != self.generation:
            return
        now = self._clock()
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries = {h: e for h, e in self._entries.items() if e.expires > now}
        if len(self._entries) < self.MAX_ENTRIES:
            self._entries[key_hash] = _Entry(key_id, principal, now + self.ttl)

    def evict_key(self, key_id: int) -> None:
        self.generation += 1
        self._entries = {h: e for h, e in self._entries.items() if e.key_id != key_id}
        for revoked in self._watchers.get(key_id, ()):
            revoked.set()

    @contextlib.contextmanager
    def revocation_watch(self, key_id: int) -> Iterator[asyncio.Event]:
        """An event that :meth:`evict_key` sets if it evicts ``key_id`` while the block runs."""
        revoked = asyncio.Event()
        self._watchers.setdefault(key_id, set()).add(revoked)
        try:
            yield revoked
        finally:
            watchers = self._watchers.get(key_id, set())
            watchers.discard(revoked)
            if not watchers:
                self._watchers.pop(key_id, None)
