"""Bring a database to the newest schema: the prestart step of every deployment.

``python -m api.store.migrate`` waits for the configured database to accept connections (in
docker-compose the API container may start before Postgres is ready), then runs
``alembic upgrade head``. Imports only SQLAlchemy, Alembic and the settings, never torch, so the
prestart stays fast.

``grpo api``, ``grpo scheduler`` and ``grpo admin`` check the schema first
(:func:`ensure_schema`): behind the code's head, they migrate it (``GRPO_AUTO_MIGRATE``, the
default; several starting at once take turns under a Postgres advisory lock) or refuse with the
exact command to run. ``/readyz`` is 503 while the schema is behind (:func:`schema_problem`).

The revisions are read from the checkout's ``migrations/``, or, in a non-editable install (the
docker image's), from the copy the wheel installs as data files (:func:`alembic_ini`).
"""

from __future__ import annotations

import logging
import time
from functools import cache
from importlib import metadata
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, pool, text
from sqlalchemy.exc import OperationalError

from api.settings import get_settings

# A checkout (or an editable install) has migrations/ beside api/.
CHECKOUT_ALEMBIC_INI = Path(__file__).resolve().parents[2] / "migrations" / "alembic.ini"
DISTRIBUTION = "grpo-service"
WAIT_TRIES = 30
WAIT_SECONDS = 1.0

log = logging.getLogger(__name__)


@cache
def alembic_ini() -> Path:
    """migrations/alembic.ini of the checkout, else of the installed distribution.

    A wheel (``pip install .``, the docker image) carries migrations/ as data files
    (pyproject.toml's ``data-files``) under its install scheme's data folder; the wheel's RECORD
    lists where, whatever the scheme (a venv, ``--user``, ``--prefix``).
    """
    if CHECKOUT_ALEMBIC_INI.is_file():
        return CHECKOUT_ALEMBIC_INI
    try:
        files = metadata.files(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.parts[-2:] == ("migrations", "alembic.ini") and Path(file.locate()).is_file():
            return Path(file.locate()).resolve()
    raise FileNotFoundError(f"no {CHECKOUT_ALEMBIC_INI} (a checkout's) nor migrations/alembic.ini among the "
                            f"installed {DISTRIBUTION} distribution's files: reinstall it (pip install .)")


def alembic_config(database_url: str) -> Config:
    """The project's Alembic config pointed at ``database_url`` (the URL set here wins in env.py)."""
    cfg = Config(str(alembic_ini()))
    # The ini's interpolation would read a percent-encoded password ("%40") as a reference.
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade_to_head(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "head")


MIGRATE_COMMAND = "python -m api.store.migrate"
_LOCK_ID = 0x67_72_70_6F  # "grpo": one advisory lock for every process that migrates


class SchemaBehind(RuntimeError):
    """The database's schema is not the one this code needs, and it may not migrate it."""


@cache
def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The database's revision; None when it was never migrated."""
    return MigrationContext.configure(connection).get_current_revision()


def schema_problem(connection: Connection) -> str | None:
    """None when the schema is at the code's head, else what is wrong and the command that fixes it."""
    found, head = current_revision(connection), head_revision()
    if found == head:
        return None
    state = "was never migrated" if found is None else f"is at revision {found}"
    return f"the database {state}; this code needs {head}: run `{MIGRATE_COMMAND}`"


def ensure_schema(database_url: str, migrate: bool) -> None:
    """Return once the schema is at head, migrating it if ``migrate``; else :class:`SchemaBehind`."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            problem = schema_problem(connection)
            if problem is None:
                return
            if not migrate:
                raise SchemaBehind(problem)
            postgres = connection.dialect.name == "postgresql"
            if postgres:  # replicas starting together: one migrates, the others find it done
                connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _LOCK_ID})
            try:
                log.info("%s; migrating", problem.split(": run")[0])
                upgrade_to_head(database_url)
            finally:
                if postgres:
                    connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": _LOCK_ID})
    finally:
        engine.dispose()


def wait_for_database(database_url: str, tries: int = WAIT_TRIES, delay: float = WAIT_SECONDS) -> None:
    """Return once ``SELECT 1`` succeeds; re-raise the last error after ``tries`` attempts."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        for attempt in range(1, tries + 1):
            try:
                with engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
                return
            except OperationalError as exc:
                if attempt == tries:
                    raise
                log.info("database not ready (%d/%d): %s", attempt, tries, _reason(exc))
                time.sleep(delay)
    finally:
        engine.dispose()


def _reason(exc: OperationalError) -> str:
    """The driver's first line: one log line per try, not a paragraph."""
    return str(exc.orig or exc).strip().splitlines()[0]


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s [%(name)s] %(message)s")
    database_url = get_settings().database_url
    try:
        wait_for_database(database_url, WAIT_TRIES, WAIT_SECONDS)
    except OperationalError as exc:
        log.error("database never answered after %d tries: %s", WAIT_TRIES, _reason(exc))
        return 1
    upgrade_to_head(database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
