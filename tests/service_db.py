"""Throwaway databases for service tests: a fresh Postgres database or SQLite file, migrated
to head with the project's Alembic revisions (never ``create_all``).

Postgres must be running (``.ci/run`` starts it): a test that needs it errors loudly when it is
down rather than skipping, because a skipped database test is a test nobody ran.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backing_services import database_url as admin_url  # throwaway databases are made from it
from sqlalchemy import create_engine, make_url, pool, text
from sqlalchemy.exc import OperationalError


@contextmanager
def fresh_postgres_url(prefix: str = "grpo_test") -> Iterator[str]:
    """Create an empty database, yield its URL, drop it afterwards with its connections."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(
        admin_url(),
        isolation_level="AUTOCOMMIT",  # CREATE/DROP DATABASE cannot run inside a transaction
        poolclass=pool.NullPool,
        connect_args={"connect_timeout": 5},
    )
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        raise RuntimeError(f"Postgres at {admin_url()} did not answer (CI starts it): {exc}") from exc
    try:
        yield make_url(admin_url()).set(database=name).render_as_string(hide_password=False)
    finally:
        from api.store.db import dispose_engine

        # Engines are cached by URL: a cached one would point at the dropped database.
        dispose_engine(make_url(admin_url()).set(database=name).render_as_string(hide_password=False))
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def sqlite_url(folder: Path) -> str:
    """URL of a SQLite file in ``folder`` (SQLite creates it on first connect)."""
    return f"sqlite:///{folder / 'grpo.db'}"


@contextmanager
def migrated(url: str) -> Iterator[str]:
    """Upgrade ``url`` to head and yield it."""
    from api.store.migrate import upgrade_to_head

    upgrade_to_head(url)
    yield url
