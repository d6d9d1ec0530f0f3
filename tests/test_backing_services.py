"""The throwaway Postgres the suite starts when ``GRPO_TEST_DATABASE_URL`` is not set
(tests/backing_services.py), started and stopped here on its own: it takes connections, the
tests' migrations and databases, and leaves nothing behind."""

from __future__ import annotations

import uuid

import pytest
from backing_services import ThrowawayPostgres
from sqlalchemy import create_engine, pool, text


@pytest.mark.slow
def test_a_throwaway_cluster_serves_the_tests_and_goes_away() -> None:
    from service_db import migrated

    postgres = ThrowawayPostgres()
    url = postgres.start()
    try:
        engine = create_engine(url, poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
        name = f"grpo_probe_{uuid.uuid4().hex[:8]}"
        with engine.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        with migrated(url.rsplit("/", 1)[0] + f"/{name}") as fresh:
            with create_engine(fresh, poolclass=pool.NullPool).connect() as connection:
                assert connection.execute(text("SELECT count(*) FROM teams")).scalar() == 1  # seeded default
    finally:
        postgres.stop()
    assert not postgres.folder.exists()


@pytest.mark.slow
def test_a_cluster_whose_session_dies_is_stopped_and_removed() -> None:
    """The session SIGKILLed: pg_ctl's daemon would outlive it; its watcher ends it."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from waiting import wait_until

    script = ("import sys; sys.path.insert(0, 'tests'); from backing_services import ThrowawayPostgres; "
              "p = ThrowawayPostgres(); p.start(); print(p.folder, flush=True); import time; time.sleep(600)")
    session = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    folder = Path(session.stdout.readline().strip())
    assert (folder / "data" / "postmaster.pid").is_file()
    session.send_signal(signal.SIGKILL)
    session.wait()
    wait_until(lambda: not folder.exists(), 30, "the dead session's cluster to be removed")
