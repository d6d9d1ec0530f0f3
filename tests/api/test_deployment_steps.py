"""The operator's guide's deployment steps, run as written: the bash block between the
``deployment-steps`` markers of ``docs/operators.md`` goes to bash line for line, against a fresh
Postgres database and the session's Redis, so the guide cannot drift from what works.

Only the configuration differs: each ``export NAME=value`` line with a literal value gets this
test's value for NAME (its database, free port, temporary roots), and the guide must export
exactly the names the test provides. Computed exports (``$(grpo admin create-key ...)``) run as
written. The block runs in a folder holding ``examples/tiny.yaml`` cut to a few steps, so the job
it submits ends in seconds; it must succeed, as a job of the team the block made.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from compose_file import REPO
from waiting import wait_until

from api.cli.dev import free_port
from api.store.db import session_scope
from api.store.jobs import get_job
from api.store.teams import team_id_by_name

pytestmark = pytest.mark.slow

BEGIN, END = "<!-- deployment-steps:begin -->", "<!-- deployment-steps:end -->"
SHELL_WORDS = {"export", "until", "while", "do", "done", "if", "then", "else", "fi", "!"}
CONTROL_OPERATORS = {";", "&", "&&", "|", "||", "("}
STEPS = 2  # the tiny example's max_steps here: enough to train, checkpoint and finish
GUIDE = REPO / "docs" / "operators.md"


def deployment_block() -> str:
    text = GUIDE.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{GUIDE.name} needs one {BEGIN} ... {END}"
    between = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    fenced = re.fullmatch(r"\s*```bash\n(.*?)```\s*", between, re.S)
    assert fenced, "the deployment steps are one ```bash block between the markers"
    return fenced.group(1)


def configured(block: str, values: dict[str, str]) -> str:
    """The block with this test's value in every literal ``export``; it must set exactly ``values``."""
    exported: list[str] = []
    lines = []
    for line in block.splitlines():
        if line.startswith("export ") and "$" not in line:
            names = [word.split("=", 1)[0] for word in shlex.split(line)[1:]]
            exported += names
            line = "export " + " ".join(f"{name}={shlex.quote(values.get(name, ''))}" for name in names)
        lines.append(line)
    assert sorted(exported) == sorted(values), f"guide exports {sorted(exported)}, the test {sorted(values)}"
    return "\n".join(lines) + "\n"


def programs(block: str) -> set[str]:
    """The programs the block runs: the first word of each command, past shell keywords and
    assignments (``export KEY=$(grpo ...)`` runs grpo)."""
    found: set[str] = set()
    for line in block.splitlines():
        expect_command = True
        tokens = shlex.shlex(line, posix=True, punctuation_chars=True)  # drops # comments
        tokens.whitespace_split = True  # words split only at blanks and ( ) ; < > | &
        for token in tokens:
            if token in CONTROL_OPERATORS:
                expect_command = True
            elif expect_command and token not in SHELL_WORDS and "=" not in token:
                found.add(token)
                expect_command = False
    return found


def test_the_steps_are_numbered_in_order() -> None:
    numbers = [int(n) for n in re.findall(r"^# (\d+)\. ", deployment_block(), re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 7, numbers


def stop_group(pgid: int, grace: float = 20.0) -> None:
    """SIGTERM the block's process group (its background services), SIGKILL what outlives ``grace``."""
    def members() -> list[psutil.Process]:
        alive = []
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except (ProcessLookupError, psutil.Error):
                pass
        return alive

    try:
        os.killpg(pgid, signal.SIGTERM)
        wait_until(lambda: not members(), grace, "the deployment's services to stop", interval=0.2)
    except (ProcessLookupError, AssertionError):
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_the_guides_deployment_steps_run_a_job_to_success(tmp_path: Path, fresh_postgres_url: str) -> None:
    block = deployment_block()
    port = free_port()
    srv = tmp_path / "srv"  # the roots do not exist yet: the steps make them
    values = {"GRPO_DATABASE_URL": fresh_postgres_url, "GRPO_REDIS_URL": os.environ["GRPO_TEST_REDIS_URL"],
              "GRPO_MODELS_ROOT": str(srv / "models"), "GRPO_DATA_ROOT": str(srv / "data"),
              "GRPO_ARTIFACTS_ROOT": str(srv / "artifacts"),
              "GRPO_API_PORT": str(port), "GRPO_API_URL": f"http://127.0.0.1:{port}"}
    script = "set -eu\n" + configured(block, values)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    # This checkout's code and this interpreter's `grpo` and `python`; quick heartbeats and passes.
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(REPO),
               GRPO_HEARTBEAT_SECONDS="0.5", GRPO_SCHEDULER_INTERVAL_SECONDS="0.2",
               GRPO_REQUEUE_BACKOFF_SECONDS="0.2", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    missing = {name for name in programs(block) if shutil.which(name, path=env["PATH"]) is None}
    assert not missing, f"the deployment steps run programs this machine lacks: {sorted(missing)}"

    spec = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())
    spec["grpo"]["max_steps"] = STEPS
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "tiny.yaml").write_text(yaml.safe_dump(spec))

    log = tmp_path / "deployment.log"
    with log.open("w") as handle:
        process = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        returncode = process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        stop_group(process.pid)
        process.wait()
    assert returncode == 0, f"the deployment steps ended with {returncode}:\n{log.read_text()[-8000:]}"

    (team_name,) = re.findall(r"^grpo admin create-team (\S+)", block, re.M)
    with session_scope(fresh_postgres_url) as session:
        job = get_job(session, 1)  # the first job of a fresh database
        team = team_id_by_name(session, team_name)
    assert (job.status, job.last_step, job.team_id) == ("succeeded", STEPS, team), job
