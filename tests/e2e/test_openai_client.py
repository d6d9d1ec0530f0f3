"""The ``openai`` client against the real service (``grpo dev``: API, scheduler, a Celery
worker with the sandbox, SQL, Redis), as a team leaving OpenAI's reinforcement fine-tuning would
use it: upload its JSONL, create a job with a ``multi`` grader of ``string_check`` + ``python``,
wait for it, list its events and checkpoints, pause and resume another; every job also visible at
``/v1/jobs``."""

from __future__ import annotations

import io
import json
import time

import httpx
import openai
import pytest
from sandbox_guard import needs_sandbox

ROWS = [{"messages": [{"role": "user", "content": f"Say the letter {letter}."}], "reference_answer": letter}
        for letter in "ABCDEFGH"]
GRADER = {
    "type": "multi", "name": "letter", "calculate_output": "0.5 * says + 0.5 * short",
    "graders": {
        "says": {"type": "string_check", "name": "says", "operation": "ilike",
                 "input": "{{sample.output_text}}", "reference": "{{item.reference_answer}}"},
        "short": {"type": "python", "name": "short", "source": (
            "def grade(sample, item):\n    return 1.0 if len(sample['output_text']) < 40 else 0.0\n")},
    }}
# Small on purpose: each job runs a few steps of the tiny model on the CPU.
HYPERPARAMETERS = {"n_epochs": 1, "batch_size": 4, "compute_multiplier": 0.5}


@pytest.fixture(scope="module")
def client(keyed_stack):
    http = openai.DefaultHttpxClient(trust_env=False, timeout=30)
    yield openai.OpenAI(base_url=f"{keyed_stack.url}/v1", api_key=keyed_stack.keys["alpha"],
                        http_client=http, max_retries=0)
    http.close()


def _upload(client) -> str:
    body = "".join(json.dumps(row) + "\n" for row in ROWS).encode()
    uploaded = client.files.create(file=("train.jsonl", io.BytesIO(body)), purpose="fine-tune")
    assert (uploaded.object, uploaded.purpose, uploaded.status) == ("file", "fine-tune", "processed")
    return uploaded.id


def _create(client, training_file: str, **hyperparameters):
    return client.fine_tuning.jobs.create(
        model="path:tiny", training_file=training_file, suffix="letters", seed=7, metadata={"team": "alpha"},
        method={"type": "reinforcement", "reinforcement": {
            "grader": GRADER, "hyperparameters": {**HYPERPARAMETERS, **hyperparameters}}})


def _wait(client, job_id: str, done, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if done(job):
            return job
        assert time.monotonic() < deadline, f"{job_id} is {job.status}, waited {timeout} s"
        time.sleep(0.5)


@needs_sandbox
def test_a_reinforcement_job_with_a_multi_grader_runs_and_reads_as_openais(client, keyed_stack) -> None:
    job = _create(client, _upload(client))
    assert job.object == "fine_tuning.job" and job.status in ("queued", "running")
    assert job.method.type == "reinforcement" and job.metadata == {"team": "alpha"}

    finished = _wait(client, job.id, lambda j: j.status in ("succeeded", "failed", "cancelled"))
    assert finished.status == "succeeded", finished.error
    our_id = int(job.id.removeprefix("ftjob-"))
    assert finished.fine_tuned_model == f"job:{our_id}" and finished.trained_tokens > 0
    assert finished.finished_at >= finished.created_at

    # The same job through our own door: the grader became its one reward, scored every step.
    with httpx.Client(base_url=keyed_stack.url, trust_env=False, timeout=30,
                      headers={"Authorization": f"Bearer {keyed_stack.keys['alpha']}"}) as ours:
        read = ours.get(f"/v1/jobs/{our_id}").json()
        assert read["status"] == "succeeded" and read["spec"]["rewards"][0]["name"] == "multi"
        metrics = ours.get(f"/v1/jobs/{our_id}/metrics").json()["items"]
    assert metrics and all(0.0 <= m["values"]["reward"] <= 1.0 for m in metrics)

    events = client.fine_tuning.jobs.list_events(job.id, limit=100)
    assert events.data and all(e.object == "fine_tuning.job.event" for e in events.data)
    stamps = [e.created_at for e in events.data]
    assert stamps == sorted(stamps, reverse=True)  # newest first, as OpenAI lists them
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert checkpoints, "a finished job keeps at least its last checkpoint"
    assert checkpoints[0].fine_tuned_model_checkpoint == f"job:{our_id}@{checkpoints[0].step_number}"
    assert job.id in [listed.id for listed in client.fine_tuning.jobs.list(limit=100).data]

    # Another team sees none of it.
    beta = openai.OpenAI(base_url=f"{keyed_stack.url}/v1", api_key=keyed_stack.keys["beta"], max_retries=0,
                         http_client=openai.DefaultHttpxClient(trust_env=False, timeout=30))
    with pytest.raises(openai.NotFoundError):
        beta.fine_tuning.jobs.retrieve(job.id)


@needs_sandbox
def test_pause_and_resume_through_the_client(client, keyed_stack) -> None:
    job = _create(client, _upload(client), n_epochs=50)
    _wait(client, job.id, lambda j: j.status == "running" and j.trained_tokens)
    assert client.fine_tuning.jobs.pause(job.id).status == "paused"
    # OpenAI shows it paused at once; it takes resume once it has checkpointed and let go of its
    # device (our `pausing` -> `paused`), a 409 before.
    with httpx.Client(base_url=keyed_stack.url, trust_env=False, timeout=30,
                      headers={"Authorization": f"Bearer {keyed_stack.keys['alpha']}"}) as ours:
        our_id = int(job.id.removeprefix("ftjob-"))
        deadline = time.monotonic() + 120
        while ours.get(f"/v1/jobs/{our_id}").json()["status"] != "paused":
            assert time.monotonic() < deadline, "the job never paused"
            time.sleep(0.5)
    assert client.fine_tuning.jobs.resume(job.id).status in ("queued", "running")
    _wait(client, job.id, lambda j: j.status == "running")
    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    # Shown cancelled at once; finished once it has stopped (our `cancelling` -> `cancelled`).
    _wait(client, job.id, lambda j: j.status == "cancelled" and j.finished_at is not None)
