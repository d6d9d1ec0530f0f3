"""``grpo dev``: the whole service on one machine with one command.

API (uvicorn), scheduler and one worker run as child processes of this one, each in its own
process group so Ctrl-C reaches only us and we stop them in order. Defaults are the embedded
ones: a SQLite file in the working directory and Redis at the configured URL, or, when none
answers, a private ``redis-server`` from PATH on a free port (state in memory only).

Each run has a namespace of its own (``GRPO_NAMESPACE``), so it shares a Redis with another stack
or an earlier run without seeing their workers or waiting on their scheduler's lock. Every child
dies with this process however it ends, a SIGKILL included (``die_with_parent``): a stale
scheduler or worker left behind would go on taking jobs from the same database.

The terminal is for people: where the API and the logs are, then the jobs' progress (their
stream with ``--submit``, else a line per change, ``api.cli.dev_progress``). What the services
print (migrations, Celery's banner, every request) goes to ``artifacts/logs/ROLE.log``, the
migrations to ``dev.log``; a role that dies has its log's last lines shown.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, MutableMapping
from functools import partial
from pathlib import Path

import httpx
import redis
from cryptography.fernet import Fernet

from api.settings import Settings
from grpo_core.run.lifetime import die_with_parent

DEV_DATABASE_URL = "sqlite:///./grpo.db"
ROLES = ("api", "scheduler", "worker")
LOG_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"
TAIL_LINES = 20  # of a dead role's log, shown on the terminal
PROGRESS_POLL_SECONDS = 1.0


class DevError(Exception):
    """The stack cannot start; the message says what to do. ``code`` 2 is the user's to fix."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def child_of_this_process() -> Callable[[], None]:
    """``preexec_fn`` of every child: the kernel kills it when this process dies."""
    return partial(die_with_parent, os.getpid())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis(timeout: float = 10.0, port: int | None = None) -> tuple[str, subprocess.Popen]:
    """A throwaway ``redis-server`` (no persistence) on ``port``, or a free local port."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise DevError("no Redis answers at GRPO_REDIS_URL and no redis-server is on PATH; "
                       "install Redis (apt install redis-server) or set GRPO_REDIS_URL", code=2)
    port = port or free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], stdout=subprocess.DEVNULL, start_new_session=True,
                               preexec_fn=child_of_this_process())
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + timeout
    while not redis_answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise DevError(f"redis-server on port {port} did not start")
        time.sleep(0.1)
    return url, process


def dev_environment(base: dict[str, str], port: int | None, spec: Path | None,
                    models_root: Path | None, data_root: Path | None) -> dict[str, str]:
    """Children read everything from ``GRPO_*`` variables. ``path:`` sources resolve under the
    roots; with ``--submit`` they default to the spec's folder, as for ``grpo train``."""
    env = dict(base)
    env.setdefault("GRPO_DATABASE_URL", DEV_DATABASE_URL)
    env["GRPO_NAMESPACE"] = f"dev-{uuid.uuid4().hex[:8]}"
    # One person on their own machine, on 127.0.0.1: no keys to create first (GRPO_AUTH=keys overrides).
    env.setdefault("GRPO_AUTH", "none")
    if port is not None:
        env["GRPO_API_PORT"] = str(port)
    folder = spec.resolve().parent if spec is not None else None
    for name, flag, fallback in (("GRPO_MODELS_ROOT", models_root, "models"),
                                 ("GRPO_DATA_ROOT", data_root, "data")):
        chosen = flag or (Path(env[name]) if env.get(name) else folder) or Path(fallback)
        env[name] = str(chosen.resolve())
    env.setdefault("GRPO_ARTIFACTS_ROOT", str(Path("artifacts").resolve()))
    # The worker's copies of uploaded files beside the rest of what a dev run writes, not in the
    # folder it was started from.
    env.setdefault("GRPO_WORKER_CACHE_DIR", str(Path(env["GRPO_ARTIFACTS_ROOT"]) / "worker-cache"))
    if not env.get("GRPO_SECRET_KEY"):
        env["GRPO_SECRET_KEY"] = dev_secret_key(Path(env["GRPO_ARTIFACTS_ROOT"]))
    return env


