"""Throwaway databases for service tests: a fresh Postgres database or SQLite file, migrated
to head with the project's Alembic revisions (never ``create_all``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextmanager
def fresh_postgres_url(prefix: str = "grpo_t") -> Iterator[str]:
    """Create an empty database, yield its URL, drop it afterwards (ending leftover sessions)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from api.store.db import get_engine

        get_engine.cache_clear()
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :n AND pid <> pg_backend_pid()"
                ),
                {"n": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def sqlite_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'grpo.db'}"


@contextmanager
def migrated(url: str) -> Iterator[str]:
    """Upgrade ``url`` to head and yield it."""
    from api.store.migrate import upgrade_to_head

    upgrade_to_head(url)
    yield url
