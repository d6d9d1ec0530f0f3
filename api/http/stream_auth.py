"""How a WebSocket proves who it is without putting a key in its URL (URLs end up in access
logs, proxies and browser histories).

A client that can set headers sends ``Authorization: Bearer T`` as on any request. A browser
cannot, so it offers subprotocols instead: :data:`SUBPROTOCOL` (which the server selects, as a
browser requires one of its offers back) plus either ``grpo.bearer.<key>`` or, better,
``grpo.ticket.<ticket>``. A ticket comes from ``POST /v1/stream-tickets`` (with the key in the
header): random, single-use, valid for :data:`TICKET_TTL_SECONDS` and bound to the key that
asked for it, so what a browser keeps of a socket opened with it is worthless a moment later.
A ticket may also come as ``?ticket=`` for clients that can do neither; the access log
redacts it (``api.http.access_log``).

Redis holds a ticket's record under the hash of the ticket, never the ticket itself, named
through the deployment's :class:`~api.redis_keys.RedisKeys`, and the record names its
namespace too: stacks sharing one Redis never redeem each other's tickets. A record grants
nothing by itself: a key's ticket is worth what the key is worth when it is redeemed, and a
ticket with no key behind it (issued to the operator token) makes an admin only where the same
operator token is configured, which the record proves with an HMAC of the ticket under it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from starlette.requests import HTTPConnection

from api.http.auth import Principal
from api.settings import Settings

SUBPROTOCOL = "grpo.v1"
BEARER_PROTOCOL_PREFIX = "grpo.bearer."
TICKET_PROTOCOL_PREFIX = "grpo.ticket."
TICKET_TTL_SECONDS = 30
_TICKET_BYTES = 32
# A ticket is token_urlsafe(32): 43 characters. Anything much longer is not one of ours and is
# refused before it reaches Redis.
MAX_TICKET_LENGTH = 64


@dataclass(frozen=True)
class Credential:
    kind: Literal["bearer", "ticket"]
    value: str


def offered_credential(conn: HTTPConnection) -> Credential | None:
    """The credential a WebSocket handshake offers in its subprotocols or ``?ticket=``, if any."""
    for protocol in conn.scope.get("subprotocols") or ():
        if protocol.startswith(BEARER_PROTOCOL_PREFIX):
            return Credential("bearer", protocol.removeprefix(BEARER_PROTOCOL_PREFIX))
        if protocol.startswith(TICKET_PROTOCOL_PREFIX):
            return Credential("ticket", protocol.removeprefix(TICKET_PROTOCOL_PREFIX))
    ticket = conn.query_params.get("ticket")
    return Credential("ticket", ticket) if ticket is not None else None


def selected_subprotocol(conn: HTTPConnection) -> str | None:
    """What the server answers with: :data:`SUBPROTOCOL` when the client offered it (a
    credential-bearing protocol is never echoed back)."""
    return SUBPROTOCOL if SUBPROTOCOL in (conn.scope.get("subprotocols") or ()) else None


@dataclass(frozen=True)
class TicketHolder:
    """Whom a redeemed ticket was issued to: a key (by its hash, to be looked up as any key
    is), or the operator token (``key_hash`` None) that this deployment still has."""

    key_hash: str | None


def _redis_key(settings: Settings, ticket: str) -> str:
    return settings.redis_keys.stream_ticket(hashlib.sha256(ticket.encode()).hexdigest())


def _operator_proof(settings: Settings, ticket: str) -> str | None:
    """An HMAC of ``ticket`` under the operator token; None where no operator token can sign
    in (no token set, or auth off, where every caller is an admin without one)."""
    if settings.auth != "keys" or settings.api_token is None:
        return None
    secret = settings.api_token.get_secret_value().encode()
    return hmac.new(secret, ticket.encode(), hashlib.sha256).hexdigest()


async def issue_ticket(redis: aioredis.Redis, settings: Settings, principal: Principal) -> str:
    """A new ticket standing for ``principal``'s key (re-checked when it is redeemed) or, for a
    caller without one, for the operator token."""
    ticket = secrets.token_urlsafe(_TICKET_BYTES)
    record = {"namespace": settings.namespace, "key_hash": principal.key_hash}
    if principal.key_hash is None:
        record["operator"] = _operator_proof(settings, ticket)
    await redis.set(_redis_key(settings, ticket), json.dumps(record), ex=TICKET_TTL_SECONDS)
    return ticket


async def redeem_ticket(redis: aioredis.Redis, settings: Settings, ticket: str) -> TicketHolder | None:
    """Whom ``ticket`` was issued to, once: GETDEL makes a second use (or a use after the TTL)
    find nothing. None for an unknown, used or expired ticket, one of another namespace, and a
    keyless one this deployment's operator token did not sign."""
    if not ticket or len(ticket) > MAX_TICKET_LENGTH:
        return None
    raw = await redis.getdel(_redis_key(settings, ticket))
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("namespace") != settings.namespace:
        return None
    if isinstance(record.get("key_hash"), str):
        return TicketHolder(record["key_hash"])
    expected, proof = _operator_proof(settings, ticket), record.get("operator")
    if expected is None or not isinstance(proof, str) or not hmac.compare_digest(proof, expected):
        return None
    return TicketHolder(None)