def dev_secret_key(artifacts_root: Path) -> str:
    """The key webhook secrets are sealed under (``GRPO_SECRET_KEY``), made once and kept beside
    the artifacts, readable by its owner only: webhooks work under ``grpo dev`` with nothing to set,
    and the next run of the same folder still opens the secrets the last one sealed."""
    path = artifacts_root / "secret.key"
    if not path.exists():
        artifacts_root.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(Fernet.generate_key().decode())
    return path.read_text().strip()


def start_role(role: str, env: MutableMapping[str, str], log_dir: Path) -> subprocess.Popen:
    """The role's output (Celery's banner, every access line) goes to ``log_dir/ROLE.log``."""
    command = [sys.executable, "-m", "api.cli.main", role]
    with (log_dir / f"{role}.log").open("ab") as log:
        return subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=child_of_this_process(),
                                stdout=log, stderr=subprocess.STDOUT)


def show_log_tail(log_dir: Path, role: str, lines: int = TAIL_LINES) -> None:
    """A dead role's last words, which its log has and the terminal no longer shows."""
    try:
        text = (log_dir / f"{role}.log").read_text(errors="replace")
    except OSError:
        return
    print(f"grpo dev: {role}.log ends:", *(f"  {line}" for line in text.splitlines()[-lines:]),
          sep="\n", file=sys.stderr, flush=True)


def log_this_process_to(log_dir: Path) -> None:
    """This process's own log lines (the migrations', which Alembic would print on stderr when
    nothing is configured) go to ``dev.log``."""
    logging.basicConfig(filename=log_dir / "dev.log", level=logging.INFO, format=LOG_FORMAT, force=True)


