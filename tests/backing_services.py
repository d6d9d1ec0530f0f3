"""The Postgres and Redis the service's tests use: the ones named by ``GRPO_TEST_DATABASE_URL``
(a database the tests may create databases from, e.g. ``postgresql+psycopg://postgres@127.0.0.1:5432/test``)
and ``GRPO_TEST_REDIS_URL``, or, where a variable is not set, throwaway ones started for the
session: a Postgres cluster made with ``initdb`` in a temporary folder and a ``redis-server``,
both on free ports, both gone when the session ends. So the README's test command needs only the
server binaries installed (Debian: ``postgresql``, ``redis-server``), nothing running.

:func:`provision` runs once, in the process that starts the session; it exports the variables,
so xdist's worker processes and every service process a test starts inherit the same servers.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

DATABASE_ENV, REDIS_ENV = "GRPO_TEST_DATABASE_URL", "GRPO_TEST_REDIS_URL"
_PG_USER = "postgres"  # initdb refuses to run as root: a root session runs the cluster as this user


def database_url() -> str:
    return os.environ[DATABASE_ENV]


def redis_url() -> str:
    return os.environ[REDIS_ENV]


def _postgres_bin(name: str) -> str:
    """A server binary: on PATH, or in Debian's versioned folder (newest first)."""
    versioned = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    found = shutil.which(name) or next(iter(versioned), None)
    if found is None:
        raise RuntimeError(f"{name} not found: install PostgreSQL's server (Debian: apt install postgresql) "
                           f"or point {DATABASE_ENV} at a running one")
    return found


class ThrowawayPostgres:
    """A cluster of its own: trust auth on 127.0.0.1, no fsync (a test's data need not survive),
    one database ``test`` to create the tests' databases from."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="grpo-test-pg-"))
        self.data = self.folder / "data"
        self.port = 0

    def _run(self, argv: list[str]) -> None:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", _PG_USER, "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def start(self) -> str:
        from api.cli.dev import free_port

        if os.geteuid() == 0:
            user = pwd.getpwnam(_PG_USER)
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self._run([_postgres_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                   "-E", "UTF8", "--no-sync"])
        self.port = free_port()
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c max_connections=300")
        self._run([_postgres_bin("pg_ctl"), "-D", str(self.data), "-o", options,
                   "-l", str(self.folder / "log"), "-w", "-t", "60", "start"])
        self._create_database("test")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/test"

    def _create_database(self, name: str) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                                     autocommit=True, connect_timeout=5) as connection:
                    connection.execute(f'CREATE DATABASE "{name}"')
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        try:
            self._run([_postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"])
        except (subprocess.SubprocessError, RuntimeError):
            pass  # already gone; the folder goes all the same
        shutil.rmtree(self.folder, ignore_errors=True)


def provision() -> list[Callable[[], None]]:
    """Start what the environment does not name; the stops to run when the session ends."""
    stops: list[Callable[[], None]] = []
    if not os.environ.get(DATABASE_ENV):
        postgres = ThrowawayPostgres()
        os.environ[DATABASE_ENV] = postgres.start()
        stops.append(postgres.stop)
    if not os.environ.get(REDIS_ENV):
        from api.cli.dev import start_redis, stop_process

        url, process = start_redis()
        os.environ[REDIS_ENV] = url.rsplit("/", 1)[0] + "/11"
        stops.append(lambda: stop_process(process))
    return stops
