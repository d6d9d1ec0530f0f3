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

from api.auth import NotReady, Principal, check_token, presented_token
from api.db import session_scope
from api.settings import Settings
from api.store.teams import DEFAULT_TEAM, team_id_by_name


async def get_settings(conn: HTTPConnection) -> Settings:
    # ``async`` (here and below) so FastAPI calls it inline, not through the threadpool.
    return conn.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    """One transaction per request, committed when the route returns (before the response is
    sent, hence ``scope="function"``), rolled back when it raises."""
    with session_scope(settings.database_url) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


async def get_redis(conn: HTTPConnection) -> aioredis.Redis:
    return conn.app.state.redis


RedisDep = Annotated[aioredis.Redis, Depends(get_redis)]


def _lookup_default_team(database_url: str) -> int:
    with session_scope(database_url) as session:
        team_id = team_id_by_name(session, DEFAULT_TEAM)
    if team_id is None:
        raise NotReady(f"team '{DEFAULT_TEAM}' is missing; run `python -m api.migrate`")
    return team_id


async def default_team_id(conn: HTTPConnection, settings: Settings) -> int:
    """The ``default`` team's id, looked up once per app (the migration seeds it); the lookup
    is the only I/O here, so every later request answers from ``app.state`` inline."""
    cached = getattr(conn.app.state, "default_team_id", None)
    if cached is None:
        cached = await run_in_threadpool(_lookup_default_team, settings.database_url)
        conn.app.state.default_team_id = cached
    return cached


async def get_principal(conn: HTTPConnection, settings: SettingsDep) -> Principal:
    check_token(settings, presented_token(conn))
    return Principal(team_id=await default_team_id(conn, settings), is_admin=False)


PrincipalDep = Annotated[Principal, Depends(get_principal)]
