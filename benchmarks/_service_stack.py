"""Helpers shared by the service benchmarks (``service_stream_latency.py``, ``service_api_throughput.py``).

They stand up the real stack the way a deployment does, on this machine:

* :func:`migrated_database` - a throwaway Postgres database (created from the trust-auth admin
  database ``test`` and dropped, with its sessions, on exit) or a SQLite file, upgraded to head
  with the project's Alembic revisions (``api.store.migrate.upgrade_to_head``), never ``create_all``.
* :func:`uvicorn_server` - ``python -m uvicorn --factory api.main:create_app`` in its own process
  group on a free port, configured only through ``GRPO_*`` environment variables (``create_app()``
  with no argument reads ``api.settings.get_settings()``), ready once ``/readyz`` answers 200;
  the whole group is terminated on exit. ``profile_to`` wraps it in ``py-spy record``.
* :class:`Role` - this script again, in a fresh interpreter, for the client side (clients are
  never in the server's process); the child writes its JSON result to a file.
* :func:`percentiles`, :func:`cpu_seconds`, :func:`loadavg` - the figures' arithmetic;
  :class:`RssSampler` - the server's resident memory over time.
* :func:`tiny_spec` - the JobSpec the benchmarks submit (``tests/specs.py``, the tests' own).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The one JobSpec factory, shared with the service's tests: ``tests/specs.py`` is a plain module
# (no pytest), so its folder goes on the path, after this one.
sys.path.append(str(ROOT / "tests"))
from specs import tiny_spec as tiny_spec  # noqa: E402 - re-exported to the benchmark scripts

POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/14"  # not the tests' database (11)
TOKEN = "bench-operator-token-3f9c1e5a7b2d4c60"  # GRPO_API_TOKEN wants 32+ characters
READY_TIMEOUT_S = 30.0
APP = "api.main:create_app"


def loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}/{five:.2f}/{fifteen:.2f}"


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean of ``values`` (nearest-rank, so p99 is a value that occurred)."""
    if not values:
        return {name: float("nan") for name in ("p50", "p90", "p99", "max", "mean")}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))]

    return {
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": ordered[-1],
        "mean": sum(ordered) / len(ordered),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def migrated_database(backend: str) -> Iterator[str]:
    """URL of a new database migrated to head: ``postgres`` (dropped on exit) or ``sqlite``."""
    from sqlalchemy import create_engine, text

    from api.store.migrate import upgrade_to_head

    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="grpo-bench-db-") as folder:
            url = f"sqlite:///{folder}/grpo.db"
            upgrade_to_head(url)
            yield url
        return
    name = f"grpo_bench_{uuid.uuid4().hex[:10]}"
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        upgrade_to_head(url)
        yield url
    finally:
        from api.store.db import get_engine

        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def drop_streams(database_url: str, job_ids: Sequence[int], redis_url: str = REDIS_URL) -> None:
    """Delete the Redis Streams of a database's jobs (in the namespace a server on it derives)."""
    import redis

    from api.redis_keys import RedisKeys, namespace_for

    keys = RedisKeys(namespace_for(database_url))
    with redis.Redis.from_url(redis_url) as client:
        if job_ids:
            client.delete(*(keys.job_stream(job_id) for job_id in job_ids))


