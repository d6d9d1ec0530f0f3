"""Engine and sessions, created on first use (never at import time)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from api.store import outbox

_ENGINES: dict[str, Engine] = {}


def _forget_inherited_connections() -> None:
    """In a forked child (Celery's pool processes are forked from the worker's main process, which
    writes to SQL too): never use the parent's pooled connections, whose sockets the parent still
    reads. ``close=False`` leaves them to the parent."""
    for engine in _ENGINES.values():
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_inherited_connections)


def get_engine(url: str) -> Engine:
    if url not in _ENGINES:
        _ENGINES[url] = _create_engine(url)
    return _ENGINES[url]


def dispose_engine(url: str) -> None:
    """Close and forget ``url``'s engine (its database is about to be dropped, say)."""
    engine = _ENGINES.pop(url, None)
    _session_factory.cache_clear()
    if engine is not None:
        engine.dispose()


def _create_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:
            # WAL lets the API read while the worker writes; foreign keys are off by default in SQLite.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    # pool_size keeps up to 20 connections open between requests: a smaller pool closed each
    # connection above it on return, so a burst of submits paid a new Postgres connection per
    # request. Overflow caps the total at 30, as before. The pre-ping keeps a restarted
    # database from failing the first request on each stale connection.
    return create_engine(url, pool_pre_ping=True, pool_size=20, max_overflow=10)


@lru_cache
def _session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


def discard(session: Session) -> None:
    """Roll back what the session's transaction wrote and drop what it staged for live readers: a
    dry run that went the whole way (a submit's checks, its write and its admission) keeps nothing."""
    session.rollback()
    outbox.take(session)


@contextmanager
def session_scope(url: str, publish: outbox.Publish | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on error. After the commit, what the
    transaction staged for live readers (:mod:`api.store.outbox`) goes to ``publish``."""
    session = _session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        outbox.take(session)
        raise
    finally:
        session.close()
    staged = outbox.take(session)
    if staged and publish is not None:
        publish(staged)
