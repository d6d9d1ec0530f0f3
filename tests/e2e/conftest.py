"""The whole service as a user runs it: ``grpo dev`` (API, scheduler, one Celery worker, and a
private ``redis-server`` it starts itself) driven over real HTTP and WebSocket connections.

The stack runs once per database: on the embedded default (a SQLite file in the working
directory, the URL left unset) and on a fresh Postgres database. Helpers reach the tests as
fixtures (``stack``; ``tiny_spec`` comes from ``tests/conftest.py``), never by importing this file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from service_db import fresh_postgres_url
from waiting import wait_until

from api.cli.client import ApiClient
from api.cli.dev import free_port
from api.domain.lifecycle import TERMINAL_STATUSES

TOKEN = "e2e-secret-operator-token-0123456789"


@dataclass
class Stack:
    url: str
    api: ApiClient
    token: str
    root: Path
    log: Path

    def wait_for_job(self, job_id: int, predicate, timeout: float = 120, interval: float = 0.05
                     ) -> dict[str, Any]:
        seen: list[dict[str, Any]] = []

        def reached() -> dict[str, Any] | None:
            seen[:] = [self.api.job(job_id)]
            return seen[0] if predicate(seen[0]) else None

        return wait_until(reached, timeout, f"job {job_id} to get there", interval=interval,
                          details=lambda: f"last read: {seen}\n{self.logs()}")

    def logs(self) -> str:
        """The ends of `grpo dev`'s terminal and of its worker's log (artifacts/logs/)."""
        paths = (self.log, self.root / "artifacts" / "logs" / "worker.log")
        return "\n".join(f"== {path.name}\n{path.read_text()[-4000:]}" for path in paths if path.exists())

    def wait_until_done(self, job_id: int) -> dict[str, Any]:
        return self.wait_for_job(job_id, lambda job: job["status"] in TERMINAL_STATUSES)


def _database_env(backend: str) -> Iterator[dict[str, str]]:
    if backend == "sqlite":
        yield {}  # the embedded default: sqlite:///./grpo.db in the working directory
        return
    with fresh_postgres_url("grpo_e2e") as url:
        yield {"GRPO_DATABASE_URL": url}


def _stop(process: subprocess.Popen) -> None:
    """``grpo dev`` stops its children on SIGTERM; anything it leaves behind is a bug, but is
    still killed here so a failing run cannot leak processes."""
    try:
        family = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for leftover in family:
        if leftover.is_running():
            leftover.kill()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp(f"dev-{request.param}")
    for name in ("models", "data", "artifacts"):
        (root / name).mkdir()
    shutil.copytree(tiny_model_dir, root / "models" / "tiny")  # `path:` may not link out of the root
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(GRPO_MODELS_ROOT=str(root / "models"), GRPO_DATA_ROOT=str(root / "data"),
               GRPO_ARTIFACTS_ROOT=str(root / "artifacts"), GRPO_API_TOKEN=TOKEN,
               # Nothing listens there, so `grpo dev` starts its own redis-server.
               GRPO_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
               GRPO_HEARTBEAT_SECONDS="0.5", GRPO_SCHEDULER_INTERVAL_SECONDS="0.2",
               GRPO_REQUEUE_BACKOFF_SECONDS="0.2",
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    for database in _database_env(request.param):
        log = root / "dev.log"
        with log.open("w") as handle:
            command = [sys.executable, "-m", "api.cli.main", "dev", "--port", str(port)]
            process = subprocess.Popen(command, cwd=root, env={**env, **database}, stdout=handle,
                                       stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, process, log)
            yield Stack(url, ApiClient(url, TOKEN), TOKEN, root, log)
        finally:
            _stop(process)


def _wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    def ready() -> bool:
        assert process.poll() is None, f"grpo dev exited with {process.returncode}:\n{log.read_text()}"
        try:  # jobs wait queued until the worker's heartbeat appears, so the API is enough
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, timeout, "grpo dev to come up", interval=0.2, details=log.read_text)


# ==== The dashboard in a browser (tests/e2e/test_dashboard.py) ====
# One `grpo dev` stack on the embedded SQLite default, with team keys required (GRPO_AUTH=keys):
# teams `alpha` and `beta` and their keys are made with `grpo admin` once the stack has migrated
# its database. Headless Chromium is Debian's (/usr/bin/chromium), driven by Playwright; its own
# browser download is never used.

CHROMIUM = Path("/usr/bin/chromium")
DASHBOARD_TEAMS = ("alpha", "beta")


@dataclass
class KeyedStack:
    url: str
    root: Path
    log: Path
    env: dict[str, str]
    keys: dict[str, str]  # team -> its API key

    def client(self, team: str) -> ApiClient:
        return ApiClient(self.url, self.keys[team])

    def admin(self, *args: str) -> str:
        """``grpo admin ARGS`` on the stack's database; its stdout."""
        done = subprocess.run([sys.executable, "-m", "api.cli.main", "admin", *args], cwd=self.root,
                              env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"grpo admin {' '.join(args)}: {done.stderr}"
        return done.stdout.strip()


@pytest.fixture(scope="module")
def keyed_stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[KeyedStack]:
    root = tmp_path_factory.mktemp("dev-keys")
    for name in ("data", "artifacts"):
        (root / name).mkdir()
    shutil.copytree(tiny_model_dir, root / "models" / "tiny")
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("GRPO_")}
    env.update(GRPO_AUTH="keys", GRPO_DATABASE_URL=f"sqlite:///{root / 'grpo.db'}",
               GRPO_MODELS_ROOT=str(root / "models"), GRPO_DATA_ROOT=str(root / "data"),
               GRPO_ARTIFACTS_ROOT=str(root / "artifacts"), GRPO_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
               GRPO_HEARTBEAT_SECONDS="0.5", GRPO_SCHEDULER_INTERVAL_SECONDS="0.2",
               GRPO_REQUEUE_BACKOFF_SECONDS="0.2",
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    log = root / "dev.log"
    with log.open("w") as handle:
        process = subprocess.Popen([sys.executable, "-m", "api.cli.main", "dev", "--port", str(port)],
                                   cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log)  # `grpo dev` has migrated the database: teams can be made
        stack = KeyedStack(url, root, log, env, keys={})
        for team in DASHBOARD_TEAMS:
            stack.admin("create-team", team)
            stack.keys[team] = stack.admin("create-key", team)
        yield stack
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless Chromium. Where it is not installed the tests using it skip with the reason,
    except under `.ci/run` (which installs it and sets GRPO_CI=1): there a missing browser is a
    failure, never a quiet skip."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: apt-get install -y chromium"
        if os.environ.get("GRPO_CI") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory):
    """``shoot(page, name)`` saves a full-page PNG under the test run's temp folder and prints its
    path (``pytest -rA`` or ``-s`` shows it)."""
    folder = tmp_path_factory.mktemp("dashboard-screenshots")

    def shoot(page: Any, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path

    return shoot


@pytest.fixture
def browser_page(chromium: Any, keyed_stack: KeyedStack) -> Iterator[Any]:
    """A fresh browser context (empty sessionStorage) on the dashboard. Any script error in the page,
    or anything it logs as an error, fails the test; an API call answered 4xx (a test's wrong key or
    another team's job) is the page's to show, not an error."""
    context = chromium.new_context(base_url=keyed_stack.url, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda message: problems.append(f"console: {message.text}")
            if message.type == "error" and not _refused_api_call(message) else None)
    page.set_default_timeout(20_000)
    yield page
    context.close()
    assert not problems, problems


def _refused_api_call(message: Any) -> bool:
    return "Failed to load resource" in message.text and "/v1/" in message.location.get("url", "")
