"""Real components for the tests of the worker, the scheduler and faults (``tests/worker``,
``tests/chaos``): a migrated Postgres database and a private ``redis-server`` per module, real
Celery worker processes, a real scheduler process.

Those folders' conftests import these fixtures; tests reach them as fixtures (``job_of``,
``wait_for``, ...; ``tiny_spec`` comes from ``tests/conftest.py``).

Each module gets its own Redis server, so heartbeats, the leader lock and queues never leak
between modules (or into a Redis others use); each test uses its own pool name, so its queue
and capacity are its own within the module.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from service_db import fresh_postgres_url, migrated
from waiting import wait_until

from api.cli.dev import free_port, start_redis, stop_process
from api.domain.job_spec import JobSpec
from api.domain.lifecycle import TERMINAL_STATUSES, Transition
from api.settings import Settings, get_settings
from api.store.attempts import claim
from api.store.db import session_scope
from api.store.jobs import create_job, get_job, transition
from api.store.tables import utcnow
from api.store.teams import DEFAULT_TEAM, team_id_by_name

REPO = Path(__file__).resolve().parents[1]
# What a conftest takes with ``from service_stack import *``: every fixture and the report hook.
__all__ = [
    "database_url",
    "finished",
    "job_of",
    "pool",
    "processes",
    "pytest_runtest_makereport",
    "redis_url",
    "roots",
    "run_in_process",
    "service_env",
    "settings",
    "submit",
    "task_settings",
    "team_id",
    "wait_for",
    "wait_worker_ready",
]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    url, process = start_redis()
    try:
        yield url
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with fresh_postgres_url("grpo_w") as url, migrated(url):
        yield url


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("service")
    paths = {name: base / name for name in ("models", "data", "artifacts", "logs")}
    for path in paths.values():
        path.mkdir()
    # A copy, not a link: `path:` sources must resolve inside the root, links included.
    shutil.copytree(tiny_model_dir, paths["models"] / "tiny")
    return paths


@pytest.fixture(scope="module")
def service_env(database_url: str, redis_url: str, roots: dict[str, Path]) -> dict[str, str]:
    """What every service process of this module reads (one thread each: 2 CPU cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(GRPO_DATABASE_URL=database_url, GRPO_REDIS_URL=redis_url,
               GRPO_MODELS_ROOT=str(roots["models"]), GRPO_DATA_ROOT=str(roots["data"]),
               GRPO_ARTIFACTS_ROOT=str(roots["artifacts"]), GRPO_HEARTBEAT_SECONDS="0.5",
               GRPO_SCHEDULER_INTERVAL_SECONDS="0.2", GRPO_REQUEUE_BACKOFF_SECONDS="0.2",
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    return env


def settings_of(env: dict[str, str]) -> Settings:
    fields = {k.removeprefix("GRPO_").lower(): v for k, v in env.items() if k.startswith("GRPO_")}
    return Settings(**fields)


@pytest.fixture(scope="module")
def settings(service_env: dict[str, str]) -> Settings:
    return settings_of(service_env)


@pytest.fixture
def pool() -> str:
    return f"p{uuid.uuid4().hex[:8]}"


class Processes:
    """Service processes of one test, each in its own process group, logs kept for failures."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, args: list[str], name: str, **env: str) -> subprocess.Popen:
        log = self.log_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
        with log.open("w") as handle:
            process = subprocess.Popen([sys.executable, *args], cwd=REPO, env={**self.env, **env},
                                       stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        self.started.append((process, log))
        return process

    def worker(self, pool: str, **env: str) -> subprocess.Popen:
        # No -Q: a worker consumes its own queue (RedisKeys.worker_queue). No -c: it runs
        # one child per device it owns (GRPO_WORKER_GPUS CPU slots here).
        return self.start(["-m", "celery", "-A", "worker.celery_app", "worker",
                           "--pool", "prefork", "--without-gossip", "--without-mingle",
                           "--loglevel", "INFO", "-n", f"{pool}-{uuid.uuid4().hex[:4]}@%h"],
                          "worker", GRPO_POOL=pool, **env)

    def scheduler(self, **env: str) -> subprocess.Popen:
        return self.start(["-m", "api.cli.main", "scheduler"], "scheduler", **env)

    def api(self, token: str, **env: str) -> str:
        """``grpo api`` with ``token`` as the operator's key (and ``env`` over the module's), on a
        free port; its URL once ready."""
        port = free_port()
        process = self.start(["-m", "api.cli.main", "api", "--port", str(port)], "api", GRPO_API_TOKEN=token,
                             **env)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert process.poll() is None, f"grpo api exited with {process.returncode}:\n{self.logs()}"
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 60, "grpo api to answer", interval=0.2, details=self.logs)
        return url

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for _, log in self.started)

    def stop_all(self) -> None:
        for process, _ in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process, _ in self.started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


@pytest.fixture
def processes(service_env: dict[str, str], roots: dict[str, Path], request) -> Iterator[Processes]:
    procs = Processes(service_env, roots["logs"])
    yield procs
    procs.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(procs.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="module")
def team_id(database_url: str) -> int:
    with session_scope(database_url) as session:
        found = team_id_by_name(session, DEFAULT_TEAM)
    assert found is not None, "the initial migration seeds the default team"
    return found


@pytest.fixture
def submit(database_url: str, team_id: int) -> Callable[[dict[str, Any]], int]:
    """Queue a job straight through the store (these tests are about what happens after)."""
    def submit_(spec: dict[str, Any]) -> int:
        with session_scope(database_url) as session:
            job, _ = create_job(session, team_id, JobSpec.model_validate(spec))
        return job.id

    return submit_


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """``wait_for(predicate, timeout, what, processes=None, interval=0.1)``: the predicate's
    first truthy value, or an AssertionError with the service logs."""
    def wait(predicate: Callable[[], Any], timeout: float, what: str, procs: Processes | None = None,
             interval: float = 0.1) -> Any:
        return wait_until(predicate, timeout, what, interval=interval,
                          details=procs.logs if procs is not None else None)

    return wait


@pytest.fixture
def job_of(database_url: str) -> Callable[[int], Any]:
    """The job as the store reads it now."""
    def read(job_id: int):
        with session_scope(database_url) as session:
            return get_job(session, job_id)

    return read


@pytest.fixture
def finished(job_of: Callable[[int], Any]) -> Callable[[int], Any]:
    """``finished(job_id)``: the job once it is terminal, else None (a predicate to wait on)."""
    def check(job_id: int):
        job = job_of(job_id)
        return job if job.status in TERMINAL_STATUSES else None

    return check


@pytest.fixture
def wait_worker_ready(redis_url: str, settings: Settings) -> Callable[..., list[str]]:
    """``wait(pool, procs, count=1)``: the ids of the pool's live workers once ``count`` advertise."""
    from api.store.bus import live_workers

    client = redis.Redis.from_url(redis_url)

    def wait(pool: str, procs: Processes, count: int = 1) -> list[str]:
        def ready() -> list[str]:
            ids = sorted(w.worker_id for w in live_workers(client, settings.redis_keys) if w.pool == pool)
            return ids if len(ids) >= count else []

        return wait_until(ready, 60, f"{count} worker(s) of pool {pool} to advertise", interval=0.1,
                          details=procs.logs)

    return wait


@pytest.fixture
def run_in_process(task_settings, database_url: str, job_of: Callable[[int], Any], tmp_path: Path):
    """``run(job_id)``: dispatch, claim and run one attempt of the job in this process (the job
    process's body and the supervisor's recording of its outcome, no process started); its row
    afterwards."""
    from worker.attempt import run_attempt
    from worker.attempt_files import AttemptFiles
    from worker.runner import record_outcome

    worker_id = "in-process-worker"

    def run(job_id: int):
        with session_scope(database_url) as session:
            assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
            job = claim(session, job_id, worker_id)
        files = tmp_path / f"attempt-{job_id}-{job.attempt}"  # a job retried runs again here
        files.mkdir()
        outcome = run_attempt(job, task_settings, worker_id, AttemptFiles(files))
        assert hasattr(outcome, "status"), f"the attempt ended in a fault, not an outcome: {outcome}"
        record_outcome(job, worker_id, task_settings, None, outcome)
        return job_of(job_id)

    return run


@pytest.fixture
def task_settings(monkeypatch, service_env):
    """The task reads the settings from the environment, as in a worker's child."""
    for key, value in service_env.items():
        if key.startswith("GRPO_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("GRPO_WORKER_ID", "late-worker")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()
