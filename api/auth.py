"""Who is calling, and as which team.

For now the service has one configured bearer token (``Settings.api_token``; unset means no
auth, for local development) that acts as the team ``default``. Routes only ever see a
:class:`Principal`, so per-team API keys can replace :func:`check_token` later without
touching them.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.requests import HTTPConnection

from api.errors import ServiceError, Unauthorized
from api.settings import Settings


class NotReady(ServiceError):  # noqa: N818 - domain vocabulary, like api.errors
    """The service cannot answer yet (its database is not migrated)."""

    code = "not_ready"


@dataclass(frozen=True)
class Principal:
    """``team_id`` is the caller's team; ``None`` with ``is_admin`` sees every team's jobs.
    Store functions take ``team_id`` with exactly that meaning."""

    team_id: int | None
    is_admin: bool = False


def presented_token(conn: HTTPConnection) -> str | None:
    """``Authorization: Bearer T``; on a WebSocket also ``?token=T``, since browsers cannot set
    headers on one. A header with another scheme counts as a wrong token, not a missing one."""
    header = conn.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else ""
    if conn.scope["type"] == "websocket":
        return conn.query_params.get("token")
    return None


def check_token(settings: Settings, token: str | None) -> None:
    """Raise :class:`Unauthorized` unless ``token`` is the configured one (or none is configured)."""
    expected = settings.api_token
    if expected is not None:
        if token is None:
            raise Unauthorized("missing bearer token", param="Authorization")
        # Constant-time, so response timing does not reveal how much of a guess was right.
        if not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
            raise Unauthorized("invalid bearer token", param="Authorization")
