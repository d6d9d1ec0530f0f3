"""The ``grpo`` command line around the service: the core's commands still work through it,
bad input exits 2 with a message, neither the CLI nor the worker's main process loads torch
(the web process starts fast; CUDA is only ever initialised in a job's child), and ``grpo dev``'s
terminal says where things are and how the jobs go while the services' output goes to logs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from sandbox_guard import needs_sandbox
from waiting import wait_until

from api.cli.client import ApiClient
from api.cli.dev import free_port

REPO = Path(__file__).resolve().parents[2]


def grpo(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


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


# What the services print, which belongs in artifacts/logs/, never on `grpo dev`'s terminal:
# migrations, Celery's banner and its task lines, uvicorn's start-up and access lines.
SERVICE_NOISE = ("alembic", "Running upgrade", "[tasks]", "celery@", "Task grpo.run_job", "Uvicorn running",
                 "HTTP/1.1")


def dev_folder(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, dict[str, str]]:
    """A working folder for `grpo dev` (the tiny model under models/) and its environment."""
    root = tmp_path / "dev"
    shutil.copytree(tiny_model_dir, root / "models" / "tiny")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env.update(GRPO_MODELS_ROOT=str(root / "models"), GRPO_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
               GRPO_HEARTBEAT_SECONDS="0.5", GRPO_SCHEDULER_INTERVAL_SECONDS="0.2", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    return root, env


def assert_the_logs_have_what_the_terminal_has_not(terminal: str, logs: Path) -> None:
    assert f"grpo dev: logs in {logs}/" in terminal, terminal
    assert [noise for noise in SERVICE_NOISE if noise in terminal] == [], terminal
    assert "Running upgrade" in (logs / "dev.log").read_text()
    assert "HTTP/1.1" in (logs / "api.log").read_text()
    assert "grpo.run_job" in (logs / "worker.log").read_text()  # Celery's banner lists the task


def test_grpo_dev_shows_where_things_are_and_each_jobs_progress_not_the_services_output(
        tmp_path: Path, tiny_model_dir: Path, tiny_spec) -> None:
    root, env = dev_folder(tmp_path, tiny_model_dir)
    port, terminal = free_port(), root / "terminal.txt"
    with terminal.open("w") as out:
        dev = subprocess.Popen([sys.executable, "-m", "api.cli.main", "dev", "--port", str(port)], cwd=root,
                               env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: "Ctrl-C stops it" in terminal.read_text(), 90, "grpo dev to come up",
                   interval=0.2, details=terminal.read_text)
        job = ApiClient(url).submit(tiny_spec("shown", max_steps=2))  # GRPO_AUTH=none: no key
        wait_until(lambda: f"job {job['id']} shown: succeeded at step 2" in terminal.read_text(), 180,
                   "the job's end on grpo dev's terminal", interval=0.2, details=terminal.read_text)
        httpx.get(f"{url}/v1/jobs")  # one more access line, for api.log only
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.wait(timeout=60)
    text = terminal.read_text()
    assert f"grpo dev: API and dashboard at {url}/" in text
    assert f"job {job['id']} shown: running" in text
    assert_the_logs_have_what_the_terminal_has_not(text, root / "artifacts" / "logs")


def test_grpo_dev_submit_shows_the_jobs_steps_and_none_of_the_migrations(tmp_path: Path, tiny_model_dir: Path,
                                                                         tiny_spec) -> None:
    root, env = dev_folder(tmp_path, tiny_model_dir)
    spec = root / "job.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec("submitted", max_steps=2)))
    done = grpo("dev", "--port", str(free_port()), "--submit", str(spec), cwd=root, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["1/2", "2/2"] and "succeeded at step 2" in done.stdout.splitlines()[-1]
    assert_the_logs_have_what_the_terminal_has_not(done.stdout + done.stderr, root / "artifacts" / "logs")


def step_rewards(terminal: str) -> list[float]:
    """The reward of each ``step N/M  reward R  kl ...`` line `grpo dev --submit` printed, in order."""
    rewards = []
    for line in terminal.splitlines():
        words = line.split()
        if line.startswith("step ") and words[2] == "reward":
            rewards.append(float(words[3]))
    return rewards


@pytest.mark.slow
@needs_sandbox
def test_a_python_reward_job_learns_through_grpo_dev(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The example's grader, run by the service's worker in the sandbox, is what the model learns
    from: on the tiny model its reward climbs from ~0.1 to ~0.9 within about 30 steps."""
    root, env = dev_folder(tmp_path, tiny_model_dir)
    (root / "models" / "tiny-model").symlink_to("tiny")  # the example's `path:tiny-model`, in the models root
    spec = yaml.safe_load((REPO / "examples" / "python_grader.yaml").read_text())
    spec["grpo"]["max_steps"] = 30
    spec["checkpoint_every"] = 30  # one checkpoint: the steps, not the saving, are what this measures
    (root / "python_grader.yaml").write_text(yaml.safe_dump(spec))
    done = grpo("dev", "--port", str(free_port()), "--submit", "python_grader.yaml", cwd=root, env=env,
                timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded at step 30" in done.stdout.splitlines()[-1], done.stdout
    rewards = step_rewards(done.stdout)
    assert len(rewards) == 30, done.stdout
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.3 and last > 0.7, f"reward over the first 5 steps {first:.3f}, last 5 {last:.3f}"
