"""No reward holds a shared worker (issue 12, Why 1 and 2), on a real one-slot worker, scheduler,
Postgres and Redis, with a test-only reward plugin installed for the worker's processes:

* the finding's regex ``(?s)(.|.)*(?!)`` times out at every step and the job fails
  ``reward_timeout``;
* a plugin stuck in C code holding its process's GIL (stdlib ``re``, which cannot time out) ends
  ``stalled`` by the supervisor's watchdog;
* the next job on the same worker (one device) then runs to the end, in an empty working
  directory of its own rather than the worker's folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from api.store.db import session_scope
from api.store.telemetry import list_events

CATASTROPHIC = [{"name": "regex_match", "args": {"pattern": "(?s)(.|.)*(?!)"}}]
PLUGIN = '''
import json, os, re

def stuck_in_c(completions, prompts, **columns):
    """Backtracks for ever inside re's C code, which never lets go of the GIL."""
    re.search(r"(?s)(.|.)*(?!)", "x" * 64)
    return [0.0] * len(completions)

def where_am_i(completions, prompts, **columns):
    """Records the working directory the job's process runs in, and what is there."""
    with open(os.environ["WHERE_AM_I"], "w") as handle:
        json.dump({"cwd": os.getcwd(), "listing": os.listdir(".")}, handle)
    return [float("yes" in text) for text in completions]
'''


def install_plugin(folder: Path) -> Path:
    """A distribution on ``folder`` (for PYTHONPATH) declaring two ``grpo.rewards`` entry points."""
    (folder / "containment_rewards.py").write_text(PLUGIN)
    info = folder / "containment_rewards-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: containment-rewards\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[grpo.rewards]\nstuck_in_c = containment_rewards:stuck_in_c\n"
                                           "where_am_i = containment_rewards:where_am_i\n")
    return folder


def warnings(database_url: str, job_id: int) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=1000) if e.type == "reward_timeout"]


def start_worker(processes, pool: str, wait_worker_ready, tmp_path: Path) -> Path:
    """A one-slot worker (one device) whose processes see the plugin; the file where_am_i writes."""
    plugin = install_plugin(tmp_path)
    pythonpath = f"{plugin}:{processes.env.get('PYTHONPATH', '')}".rstrip(":")
    where = tmp_path / "where.json"
    processes.worker(pool, PYTHONPATH=pythonpath, WHERE_AM_I=str(where), GRPO_KILL_GRACE_SECONDS="1")
    wait_worker_ready(pool, processes)
    processes.scheduler()
    return where


LONG = {"grpo": {"max_completion_length": 48}}  # completions long enough to backtrack for ages


def test_the_findings_regex_times_out_and_the_next_job_runs_in_an_empty_folder(
        processes, submit, tiny_spec, finished, wait_for, pool, database_url, wait_worker_ready, tmp_path):
    where = start_worker(processes, pool, wait_worker_ready, tmp_path)
    regex = submit(tiny_spec("regex", pool=pool, rewards=CATASTROPHIC, reward_timeout_seconds=0.5, **LONG))
    after = submit(tiny_spec("after", pool=pool, rewards=[{"name": "where_am_i"}], max_steps=2))

    timed_out = wait_for(lambda: finished(regex), 45, "the regex job to time out", processes)
    assert (timed_out.status, timed_out.error.code) == ("failed", "reward_timeout"), timed_out.error
    assert [e.level for e in warnings(database_url, regex)] == ["warning"] * 3
    done = wait_for(lambda: finished(after), 45, "the next job on the worker", processes)
    assert done.status == "succeeded", done.error
    assert timed_out.finished_at <= done.started_at  # one device: it waited for the regex job

    seen = json.loads(where.read_text())
    assert seen["listing"] == [] and Path(seen["cwd"]).name == "workdir"
    assert not Path(seen["cwd"]).exists()  # the attempt's folder goes with the attempt


def test_a_reward_stuck_in_c_holding_the_gil_stalls_and_the_next_job_runs(
        processes, submit, tiny_spec, finished, wait_for, pool, wait_worker_ready, tmp_path):
    start_worker(processes, pool, wait_worker_ready, tmp_path)
    stuck = submit(tiny_spec("stuck", pool=pool, rewards=[{"name": "stuck_in_c"}], stall_seconds=3, **LONG))
    after = submit(tiny_spec("after", pool=pool, max_steps=2))

    stalled = wait_for(lambda: finished(stuck), 45, "the stuck job to stall", processes)
    assert (stalled.status, stalled.error.code) == ("failed", "stalled"), stalled.error
    done = wait_for(lambda: finished(after), 45, "the next job on the worker", processes)
    assert done.status == "succeeded", done.error
    assert stalled.finished_at <= done.started_at
