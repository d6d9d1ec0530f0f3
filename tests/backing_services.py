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
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

DATABASE_ENV, REDIS_ENV = "GRPO_TEST_DATABASE_URL", "GRPO_TEST_REDIS_URL"
_PG_USER = "postgres"  # initdb refuses to run as root: a root session runs the cluster as this user
# pg_ctl's server is a daemon, no child of the session: this watcher, started beside it, stops it
# and removes its folder if the session dies without doing so (killed, say).
_WATCHER = """
import os, shutil, subprocess, sys, time
parent, stop, folder = int(sys.argv[1]), sys.argv[2:-1], sys.argv[-1]
while os.getppid() == parent:
    time.sleep(1)
subprocess.run(stop, capture_output=True)
shutil.rmtree(folder, ignore_errors=True)
"""


def database_url() -> str:
    return os.environ[DATABASE_ENV]


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
        self.watcher: subprocess.Popen | None = None

    @staticmethod
    def _as_owner(argv: list[str]) -> list[str]:
        return ["runuser", "-u", _PG_USER, "--", *argv] if os.geteuid() == 0 else argv

    def _run(self, argv: list[str]) -> None:
        subprocess.run(self._as_owner(argv), check=True, capture_output=True, timeout=120)

    def _stop_command(self) -> list[str]:
        return self._as_owner([_postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"])

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
        watch = [sys.executable, "-c", _WATCHER, str(os.getpid()), *self._stop_command(), str(self.folder)]
        self.watcher = subprocess.Popen(watch, start_new_session=True)
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
            subprocess.run(self._stop_command(), check=True, capture_output=True, timeout=120)
        except (subprocess.SubprocessError, RuntimeError):
            pass  # already gone; the folder goes all the same
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.watcher is not None:
            self.watcher.kill()
            self.watcher.wait()


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
