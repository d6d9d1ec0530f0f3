"""Open files of an API process holding idle downloads.

What is measured
    ``--downloads`` clients (default 150) each start ``GET /v1/jobs/{id}/model`` of a finished
    job whose final model is a ``grpo_core.io.tiny_models`` folder (6 files) with its weights file padded
    (sparse) to ``--weights-mb`` (default 32: more than the sockets buffer, so the server stalls
    inside it), read its first bytes and stop reading. The API process's open file descriptors
    (``/proc/<pid>/fd``) are counted before they start and once all are idle, and how many of
    those are the model's files (or their pinned links under ``<artifacts>/.downloads``).

How
    A real server process (``python -m uvicorn --factory api.main:create_app``, configured by
    ``GRPO_*`` variables) on a SQLite database migrated to head and a private ``redis-server``;
    the job is made through the store and its final model copied into place, as the worker
    leaves it. The server runs the ``api`` package this script imports (its folder is the
    server's working directory), so ``PYTHONPATH`` chooses the code measured.

Usage
    PYTHONPATH=$PWD .venv/bin/python benchmarks/download_open_files.py [--downloads 150]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import api

TOKEN = "bench-download-token-5c0e27a9d14b8f63"
CODE_ROOT = Path(api.__file__).resolve().parents[1]


def open_files(pid: int, under: Path | None = None) -> int:
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            targets.append(os.readlink(fd))
    if under is None:
        return len(targets)
    return sum(t.startswith(str(under)) and not t.endswith(".lock") for t in targets)


def finished_job(database_url: str, artifacts: Path, model: Path, weights_bytes: int) -> int:
    sys.path.append(str(CODE_ROOT / "tests"))
    from specs import tiny_spec

    from api.artifacts.paths import model_dir
    from api.domain.job_spec import JobSpec
    from api.settings import Settings
    from api.store.db import session_scope
    from api.store.jobs import create_job
    from api.store.teams import DEFAULT_TEAM, team_id_by_name

    with session_scope(database_url) as session:
        team_id = team_id_by_name(session, DEFAULT_TEAM)
        job, _ = create_job(session, team_id, JobSpec.model_validate(tiny_spec()))
    folder = model_dir(Settings(database_url=database_url, artifacts_root=artifacts), job.id)
    shutil.copytree(model, folder)
    os.truncate(folder / "model.safetensors", weights_bytes)
    return job.id


@contextlib.contextmanager
def api_server(env: dict[str, str]):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "uvicorn", "--factory", "api.main:create_app", "--port", str(port),
               "--log-level", "warning"]
    proc = subprocess.Popen(command, cwd=CODE_ROOT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--downloads", type=int, default=150)
    parser.add_argument("--weights-mb", type=int, default=32)
    args = parser.parse_args()
    from api.cli.dev import start_redis, stop_process
    from api.store.migrate import upgrade_to_head
    from grpo_core.io.tiny_models import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="grpo-bench-downloads-") as folder:
        root = Path(folder)
        database_url = f"sqlite:///{root}/grpo.db"
        upgrade_to_head(database_url)
        artifacts = root / "artifacts"
        model = build_tiny_model(root / "tiny", family="llama")
        job_id = finished_job(database_url, artifacts, model, args.weights_mb * 1024 * 1024)
        redis_url, redis_process = start_redis()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
        env.update(GRPO_DATABASE_URL=database_url, GRPO_REDIS_URL=redis_url, GRPO_API_TOKEN=TOKEN,
                   GRPO_ARTIFACTS_ROOT=str(artifacts))
        try:
            with api_server(env) as (base, pid), contextlib.ExitStack() as stack:
                client = stack.enter_context(httpx.Client(base_url=base, timeout=30, trust_env=False,
                                                          headers={"Authorization": f"Bearer {TOKEN}"},
                                                          limits=httpx.Limits(max_connections=None)))
                before = open_files(pid)
                readers = []  # kept: an abandoned iterator closes its connection
                for _ in range(args.downloads):
                    response = stack.enter_context(client.stream("GET", f"/v1/jobs/{job_id}/model"))
                    readers.append(response.iter_bytes(4096))
                    next(readers[-1])
                time.sleep(2.0)  # the server streams on until each socket's buffers are full
                idle, model_files = open_files(pid), open_files(pid, artifacts.resolve())
            print(f"code: {CODE_ROOT}")
            print(f"{args.downloads} idle downloads: open files {before} -> {idle} "
                  f"({model_files} of them the model's files)")
        finally:
            stop_process(redis_process)


if __name__ == "__main__":
    main()