def server_env(database_url: str, **settings: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(
        {
            "GRPO_DATABASE_URL": database_url,
            "GRPO_REDIS_URL": REDIS_URL,
            "GRPO_API_TOKEN": TOKEN,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update({f"GRPO_{key.upper()}": str(value) for key, value in settings.items()})
    return env


@contextlib.contextmanager
def uvicorn_server(
    database_url: str,
    workers: int = 1,
    profile_to: Path | None = None,
    access_log: bool = False,
    app: str = APP,
    extra_args: Sequence[str] = (),
    **settings: Any,
) -> Iterator[tuple[str, int]]:
    """``(base_url, pgid)`` of the real app under uvicorn; ``settings`` become ``GRPO_*`` vars.
    ``access_log``: log at ``info`` with the access log on, as ``grpo api`` does. ``app`` and
    ``extra_args`` (more uvicorn options) exist for experiments; the figures use the defaults.
    The server's output goes to a temporary file, shown (its tail) only if something fails."""
    import httpx

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        app,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        *extra_args,
    ]
    command += ["--log-level", "info"] if access_log else ["--log-level", "warning", "--no-access-log"]
    if profile_to is not None:
        py_spy = Path(sys.executable).with_name("py-spy")
        # --gil: only the thread holding the GIL (what the event loop waits for); --nonblocking:
        # the server is not paused per sample, so the figures of a profiled run stay near normal.
        command = [
            str(py_spy),
            "record",
            "--subprocesses",
            "--gil",
            "--nonblocking",
            "--rate",
            "100",
            "--format",
            "raw",
            "--output",
            str(profile_to),
            "--",
            *command,
        ]
    folder = tempfile.TemporaryDirectory(prefix="grpo-bench-server-")
    log_path = Path(folder.name) / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=server_env(database_url, **settings),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/readyz", timeout=2, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not become ready in {READY_TIMEOUT_S:g} s")
            time.sleep(0.1)
        yield base, proc.pid
    except BaseException:
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        print("server log (tail):", *tail, sep="\n", file=sys.stderr)
        raise
    finally:
        stop_group(proc, signal.SIGINT if profile_to is not None else signal.SIGTERM)
        log.close()
        folder.cleanup()


def stop_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the server's own process group (it was started in a new session), then kill it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):  # uvicorn's workers, if any outlived it
        os.killpg(proc.pid, signal.SIGKILL)


def cpu_seconds(pgid: int | None = None) -> float:
    """utime+stime (s) of every process in group ``pgid``; the machine's busy time when None."""
    tick = os.sysconf("SC_CLK_TCK")
    if pgid is None:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        busy = [int(v) for i, v in enumerate(fields) if i not in (3, 4)]  # all but idle, iowait
        return sum(busy) / tick
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()  # fields after "(comm)": state ppid pgrp ...
        if int(rest[2]) == pgid:
            total += int(rest[11]) + int(rest[12])
    return total / tick


class Role:
    """``python script args --result-file F`` in a fresh interpreter (the client side of a
    benchmark). :meth:`wait_for` reads its stdout up to a marker line (how it says it is ready);
    :meth:`result` waits for it to exit and returns F's JSON; leaving the ``with`` kills it if it
    still runs and removes F."""

    def __init__(self, script: Path, args: list[str]) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="grpo-bench-")
        self.result_file = Path(self._folder.name) / "result.json"
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args, "--result-file", str(self.result_file)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def __enter__(self) -> Role:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._folder.cleanup()

    def wait_for(self, marker: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"client {self.args} exited with {self.proc.wait()} before '{marker}'")
            if line.strip() == marker:
                return
            print(line, end="")
        raise RuntimeError(f"client {self.args} did not say '{marker}' within {timeout_s:g} s")

    def result(self, timeout_s: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"client {self.args} still running after {timeout_s:g} s") from None
        for line in self.proc.stdout:
            print(line, end="")
        if self.proc.returncode != 0 or not self.result_file.exists():
            raise RuntimeError(f"client {self.args} exited with {self.proc.returncode}")
        return json.loads(self.result_file.read_text())


def write_json(path: str | Path, value: Any) -> None:
    Path(path).write_text(json.dumps(value))


def fmt_ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class RssSampler:
    """The server process's resident memory (MiB, its children's included) every 0.1 s, with the
    time of each reading, while the ``with`` block runs."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.process, self.samples = psutil.Process(pid), []
        self._gone = psutil.NoSuchProcess
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            rss = 0
            for process in [self.process, *self.process.children(recursive=True)]:
                with contextlib.suppress(self._gone):  # a child that ended between the two calls
                    rss += process.memory_info().rss
            self.samples.append((time.monotonic(), rss / 2**20))

    def between(self, start: float, end: float) -> list[float]:
        return [rss for when, rss in self.samples if start <= when <= end]


class LoopProbe:
    """A thread that times ``GET /healthz`` (an ``async`` route: it runs on the server's event
    loop) every ``interval_s`` on one keep-alive connection. Its round trip is the server loop's
    responsiveness: a stalled loop (GIL held by threadpool work, a long callback) shows as a
    slow probe. ``samples`` are ``(time.time() sent, round trip s)``."""

    def __init__(self, base_url: str, interval_s: float = 0.01) -> None:
        self.host, self.port = base_url.removeprefix("http://").split(":")
        self.interval_s, self.samples = interval_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LoopProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import http.client

        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=10)
        while not self._stop.wait(self.interval_s):
            sent, start = time.time(), time.perf_counter()
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            self.samples.append((sent, time.perf_counter() - start))
        conn.close()
