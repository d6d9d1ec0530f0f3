"""``job.eval`` webhooks through the real components: the worker's reporter
(:class:`worker.reporting.JobReporter`) records step records as a training job does, each eval
point's row leaves its deliveries in its own transaction, and the scheduler process's sender POSTs
them, signed, to a real local receiver (``tests/webhook_receiver.py``), on Postgres and SQLite. A
step without eval metrics sends nothing; a retried write of the same attempt sends nothing again;
a later attempt's re-evaluated step is sent with its new figures. A job's ending (``job.succeeded``,
``job.failed``) carries its last step's record, its last eval point and its model's download path."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from test_webhooks import deliveries, no_leftover_webhooks, register, sender_settings  # noqa: F401
from webhook_receiver import webhook_receiver

from api.scheduling.webhook_sender import WebhookSender
from api.store.db import session_scope
from api.store.telemetry import record_metrics
from worker.reporting import JobReporter

pytestmark = pytest.mark.usefixtures("no_leftover_webhooks")

TRAINING = {"reward": 0.5, "kl": 0.01, "loss": 0.1, "rewards/contains/mean": 0.5}
EVALUATED = {"eval_reward": 0.25, "eval_reward_std": 0.5, "eval_pass@k": 0.25,
             "eval_rewards/contains/mean": 0.25, "eval_completions/mean_length": 7.5, "timing/eval": 0.125}


def send_all(api_server) -> int:
    sender = WebhookSender(sender_settings(api_server))
    try:
        return sender.send_due()
    finally:
        sender.close()


def test_each_eval_point_is_delivered_with_its_step_and_metrics(api_server, alpha, worker, job_spec) -> None:
    with webhook_receiver() as receiver:
        hook = register(alpha, receiver.url, ["job.eval"])
        endings_only = register(alpha, receiver.url, ["job.succeeded"])
        job_id = alpha.post("/v1/jobs", json=job_spec(name="evaluated")).json()["id"]
        worker.start(job_id)
        reporter = JobReporter(api_server.settings.database_url, job_id, None, attempt=1)
        reporter.on_step({"step": 0, **EVALUATED})  # eval_on_start
        reporter.on_step({"step": 1, **TRAINING})  # not an eval point: nothing to send
        reporter.on_step({"step": 2, **TRAINING, **EVALUATED, "eval_reward": 0.75})
        reporter.on_step({"step": 2, **TRAINING, **EVALUATED, "eval_reward": 0.75})  # a retried write
        assert [d["event"] for d in deliveries(alpha, hook["id"])] == ["job.eval", "job.eval"]
        assert deliveries(alpha, endings_only["id"]) == []
        assert send_all(api_server) == 2

    events = {}
    for request in receiver.seen:
        timestamp = request.headers["Webhook-Timestamp"]
        signed = hmac.new(hook["secret"].encode(), f"{timestamp}.".encode() + request.body, hashlib.sha256)
        assert request.headers["Webhook-Signature"] == f"v1={signed.hexdigest()}"
        event = json.loads(request.body)
        events[event["data"]["step"]] = event
    assert sorted(events) == [0, 2]
    assert events[0]["type"] == "job.eval"
    assert events[0]["data"]["job"] == {"id": job_id, "name": "evaluated", "team_id": hook["team_id"]}
    assert events[0]["data"]["metrics"] == EVALUATED  # the eval metrics, none of training's
    assert events[2]["data"]["metrics"] == {**EVALUATED, "eval_reward": 0.75}
    assert {d["status"] for d in deliveries(alpha, hook["id"])} == {"delivered"}


def test_a_later_attempt_that_evaluates_a_step_again_sends_it_again(api_server, alpha, worker,
                                                                    job_spec) -> None:
    hook = register(alpha, "https://hooks.example.com/grpo", ["job.eval"])
    job_id = alpha.post("/v1/jobs", json=job_spec(name="re-evaluated")).json()["id"]
    worker.start(job_id)
    first = JobReporter(api_server.settings.database_url, job_id, None, attempt=1)
    first.on_step({"step": 2, **EVALUATED})
    # Resumed from an older checkpoint, attempt 2 trains and evaluates step 2 again: SQL now
    # holds its figures, and so does the new delivery.
    JobReporter(api_server.settings.database_url, job_id, None, attempt=2).on_step(
        {"step": 2, **EVALUATED, "eval_reward": 1.0})
    first.on_step({"step": 2, **EVALUATED})  # attempt 1, late: replaces nothing, sends nothing
    assert len(deliveries(alpha, hook["id"])) == 2


def test_a_rolled_back_metric_row_sends_nothing(api_server, alpha, worker, job_spec) -> None:
    hook = register(alpha, "https://hooks.example.com/grpo", ["job.eval"])
    job_id = alpha.post("/v1/jobs", json=job_spec(name="rolled-back-eval")).json()["id"]
    worker.start(job_id)
    with pytest.raises(RuntimeError), session_scope(api_server.settings.database_url) as session:
        assert record_metrics(session, job_id, {"step": 1, **EVALUATED}, attempt=1)
        raise RuntimeError("the transaction fails after the write")
    assert deliveries(alpha, hook["id"]) == []


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_an_ending_carries_the_last_step_the_last_eval_point_and_the_model(api_server, alpha, worker,
                                                                           job_spec, outcome) -> None:
    with webhook_receiver() as receiver:
        register(alpha, receiver.url, [f"job.{outcome}"])
        job_id = alpha.post("/v1/jobs", json=job_spec(name=f"ends-{outcome}")).json()["id"]
        worker.start(job_id)
        reporter = JobReporter(api_server.settings.database_url, job_id, None, attempt=1)
        reporter.on_step({"step": 0, **EVALUATED})
        reporter.on_step({"step": 1, **TRAINING, **EVALUATED, "eval_reward": 0.75})
        reporter.on_step({"step": 2, **TRAINING, "reward": 0.625})  # the last step did not evaluate
        worker.finish(job_id, outcome)
        assert send_all(api_server) == 1

    [request] = receiver.seen
    data = json.loads(request.body)["data"]
    assert data["job"]["status"] == outcome and data["job"]["kind"] == "train"
    assert data["metrics"] == {"step": 2, "values": {"step": 2, **TRAINING, "reward": 0.625}}
    assert data["eval_metrics"] == {"step": 1, "values": {**EVALUATED, "eval_reward": 0.75}}
    # Only a succeeded job has a final model to download.
    assert data["model_download_path"] == (f"/v1/jobs/{job_id}/model" if outcome == "succeeded" else None)


def test_an_ending_without_steps_says_so(api_server, alpha, worker, job_spec) -> None:
    with webhook_receiver() as receiver:
        register(alpha, receiver.url, ["job.failed"])
        job_id = alpha.post("/v1/jobs", json=job_spec(name="no-steps")).json()["id"]
        worker.start(job_id)
        worker.finish(job_id, "failed")
        assert send_all(api_server) == 1
    data = json.loads(receiver.seen[0].body)["data"]
    assert (data["metrics"], data["eval_metrics"], data["model_download_path"]) == (None, None, None)
