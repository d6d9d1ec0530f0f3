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

Redis holds a ticket's record under the hash of the ticket, never the ticket itself.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from starlette.requests import HTTPConnection

from api.http.auth import Principal

SUBPROTOCOL = "grpo.v1"
BEARER_PROTOCOL_PREFIX = "grpo.bearer."
TICKET_PROTOCOL_PREFIX = "grpo.ticket."
TICKET_TTL_SECONDS = 30
_TICKET_BYTES = 32
_TICKET_KEY_PREFIX = "grpo:stream-ticket:"
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


def _redis_key(ticket: str) -> str:
    return _TICKET_KEY_PREFIX + hashlib.sha256(ticket.encode()).hexdigest()


async def issue_ticket(redis: aioredis.Redis, principal: Principal) -> str:
    """A new ticket standing for ``principal`` (its key is re-checked when it is redeemed)."""
    ticket = secrets.token_urlsafe(_TICKET_BYTES)
    record = {"team_id": principal.team_id, "is_admin": principal.is_admin,
              "key_prefix": principal.key_prefix, "key_hash": principal.key_hash}
    await redis.set(_redis_key(ticket), json.dumps(record), ex=TICKET_TTL_SECONDS)
    return ticket


async def redeem_ticket(redis: aioredis.Redis, ticket: str) -> Principal | None:
    """The principal ``ticket`` was issued to, once: GETDEL makes a second use (or a use after
    the TTL) find nothing. None for an unknown, used or expired ticket."""
    if not ticket or len(ticket) > MAX_TICKET_LENGTH:
        return None
    raw = await redis.getdel(_redis_key(ticket))
    if raw is None:
        return None
    record = json.loads(raw)
    return Principal(team_id=record["team_id"], is_admin=record["is_admin"],
                     key_prefix=record["key_prefix"], key_hash=record["key_hash"])
