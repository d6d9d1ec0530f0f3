"""``grpo dev`` killed with SIGKILL (no handler runs, nothing is stopped in order): every process
it started, its own ``redis-server`` and the worker's pool process included, is gone within
seconds, so no stale scheduler or worker goes on taking jobs from its database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import psutil
from waiting import process_gone, wait_until

from api.cli.dev import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The API, the scheduler, the worker's main and pool processes, and the redis-server it started.
EXPECTED_DESCENDANTS = 5


def environment_of(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except psutil.NoSuchProcess:  # a probe that ended since the children were listed
        return {}


def test_a_sigkilled_grpo_dev_takes_all_its_processes_with_it(tmp_path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(GRPO_DATABASE_URL=f"sqlite:///{tmp_path / 'grpo.db'}", GRPO_ARTIFACTS_ROOT=str(tmp_path / "a"),
               GRPO_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",  # nothing there: it starts its own
               GRPO_HEARTBEAT_SECONDS="0.5", GRPO_SCHEDULER_INTERVAL_SECONDS="0.2", OMP_NUM_THREADS="1",
               PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    log = tmp_path / "dev.log"
    with log.open("w") as handle:
        dev = subprocess.Popen([sys.executable, "-m", "api.cli.main", "dev", "--port", str(port)],
                               cwd=tmp_path, env=env, stdout=handle, stderr=subprocess.STDOUT)
    family: list[psutil.Process] = []
    try:
        def all_up() -> list[psutil.Process]:
            assert dev.poll() is None, log.read_text()
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).json()
            except httpx.TransportError:
                return []
            children = psutil.Process(dev.pid).children(recursive=True)
            up = ready.get("checks", {}).get("scheduler") == "ok" and len(children) >= EXPECTED_DESCENDANTS
            return children if up else []

        family = wait_until(all_up, 90, "grpo dev's API, scheduler, worker and redis", interval=0.2,
                            details=log.read_text)
        # The service's own processes carry its GRPO_* settings; a short-lived probe a role runs
        # with a clean environment (the worker's sandbox check under bubblewrap) and redis do not.
        roles = [env for env in map(environment_of, family) if "GRPO_DATABASE_URL" in env]
        namespaces = {env.get("GRPO_NAMESPACE") for env in roles}
        assert len(roles) >= EXPECTED_DESCENDANTS - 1, roles  # the API, scheduler, worker and its pool
        assert len(namespaces) == 1 and namespaces.pop().startswith("dev-")  # its own, shared by all

        dev.send_signal(signal.SIGKILL)
        dev.wait()
        def survivors() -> str:
            return "\n".join(f"{p.pid} {p.cmdline()}" for p in family if not process_gone(p.pid))

        wait_until(lambda: all(process_gone(p.pid) for p in family), 10, "every child of grpo dev to end",
                   details=survivors)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        for leftover in family:  # only if the test failed: a failing run must not leak processes
            try:
                leftover.kill()
            except psutil.NoSuchProcess:
                pass