def stop_process(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the group (a worker finishes its warm shutdown), then SIGKILL what is left: an
    interrupted job keeps its checkpoint and resumes once its lease expires."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(process, signal.SIGKILL)
    process.wait()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def raise_if_a_role_exited(children: dict[str, subprocess.Popen]) -> None:
    """A role that died while start-up waits on it: say which, rather than time out."""
    for role, process in children.items():
        if process.poll() is not None:
            raise DevError(f"{role} exited with code {process.returncode} during start-up")


def wait_for_api(url: str, children: dict[str, subprocess.Popen], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raise_if_a_role_exited(children)
        try:
            httpx.get(f"{url}/healthz", timeout=2)  # any answer: uvicorn is serving
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise DevError(f"the API did not answer at {url} within {timeout:.0f}s")


def wait_for_worker(url: str, children: dict[str, subprocess.Popen], timeout: float = 120.0) -> None:
    """Until the worker's first heartbeat (after its capability checks) is seen: a spec submitted
    before it would be refused for a capability, such as the sandbox, that no live worker offers
    yet. Only where the cluster view is readable without a key (``GRPO_AUTH=none``, dev's default)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raise_if_a_role_exited(children)
        try:
            response = httpx.get(f"{url}/v1/cluster", timeout=5)
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code in (401, 403):
            return  # keys are on: the submit will say what it says
        if response is not None and response.is_success and any(
                pool.get("workers") for pool in response.json().get("pools", [])):
            return
        time.sleep(0.2)
    raise DevError(f"the worker sent no heartbeat within {timeout:.0f}s")


class Stack:
    """Redis (when we started it) and the three roles; ``close`` stops them in reverse order."""

    def __init__(self) -> None:
        self.redis: subprocess.Popen | None = None
        self.children: dict[str, subprocess.Popen] = {}

    def start(self, env: MutableMapping[str, str], settings: Settings, log_dir: Path) -> str:
        """Migrate, make sure Redis answers (recording its URL in ``env``), start the roles and
        return the API's URL once it serves."""
        from api.store.migrate import upgrade_to_head

        upgrade_to_head(env["GRPO_DATABASE_URL"])
        if not redis_answers(env.get("GRPO_REDIS_URL", settings.redis_url)):
            env["GRPO_REDIS_URL"], self.redis = start_redis()
        env.setdefault("GRPO_REDIS_URL", settings.redis_url)
        for role in ROLES:
            self.children[role] = start_role(role, env, log_dir)
        url = f"http://{settings.api_host}:{env.get('GRPO_API_PORT', settings.api_port)}"
        wait_for_api(url, self.children)
        return url

    def exited(self) -> str | None:
        return next((role for role, p in self.children.items() if p.poll() is not None), None)

    def close(self) -> None:
        for role in reversed(list(self.children)):
            stop_process(self.children[role])
        if self.redis is not None:
            stop_process(self.redis)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_dev(port: int | None, spec: Path | None, models_root: Path | None, data_root: Path | None,
            watch: Callable[[str], int] | None = None) -> int:
    """Bring the stack up; with ``watch`` (``grpo dev --submit``) run it against the API and stop
    when it returns, else serve until Ctrl-C/SIGTERM or until a role dies."""
    os.environ.update(dev_environment(dict(os.environ), port, spec, models_root, data_root))
    settings = Settings()
    signal.signal(signal.SIGTERM, _interrupt)
    stack = Stack()
    log_dir = Path(os.environ["GRPO_ARTIFACTS_ROOT"]) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_this_process_to(log_dir)
    try:
        url = stack.start(os.environ, settings, log_dir)
        say(*summary(url, os.environ, log_dir, stack.redis is not None, watching=watch is not None))
        if watch is not None:
            wait_for_worker(url, stack.children)
            return watch(url)
        role = serve(stack, os.environ["GRPO_DATABASE_URL"])
        say(f"{role} exited with code {stack.children[role].returncode}; stopping", err=True)
        show_log_tail(log_dir, role)
        return 1
    except DevError as exc:
        say(f"{exc} (logs in {log_dir})", err=True)
        if (role := stack.exited()) is not None:
            show_log_tail(log_dir, role)
        return exc.code
    except KeyboardInterrupt:
        say("stopping", err=True)
        return 0 if watch is None else 130  # serving ends by Ctrl-C; a watched job did not end
    finally:
        stack.close()


def summary(url: str, env: MutableMapping[str, str], log_dir: Path, own_redis: bool, watching: bool
            ) -> list[str]:
    """Where everything is, in a few lines: the services' own output is in their logs."""
    redis_url = env["GRPO_REDIS_URL"] + (" (a redis-server of its own)" if own_redis else "")
    follow = "" if watching else "; jobs' progress shows here (grpo submit SPEC --watch follows one)"
    return [f"API and dashboard at {url}/  (auth: {env.get('GRPO_AUTH', 'keys')})",
            f"logs in {log_dir}/: {', '.join(f'{role}.log' for role in ROLES)}; dev.log (migrations)",
            f"database {env['GRPO_DATABASE_URL']}, Redis {redis_url}",
            f"models {env['GRPO_MODELS_ROOT']}, data {env['GRPO_DATA_ROOT']}, "
            f"artifacts {env['GRPO_ARTIFACTS_ROOT']}",
            f"Ctrl-C stops it{follow}"]


def serve(stack: Stack, database_url: str) -> str:
    """Print the jobs' progress until a role exits; that role."""
    from sqlalchemy.exc import SQLAlchemyError

    from api.cli.dev_progress import JobTicker, read_jobs

    ticker = JobTicker()
    while (role := stack.exited()) is None:
        try:
            say(*ticker.lines(read_jobs(database_url), time.monotonic()), prefix=False)
        except SQLAlchemyError as exc:  # only the progress lines stop; the stack goes on serving
            logging.getLogger(__name__).warning("could not read the jobs: %s", exc)
        time.sleep(PROGRESS_POLL_SECONDS)
    return role


def say(*lines: str, err: bool = False, prefix: bool = True) -> None:
    for line in lines:
        print(f"grpo dev: {line}" if prefix else line, file=sys.stderr if err else sys.stdout, flush=True)
