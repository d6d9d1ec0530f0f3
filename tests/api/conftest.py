"""Fixtures for the service's tests: real, empty databases, one per test.

Each fixture is small and named for what it yields; add new ones below in the same way.
Postgres must be running (``.ci/run`` starts it): a test that needs it errors loudly when it is
down rather than skipping, because a skipped database test is a test nobody ran.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, pool, text
from sqlalchemy.exc import OperationalError

# Trust auth on localhost; throwaway databases are created from this one.
POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
THROWAWAY_DB_PREFIX = "grpo_test_"


@pytest.fixture
def fresh_postgres_url() -> Iterator[str]:
    """URL of a new empty Postgres database, dropped (with its connections) after the test."""
    name = f"{THROWAWAY_DB_PREFIX}{uuid.uuid4().hex[:12]}"
    admin = create_engine(
        POSTGRES_ADMIN_URL,
        isolation_level="AUTOCOMMIT",  # CREATE/DROP DATABASE cannot run inside a transaction
        poolclass=pool.NullPool,
        connect_args={"connect_timeout": 5},
    )
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.fail(f"Postgres at {POSTGRES_ADMIN_URL} did not answer (CI starts it): {exc}", pytrace=False)
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def fresh_sqlite_url(tmp_path: Path) -> str:
    """URL of a SQLite file that does not exist yet (SQLite creates it on first connect)."""
    return f"sqlite:///{tmp_path / 'grpo.db'}"
