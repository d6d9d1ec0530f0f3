"""The ``grpo`` command line around the service: the core's commands still work through it,
bad input exits 2 with a message, and neither the CLI nor the worker's main process loads torch
(the web process starts fast; CUDA is only ever initialised in a job's child)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from api.cli.dev import free_port

REPO = Path(__file__).resolve().parents[2]


def grpo(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_cli_and_the_worker_main_process_import_without_torch():
    code = ("import sys, api.cli.main, api.cli.dev, api.cli.client, api.scheduling.scheduler, "
            "worker.celery_app, worker.tasks; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GRPO_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_every_service_command_is_registered_beside_the_core_ones():
    done = grpo("--help")
    for command in ("train", "tiny-model", "api", "scheduler", "worker", "dev", "submit"):
        assert command in done.stdout


def test_core_commands_keep_their_exit_codes(tmp_path: Path):
    missing = grpo("train", str(tmp_path / "nope.yaml"), "--output-dir", str(tmp_path / "out"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_submit_rejects_a_bad_spec_locally_with_exit_2(tmp_path: Path, tiny_spec):
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec(grpo={"num_generations": 1})))
    done = grpo("submit", str(spec), "--api-url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "grpo.num_generations" in done.stderr


def test_submit_says_when_the_api_cannot_be_reached(tmp_path: Path, tiny_spec):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec()))
    done = grpo("submit", str(spec), "--api-url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1 and "cannot reach the API" in done.stderr


def test_dev_explains_when_there_is_no_redis_at_all(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(PATH=str(tmp_path), GRPO_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")  # no redis-server
    done = grpo("dev", "--port", str(free_port()), cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert "redis-server" in done.stderr and "GRPO_REDIS_URL" in done.stderr
    assert (tmp_path / "grpo.db").is_file()  # the embedded default, migrated before Redis was looked for
