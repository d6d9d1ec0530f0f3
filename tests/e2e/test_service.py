"""End to end, as a user sees it: submit over HTTP, follow over WebSocket, read back over REST,
cancel, fail, and the ``grpo submit --watch`` command line. Runs on SQLite and on Postgres
(the failing job and the command line on SQLite, the embedded default, only)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from websockets.sync.client import connect

from api.domain.lifecycle import TERMINAL_STATUSES

pytestmark = pytest.mark.slow


def read_stream(stack, job_id: int, after: int = 0) -> list[dict[str, Any]]:
    """Every message until the final status (the server then closes the socket)."""
    messages = []
    url = stack.api.stream_url(job_id, after)
    with connect(url, additional_headers={"Authorization": f"Bearer {stack.token}"}, open_timeout=30) as ws:
        for raw in ws:
            messages.append(json.loads(raw))
            if messages[-1]["type"] == "status" and messages[-1]["status"] in TERMINAL_STATUSES:
                break
    return messages


def steps(messages: list[dict[str, Any]]) -> list[int]:
    return [m["step"] for m in messages if m["type"] == "metrics"]


def test_bad_specs_are_refused_with_422_and_leave_nothing_behind(stack, tiny_spec):
    before = stack.api.http.get("/v1/jobs").json()["items"]
    bad = [{**tiny_spec(), "surprise": 1},
           tiny_spec(model={"source": "path:../outside"}),
           tiny_spec(rewards=[{"name": "no_such_reward"}]),
           tiny_spec(grpo={"num_generations": 1})]
    for spec in bad:
        response = stack.api.http.post("/v1/jobs", json=spec)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"]
    assert stack.api.http.get("/v1/jobs").json()["items"] == before


def test_an_idempotency_key_replays_the_first_job(stack, tiny_spec):
    spec = tiny_spec("idem", max_steps=2)
    first = stack.api.http.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "k-1"})
    again = stack.api.http.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "k-1"})
    other = stack.api.http.post("/v1/jobs", json=tiny_spec("other"), headers={"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert again.json()["id"] == first.json()["id"]
    # Not needed beyond this point: cancelled wherever it is, so later tests do not queue behind it.
    stopped = stack.api.http.post(f"/v1/jobs/{first.json()['id']}/cancel").json()
    assert stopped["status"] in ("cancelled", "cancelling")


def test_every_step_arrives_exactly_once_live_and_from_a_cursor(stack, tiny_spec):
    n = 24
    job_id = stack.api.submit(tiny_spec("stream", max_steps=n, checkpoint_every=8))["id"]
    from_start: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: from_start.extend(read_stream(stack, job_id)))
    reader.start()
    cursor = stack.wait_for_job(job_id, lambda job: job["last_step"] >= 3)["last_step"]
    mid_run = read_stream(stack, job_id, after=cursor)  # connects mid-run with `after`
    reader.join(timeout=120)

    assert steps(from_start) == list(range(1, n + 1))
    assert steps(mid_run) == list(range(cursor + 1, n + 1))
    assert from_start[-1]["status"] == mid_run[-1]["status"] == "succeeded"
    rest = stack.api.http.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    streamed = {m["step"]: m["values"] for m in from_start if m["type"] == "metrics"}
    assert {item["step"]: item["values"] for item in rest} == streamed
    assert {"reward", "kl", "clip_ratio/region_mean", "loss", "grad_norm"} <= set(streamed[n])


def test_cancel_a_queued_job_at_once_and_a_running_one_within_two_steps(stack, tiny_spec):
    running_id = stack.api.submit(tiny_spec("long", max_steps=5000, checkpoint_every=1000))["id"]
    stack.wait_for_job(running_id, lambda job: job["status"] == "running" and job["last_step"] >= 2)
    queued_id = stack.api.submit(tiny_spec("waiting"))["id"]  # the only worker is busy
    assert stack.api.job(queued_id)["status"] == "queued"

    cancelled = stack.api.http.post(f"/v1/jobs/{queued_id}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["attempt"] == 0

    asked = stack.api.http.post(f"/v1/jobs/{running_id}/cancel").json()
    assert asked["status"] == "cancelling"
    final = stack.wait_until_done(running_id)
    assert final["status"] == "cancelled"
    assert asked["last_step"] <= final["last_step"] <= asked["last_step"] + 2
    checkpoints = stack.api.http.get(f"/v1/jobs/{running_id}/checkpoints").json()["items"]
    assert checkpoints[-1]["step"] == final["last_step"]
    assert Path(final["latest_checkpoint"]).is_dir()
    assert stack.api.job(queued_id)["status"] == "cancelled"


# On the embedded default only (each job costs seconds of imports): on Postgres the worker's
# failure code is tested by tests/worker/test_run_job.py.
@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)
def test_a_failing_job_records_its_error_code(stack, tiny_spec):
    # Accepted (the file exists), but its rows have no prompt column: the worker finds out.
    (stack.root / "data" / "questions.jsonl").write_text(json.dumps({"question": "2+3?"}) + "\n")
    job_id = stack.api.submit(tiny_spec("fails", dataset={"source": "path:questions.jsonl"}))["id"]
    job = stack.wait_until_done(job_id)
    assert job["status"] == "failed"
    assert job["error"]["code"] == "invalid_spec" and "prompt" in job["error"]["message"]


# On the embedded default only: on Postgres, the stream the command reads is tested by
# test_every_step_arrives_exactly_once_live_and_from_a_cursor.
@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)
def test_grpo_submit_watch_streams_each_step_and_exits_with_the_outcome(stack, tiny_spec, tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec("cli", max_steps=3)))
    done = subprocess.run([sys.executable, "-m", "api.cli.main", "submit", str(spec), "--watch",
                           "--api-url", stack.url, "--api-key", stack.token],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1/3", "2/3", "3/3"]
    assert lines[0].startswith("submitted job") and "succeeded at step 3" in lines[-1]


def test_pause_resume_and_retry_continue_from_the_checkpoint_with_each_step_once(stack, tiny_spec):
    steps_total = 12
    job_id = stack.api.submit(tiny_spec("paused", max_steps=steps_total, checkpoint_every=1000))["id"]
    stack.wait_for_job(job_id, lambda job: job["status"] == "running" and job["last_step"] >= 2)
    assert stack.api.http.post(f"/v1/jobs/{job_id}/pause").json()["status"] == "pausing"
    paused = stack.wait_for_job(job_id, lambda job: job["status"] == "paused")
    assert paused["worker_id"] is None and paused["devices"] is None
    assert paused["latest_checkpoint"].endswith(f"step-{paused['last_step']}")
    # The one device is free: the job to retry below trains meanwhile, and is cancelled mid-run
    # (one job process fewer than a separate job for each part: each costs seconds of imports).
    again = stack.api.submit(tiny_spec("retried", max_steps=steps_total, checkpoint_every=1000))["id"]
    stack.wait_for_job(again, lambda job: job["status"] == "running" and job["last_step"] >= 2)
    stack.api.http.post(f"/v1/jobs/{again}/cancel")
    cancelled = stack.wait_until_done(again)
    assert cancelled["status"] == "cancelled"
    assert stack.api.job(job_id)["status"] == "paused"  # at rest: nothing dispatched it

    assert stack.api.http.post(f"/v1/jobs/{job_id}/resume").json()["status"] == "queued"
    assert stack.wait_until_done(job_id)["status"] == "succeeded"
    assert [m["step"] for m in stack.api.metrics(job_id)["items"]] == list(range(1, steps_total + 1))

    retried = stack.api.http.post(f"/v1/jobs/{again}/retry").json()
    assert (retried["status"], retried["error"], retried["finished_at"]) == ("queued", None, None)
    final = stack.wait_until_done(again)
    assert (final["status"], final["attempt"]) == ("succeeded", 2)
    assert [m["step"] for m in stack.api.metrics(again)["items"]] == list(range(1, steps_total + 1))
    resumed = [e for e in stack.api.events(again)["items"] if e["type"] == "resumed"]
    assert resumed and resumed[-1]["data"]["step"] == cancelled["last_step"]  # from its checkpoint
