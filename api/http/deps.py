"""FastAPI dependencies: settings, SQL session, Redis client and the caller, all taken from the
app (``create_app`` puts settings and clients on ``app.state``), never from module globals."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from api.domain.errors import Forbidden, Unauthorized
from api.http import stream_auth
from api.http.auth import (
    KeyCache,
    NotReady,
    Principal,
    is_operator_token,
    presented_token,
    principal_for_grant,
)
from api.settings import Settings
from api.storage import ObjectStore, open_store
from api.store import api_keys
from api.store.db import session_scope
from api.store.teams import DEFAULT_TEAM, KeyGrant, principal_for_key_hash, team_id_by_name


async def get_settings(conn: HTTPConnection) -> Settings:
    # ``async`` (here and below) so FastAPI calls it inline, not through the threadpool.
    return conn.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(conn: HTTPConnection, settings: SettingsDep) -> Iterator[Session]:
    """One transaction per request, committed when the route returns (before the response is
    sent, hence ``scope="function"``), rolled back when it raises; what it wrote for live
    readers is published after the commit."""
    with session_scope(settings.database_url, publish=conn.app.state.publish) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


async def get_redis(conn: HTTPConnection) -> aioredis.Redis:
    return conn.app.state.redis


RedisDep = Annotated[aioredis.Redis, Depends(get_redis)]


def _lookup_default_team(database_url: str) -> int:
    with session_scope(database_url) as session:
        team_id = team_id_by_name(session, DEFAULT_TEAM)
    if team_id is None:
        raise NotReady(f"team '{DEFAULT_TEAM}' is missing; run `python -m api.store.migrate`")
    return team_id


async def default_team_id(conn: HTTPConnection, settings: Settings) -> int:
    """The ``default`` team's id, looked up once per app (the migration seeds it); the lookup
    is the only I/O here, so every later request answers from ``app.state`` inline."""
    cached = getattr(conn.app.state, "default_team_id", None)
    if cached is None:
        cached = await run_in_threadpool(_lookup_default_team, settings.database_url)
        conn.app.state.default_team_id = cached
    return cached


async def get_key_cache(conn: HTTPConnection) -> KeyCache:
    """The app's cache of verified keys, made on first use with the app's settings."""
    state = conn.app.state
    cache = getattr(state, "key_cache", None)
    if cache is None:
        cache = state.key_cache = KeyCache(state.settings.auth_cache_seconds)
    return cache


KeyCacheDep = Annotated[KeyCache, Depends(get_key_cache)]


async def get_object_store(conn: HTTPConnection) -> ObjectStore:
    """The app's object store (``GRPO_STORAGE_URL``), opened on first use in the threadpool (a
    bucket's client imports boto3 and reads the ``AWS_*`` variables); its calls block, so routes
    make them from the threadpool too."""
    state = conn.app.state
    store = getattr(state, "object_store", None)
    if store is None:
        store = state.object_store = await run_in_threadpool(open_store, state.settings.storage_location)
    return store


ObjectStoreDep = Annotated[ObjectStore, Depends(get_object_store)]


def _lookup_key(database_url: str, key_hash: str) -> KeyGrant:
    with session_scope(database_url) as session:
        grant = principal_for_key_hash(session, key_hash)
    if grant is None:
        raise Unauthorized("invalid API key", param="Authorization")
    return grant


async def principal_for_key(settings: Settings, cache: KeyCache, key_hash: str,
                            fresh: bool = False) -> Principal:
    """The caller a key (by its hash) stands for: from the cache, else (or with ``fresh``, for a
    re-check that must see a revocation made by another process) one SQL lookup in the
    threadpool. :class:`Unauthorized` for an unknown or revoked key."""
    principal = None if fresh else cache.get(key_hash)
    if principal is None:
        generation = cache.generation
        grant = await run_in_threadpool(_lookup_key, settings.database_url, key_hash)
        principal = principal_for_grant(grant, key_hash)
        cache.put(key_hash, grant.key_id, principal, generation)
    return principal


async def _principal_for_token(conn: HTTPConnection, settings: Settings, cache: KeyCache, token: str
                               ) -> Principal:
    if is_operator_token(settings, token):
        return Principal(team_id=await default_team_id(conn, settings), is_admin=True)
    if not api_keys.is_well_formed(token):
        raise Unauthorized("malformed API key", param="Authorization")
    return await principal_for_key(settings, cache, api_keys.hash_key(token))


async def _websocket_principal(conn: HTTPConnection, settings: Settings, cache: KeyCache) -> Principal:
    """A handshake without an Authorization header: a key or ticket offered as a subprotocol,
    or ``?ticket=`` (``api.http.stream_auth``); never ``?token=``."""
    credential = stream_auth.offered_credential(conn)
    if credential is None:
        raise Unauthorized("missing bearer token", param="Authorization")
    if credential.kind == "bearer":
        return await _principal_for_token(conn, settings, cache, credential.value)
    holder = await stream_auth.redeem_ticket(conn.app.state.redis, settings, credential.value)
    if holder is None:
        raise Unauthorized("invalid, used or expired stream ticket", param="ticket")
    if holder.key_hash is None:  # the operator token's, which redeem_ticket checked
        return Principal(team_id=await default_team_id(conn, settings), is_admin=True)
    return await principal_for_key(settings, cache, holder.key_hash)


async def get_principal(conn: HTTPConnection, settings: SettingsDep, cache: KeyCacheDep) -> Principal:
    """The caller (see ``api.http.auth``). Everything up to the cache runs inline; only a cache miss
    takes a threadpool hop for its one SQL lookup."""
    if settings.auth == "none":
        return Principal(team_id=await default_team_id(conn, settings), is_admin=True)
    token = presented_token(conn)
    if token is None and conn.scope["type"] == "websocket":
        return await _websocket_principal(conn, settings, cache)
    if token is None:
        raise Unauthorized("missing bearer token", param="Authorization")
    return await _principal_for_token(conn, settings, cache, token)


async def caller_is_admin(conn: HTTPConnection, settings: SettingsDep, cache: KeyCacheDep) -> bool:
    """For routes open to anyone that tell admins more (``/readyz``): whether the request
    carries an admin credential. Never raises: a wrong key, or a database that cannot check
    one, makes the caller anonymous (the operator token needs no database)."""
    if settings.auth == "none":
        return True
    token = presented_token(conn)
    if not token:
        return False
    if is_operator_token(settings, token):
        return True
    if not api_keys.is_well_formed(token):
        return False
    try:
        return (await principal_for_key(settings, cache, api_keys.hash_key(token))).is_admin
    except Exception:  # noqa: BLE001 - unknown key or backend down: both mean "not shown as admin"
        return False


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise Forbidden("admin key required", param="Authorization")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
