"""Per-team webhooks through the real components: the API registers them, the real store's job
transitions (the scripted worker's claim and finish) write their deliveries, and the scheduler
process's sender (:class:`api.scheduling.webhook_sender.WebhookSender`) POSTs them to a real
local receiver (``tests/webhook_receiver.py``), on Postgres and SQLite."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time

import pytest
from waiting import wait_until
from webhook_receiver import free_port, receiver_url, webhook_receiver

from api.scheduling import webhook_sender
from api.scheduling.webhook_sender import WebhookSender
from api.store import attempts
from api.store.db import session_scope

pytestmark = pytest.mark.usefixtures("no_leftover_webhooks")


@pytest.fixture
def no_leftover_webhooks(api):
    """Each test's webhooks (and so their pending deliveries) are gone after it, so a later
    test's sender pass sends only that test's."""
    yield
    for hook in api.get("/v1/webhooks").json()["items"]:
        assert api.delete(f"/v1/webhooks/{hook['id']}").status_code == 200


def sender_settings(api_server, **overrides):
    return api_server.settings.model_copy(update=overrides)


def register(client, url: str, events=("job.succeeded",), **fields) -> dict:
    response = client.post("/v1/webhooks", json={"url": url, "events": list(events), **fields})
    assert response.status_code == 201, response.text
    return response.json()


def finished_job(client, worker, job_spec, status: str = "succeeded") -> int:
    job_id = client.post("/v1/jobs", json=job_spec(name=f"hooked-{status}")).json()["id"]
    worker.start(job_id)
    worker.finish(job_id, status)
    return job_id


def deliveries(client, hook_id: int) -> list[dict]:
    response = client.get(f"/v1/webhooks/{hook_id}/deliveries")
    assert response.status_code == 200, response.text
    return response.json()["items"]


def test_registration_shows_the_secret_once_and_checks_url_and_events(alpha, team_keys) -> None:
    hook = register(alpha, "https://hooks.example.com/grpo", ["job.failed", "job.succeeded", "job.failed"])
    assert hook["secret"].startswith("whsec_") and hook["team_id"] == team_keys.alpha_id
    assert hook["events"] == ["job.succeeded", "job.failed"]
    listed = alpha.get("/v1/webhooks").json()["items"]
    assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
    assert "secret" not in alpha.get(f"/v1/webhooks/{hook['id']}").json()
    for url in ("ftp://hooks.example.com/x", "https://user:pw@hooks.example.com/x", "/relative"):
        response = alpha.post("/v1/webhooks", json={"url": url, "events": ["job.failed"]})
        assert response.status_code == 422, url
    for events in ([], ["job.started"], ["job.evaluated"]):
        assert alpha.post("/v1/webhooks", json={"url": "https://h.example.com", "events": events}
                          ).status_code == 422, events


def test_only_admins_name_a_team(alpha, client_for, team_keys) -> None:
    refused = alpha.post("/v1/webhooks", json={"url": "https://h.example.com", "events": ["job.failed"],
                                               "team": "beta"})
    assert refused.status_code == 403
    hook = register(client_for(team_keys.admin), "https://h.example.com", ["job.failed"], team="beta")
    assert hook["team_id"] == team_keys.beta_id
    assert [h["id"] for h in client_for(team_keys.beta).get("/v1/webhooks").json()["items"]] == [hook["id"]]


def test_another_team_sees_nothing(alpha, beta, client_for, team_keys) -> None:
    hook = register(alpha, "https://h.example.com")
    assert beta.get("/v1/webhooks").json()["items"] == []
    for method, path in (("GET", ""), ("GET", "/deliveries"), ("DELETE", "")):
        assert beta.request(method, f"/v1/webhooks/{hook['id']}{path}").status_code == 404, (method, path)
    assert alpha.get(f"/v1/webhooks/{hook['id']}").status_code == 200  # beta's DELETE removed nothing
    assert hook["id"] in {h["id"] for h in client_for(team_keys.admin).get("/v1/webhooks").json()["items"]}


def test_admins_may_restrict_hosts(api_server, serve_api, client_for, team_keys) -> None:
    settings = sender_settings(api_server, webhook_allowed_hosts="Hooks.Example.com, other.example.org")
    with serve_api(settings) as server:
        client = client_for(team_keys.alpha, server)
        refused = client.post("/v1/webhooks", json={"url": "https://evil.example.net/x",
                                                    "events": ["job.failed"]})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "url"
        register(client, "https://hooks.example.com/x")


def test_a_succeeded_job_is_delivered_once_signed(api_server, alpha, worker, job_spec) -> None:
    with webhook_receiver() as receiver:
        hook = register(alpha, receiver.url, ["job.succeeded", "job.failed"])
        only_failed = register(alpha, receiver.url, ["job.failed"])
        job_id = finished_job(alpha, worker, job_spec)
        [pending] = deliveries(alpha, hook["id"])
        assert (pending["status"], pending["attempts"], pending["job_id"]) == ("pending", 0, job_id)
        assert deliveries(alpha, only_failed["id"]) == []

        sender = WebhookSender(sender_settings(api_server))
        try:
            assert sender.send_due() == 1
            assert sender.send_due() == 0  # delivered: never sent again
        finally:
            sender.close()

    [request] = receiver.seen
    timestamp = request.headers["Webhook-Timestamp"]
    expected = hmac.new(hook["secret"].encode(), f"{timestamp}.".encode() + request.body, hashlib.sha256)
    assert request.headers["Webhook-Signature"] == f"v1={expected.hexdigest()}"
    assert abs(int(timestamp) - time.time()) < 60
    assert request.headers["Webhook-Id"] == str(pending["id"])
    event = json.loads(request.body)
    assert event["type"] == "job.succeeded"
    assert event["data"]["job"] | {"id": job_id, "status": "succeeded"} == event["data"]["job"]
    [done] = deliveries(alpha, hook["id"])
    assert (done["status"], done["attempts"], done["last_status_code"]) == ("delivered", 1, 204)
    assert done["delivered_at"] is not None and done["next_attempt_at"] is None


def test_a_receiver_that_is_down_gets_it_after_a_backoff(api_server, alpha, worker, job_spec) -> None:
    port = free_port()
    hook = register(alpha, receiver_url(port), ["job.failed"])
    finished_job(alpha, worker, job_spec, "failed")
    sender = WebhookSender(sender_settings(api_server, webhook_retry_seconds=0.5))
    try:
        assert sender.send_due() == 1
        [refused] = deliveries(alpha, hook["id"])
        assert (refused["status"], refused["attempts"], refused["last_status_code"]) == ("pending", 1, None)
        assert refused["last_error"] == "connect_failed"
        with webhook_receiver(port) as receiver:
            assert sender.send_due() == 0  # not due before its backoff
            wait_until(sender.send_due, 10, "the retry to fall due and be sent")
    finally:
        sender.close()
    assert len(receiver.seen) == 1
    [done] = deliveries(alpha, hook["id"])
    assert (done["status"], done["attempts"], done["last_error"]) == ("delivered", 2, None)


def test_a_delivery_out_of_attempts_is_failed(api_server, alpha, worker, job_spec) -> None:
    with webhook_receiver() as receiver:
        receiver.script.extend([("status", 500), ("status", 302)])
        hook = register(alpha, receiver.url, ["job.cancelled"])
        finished_job(alpha, worker, job_spec, "cancelled")
        sender = WebhookSender(sender_settings(api_server, webhook_retry_seconds=0, webhook_max_attempts=2))
        try:
            assert sender.send_due() == 1
            assert sender.send_due() == 1  # a redirect is not followed: it is one more failure
            assert sender.send_due() == 0
        finally:
            sender.close()
    assert len(receiver.seen) == 2
    [failed] = deliveries(alpha, hook["id"])
    assert (failed["status"], failed["attempts"], failed["last_status_code"]) == ("failed", 2, 302)


def test_a_rolled_back_ending_sends_nothing(api_server, alpha, worker, job_spec) -> None:
    hook = register(alpha, "https://h.example.com", ["job.succeeded"])
    job_id = alpha.post("/v1/jobs", json=job_spec(name="rolled-back")).json()["id"]
    worker.start(job_id)
    with pytest.raises(RuntimeError), session_scope(api_server.settings.database_url) as session:
        assert attempts.finish(session, job_id, worker_id="scripted", outcome="succeeded")
        raise RuntimeError("the transaction fails after the move")
    assert deliveries(alpha, hook["id"]) == []
    worker.finish(job_id)
    assert len(deliveries(alpha, hook["id"])) == 1


def test_a_slow_receiver_slows_neither_the_api_nor_other_jobs(api_server, alpha, worker, job_spec) -> None:
    with webhook_receiver() as receiver:
        receiver.script.append(("hang", 4))
        hook = register(alpha, receiver.url)
        stop = threading.Event()
        thread = webhook_sender.start(sender_settings(api_server, webhook_timeout_seconds=2,
                                                      webhook_poll_seconds=0.05), stop)
        try:
            finished_job(alpha, worker, job_spec)
            wait_until(lambda: receiver.seen, 10, "the sender to call the slow receiver")
            started = time.monotonic()
            assert alpha.get("/v1/jobs").status_code == 200
            second = finished_job(alpha, worker, job_spec)  # a job still ends while the request hangs
            assert time.monotonic() - started < 1.5
            assert alpha.get(f"/v1/jobs/{second}").json()["status"] == "succeeded"
            timed_out = wait_until(lambda: [d for d in deliveries(alpha, hook["id"]) if d["last_error"]],
                                   10, "the hanging request to time out")
            assert (timed_out[0]["last_error"], timed_out[0]["status"]) == ("timeout", "pending")
        finally:
            stop.set()
            thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_scheduler_process_sends_them(api_server, alpha, worker, job_spec, tmp_path) -> None:
    """``grpo scheduler`` runs the sender beside its loop, and stops both on SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    settings = api_server.settings
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "GRPO_DATABASE_URL": settings.database_url, "GRPO_REDIS_URL": settings.redis_url,
           "GRPO_WEBHOOK_POLL_SECONDS": "0.1", "GRPO_SECRET_KEY": settings.secret_key.get_secret_value(),
           "GRPO_WEBHOOK_ALLOWED_NETWORKS": settings.webhook_allowed_networks}
    log = tmp_path / "scheduler.log"
    with webhook_receiver() as receiver, log.open("w") as out:
        register(alpha, receiver.url)
        process = subprocess.Popen([sys.executable, "-m", "api.cli.main", "scheduler"], env=env,
                                   stdout=out, stderr=subprocess.STDOUT)
        try:
            finished_job(alpha, worker, job_spec)
            wait_until(lambda: receiver.seen, 60, "the scheduler process to send the delivery",
                       details=log.read_text)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert json.loads(receiver.seen[0].body)["type"] == "job.succeeded"
