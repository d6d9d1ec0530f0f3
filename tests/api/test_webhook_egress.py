"""What a webhook may reach and what it tells, through the real components (issue 32): the API
refuses internal destinations in every spelling at registration, the scheduler's sender refuses
them again on the address it would connect to, records only a status, a duration and an error
class, cuts a trickling receiver at one deadline for the whole request, and never lets one
team's hanging receivers hold another team's delivery. Registrations are capped per team and
paged, with no cursor oracle; secrets are sealed in SQL and a process will not start without a
key that opens them. On Postgres and SQLite."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, update
from test_webhooks import deliveries, finished_job, no_leftover_webhooks, register, sender_settings  # noqa: F401
from waiting import wait_until
from webhook_receiver import webhook_receiver

from api.cli.schema_check import webhook_secrets_sealed
from api.main import create_app
from api.scheduling import webhook_sender
from api.scheduling.webhook_sender import ERROR_CLASSES, WebhookSender
from api.security.secret_box import SecretBox, SecretKeyError
from api.store.db import session_scope
from api.store.tables import Webhook

pytestmark = pytest.mark.usefixtures("no_leftover_webhooks")

# Every internal destination of the list, in every spelling that was accepted.
INTERNAL = [
    "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://10.1.2.3/",
    "http://172.16.0.1/", "http://192.168.1.1/", "http://100.64.0.1/", "http://127.0.0.1:5432/",
    "http://127.0.0.1:6379/", "http://localhost/", "http://LOCALHOST./x", "http://[::1]/",
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:a9fe:a9fe]/", "http://[::127.0.0.1]/",
    "http://[64:ff9b::127.0.0.1]/", "http://[64:ff9b::a00:1]/", "http://[2002:7f00:1::1]/",
    "http://[2002:a9fe:a9fe::]/", "http://2130706433/", "http://0x7f000001/", "http://0177.0.0.1/",
    "http://127.1/", "http://0/", "http://0.0.0.0/", "http://[::]/", "http://[fe80::1]/",
    "http://[fec0::1]/", "http://[fc00::1]/", "http://224.0.0.1/", "http://[ff02::1]/",
    "http://255.255.255.255/", "http://240.0.0.1/", "http://%31%32%37.0.0.1/", "http://127.0.0.1./",
    "https://127.0.0.1/", "http://[::ffff:10.0.0.1]/",
]


@pytest.fixture(scope="module")
def strict_server(api_server, serve_api):
    """The module's service with no network allowed beyond public addresses (the default)."""
    with serve_api(sender_settings(api_server, webhook_allowed_networks="")) as server:
        yield server


@pytest.mark.parametrize("url", INTERNAL)
def test_registration_refuses_every_internal_destination(strict_server, client_for, team_keys, url) -> None:
    refused = client_for(team_keys.alpha, strict_server).post("/v1/webhooks",
                                                             json={"url": url, "events": ["job.failed"]})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == "url"
    assert error["message"].startswith("destination not allowed: "), error  # the rule named after it


def test_a_public_address_and_an_allowed_network_are_accepted(strict_server, client_for, team_keys,
                                                              alpha) -> None:
    strict = client_for(team_keys.alpha, strict_server)
    register(strict, "https://93.184.216.34/hooks")
    register(strict, "https://[2606:4700:4700::1111]/hooks")
    register(alpha, "http://127.0.0.1:9/hooks")  # the module's server allows 127.0.0.0/8


def test_a_refused_destination_at_send_time_fails_without_a_request(api_server, alpha, worker,
                                                                   job_spec) -> None:
    """Registered while loopback was allowed; the sender's policy no longer allows it: the
    address it would connect to is refused, nothing reaches the receiver, and the delivery is
    failed at once, not retried."""
    with webhook_receiver() as receiver:
        hook = register(alpha, receiver.url)
        finished_job(alpha, worker, job_spec)
        sender = WebhookSender(sender_settings(api_server, webhook_allowed_networks="10.0.0.0/8"))
        try:
            assert sender.send_due() == 1
            assert sender.send_due() == 0
        finally:
            sender.close()
    assert receiver.seen == []
    [failed] = deliveries(alpha, hook["id"])
    assert (failed["status"], failed["attempts"], failed["last_error"]) == ("failed", 1,
                                                                           "destination_not_allowed")
    assert failed["last_status_code"] is None


def test_records_carry_a_status_a_duration_and_an_error_class_only(api_server, alpha, worker,
                                                                   job_spec) -> None:
    with webhook_receiver() as receiver:
        receiver.script.append(("status", 500))
        hook = register(alpha, receiver.url)
        finished_job(alpha, worker, job_spec)
        sender = WebhookSender(sender_settings(api_server))
        try:
            sender.send_due()
        finally:
            sender.close()
    [record] = deliveries(alpha, hook["id"])
    assert (record["last_status_code"], record["last_error"]) == (500, "http_status")
    assert isinstance(record["last_duration_ms"], int) and record["last_duration_ms"] >= 0
    assert set(ERROR_CLASSES) >= {record["last_error"]}


def test_a_trickling_receiver_is_cut_at_the_deadline(api_server, alpha, worker, job_spec) -> None:
    """An answer of a byte every 0.2 s never lets a per-read timeout of 1 s fire (it would take
    50 s to finish); the request's one deadline of 1 s cuts it."""
    with webhook_receiver() as receiver:
        receiver.script.append(("trickle", 0.2))
        hook = register(alpha, receiver.url)
        finished_job(alpha, worker, job_spec)
        sender = WebhookSender(sender_settings(api_server, webhook_timeout_seconds=1))
        try:
            assert sender.send_due() == 1
        finally:
            sender.close()
    [cut] = deliveries(alpha, hook["id"])
    assert (cut["status"], cut["last_error"], cut["last_status_code"]) == ("pending", "timeout", None)


def test_hanging_receivers_of_one_team_do_not_hold_another_teams_delivery(api_server, alpha, beta, worker,
                                                                          job_spec) -> None:
    """Alpha's six receivers hang until the test lets them go, and alpha's deliveries fell due
    first; beta's delivery is delivered (and recorded) while they all still hang."""
    release = threading.Event()
    with contextlib.ExitStack() as stack:
        hanging = [stack.enter_context(webhook_receiver()) for _ in range(6)]
        for receiver in hanging:
            receiver.always = ("block", release)
            register(alpha, receiver.url)
        quiet = stack.enter_context(webhook_receiver())
        beta_hook = register(beta, quiet.url)
        finished_job(alpha, worker, job_spec)
        finished_job(beta, worker, job_spec)
        stop = threading.Event()
        settings = sender_settings(api_server, webhook_timeout_seconds=30, webhook_poll_seconds=0.05,
                                   webhook_max_in_flight=8, webhook_max_in_flight_per_team=3)
        thread = webhook_sender.start(settings, stop)
        try:
            wait_until(lambda: deliveries(beta, beta_hook["id"])[0]["status"] == "delivered", 20,
                       "beta's delivery to be delivered while alpha's receivers hang")
            assert not release.is_set() and len(quiet.seen) == 1
            assert sum(len(r.seen) for r in hanging) <= 3  # alpha holds only its own slots
        finally:
            release.set()
            stop.set()
            thread.join(timeout=40)
    assert not thread.is_alive()


def test_a_team_registers_up_to_its_limit(api_server, serve_api, client_for, team_keys) -> None:
    with serve_api(sender_settings(api_server, webhook_max_per_team=3)) as server:
        alpha, beta = client_for(team_keys.alpha, server), client_for(team_keys.beta, server)
        for n in range(3):
            register(alpha, f"https://hooks.example.com/{n}")
        refused = alpha.post("/v1/webhooks", json={"url": "https://hooks.example.com/4",
                                                   "events": ["job.failed"]})
        assert refused.status_code == 409
        assert "GRPO_WEBHOOK_MAX_PER_TEAM" in refused.json()["error"]["message"]
        register(beta, "https://hooks.example.com/beta")  # another team's count is its own
        assert len(alpha.get("/v1/webhooks").json()["items"]) == 3


def test_registrations_racing_each_other_stop_at_the_limit(api_server, serve_api, client_for,
                                                          team_keys) -> None:
    with serve_api(sender_settings(api_server, webhook_max_per_team=3)) as server:
        alpha = client_for(team_keys.alpha, server)
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda n: alpha.post("/v1/webhooks", json={
                "url": f"https://hooks.example.com/{n}", "events": ["job.failed"]}).status_code, range(12)))
        assert sorted(answers) == [201] * 3 + [409] * 9
        assert len(alpha.get("/v1/webhooks").json()["items"]) == 3


def test_listings_are_paged_and_another_teams_id_pages_like_an_unknown_one(alpha, beta, worker,
                                                                           job_spec) -> None:
    first = register(alpha, "https://hooks.example.com/1")
    theirs = register(beta, "https://hooks.example.com/b")
    gone = register(alpha, "https://hooks.example.com/gone")
    second = register(alpha, "https://hooks.example.com/2")
    alpha.delete(f"/v1/webhooks/{gone['id']}")  # not the newest: its id is not given out again
    third = register(alpha, "https://hooks.example.com/3")

    page = alpha.get("/v1/webhooks", params={"limit": 2}).json()
    assert [h["id"] for h in page["items"]] == [first["id"], second["id"]]
    rest = alpha.get("/v1/webhooks", params={"after": page["next_after"], "limit": 2}).json()
    assert ([h["id"] for h in rest["items"]], rest["next_after"]) == ([third["id"]], None)
    # beta's id sits between alpha's first and second, as the deleted (now unknown) one does.
    assert (alpha.get("/v1/webhooks", params={"after": theirs["id"]}).json()
            == alpha.get("/v1/webhooks", params={"after": gone["id"]}).json())

    for team in (alpha, beta, alpha):
        finished_job(team, worker, job_spec)
    beta_delivery = deliveries(beta, theirs["id"])[0]["id"]
    newest = deliveries(alpha, first["id"])[0]["id"]
    by_theirs = alpha.get(f"/v1/webhooks/{first['id']}/deliveries", params={"after": beta_delivery}).json()
    unknown = beta_delivery + 1 if beta_delivery + 1 < newest else beta_delivery - 1
    assert by_theirs == alpha.get(f"/v1/webhooks/{first['id']}/deliveries", params={"after": unknown}).json()


def stored_secret(database_url: str, hook_id: int) -> str:
    with session_scope(database_url) as session:
        return session.scalar(select(Webhook.secret).where(Webhook.id == hook_id))


def test_secrets_are_sealed_in_sql_and_a_process_needs_the_key(api_server, alpha) -> None:
    settings = api_server.settings
    hook = register(alpha, "https://hooks.example.com/sealed")
    stored = stored_secret(settings.database_url, hook["id"])
    assert hook["secret"] not in stored and not stored.startswith("whsec_")
    assert SecretBox(settings.secret_key.get_secret_value()).open(stored) == hook["secret"]

    for wrong in (None, Fernet.generate_key().decode()):
        broken = sender_settings(api_server, secret_key=wrong and SecretStr(wrong))
        with pytest.raises(SecretKeyError, match="GRPO_SECRET_KEY"), TestClient(create_app(broken)):
            pass
        with pytest.raises(SystemExit, match="GRPO_SECRET_KEY"):
            webhook_secrets_sealed(broken)


def test_plain_secrets_are_sealed_and_keys_rotate_at_the_schedulers_start(api_server, alpha) -> None:
    settings = api_server.settings
    hook = register(alpha, "https://hooks.example.com/legacy")
    with session_scope(settings.database_url) as session:  # a row from before encryption
        session.execute(update(Webhook).where(Webhook.id == hook["id"]).values(secret=hook["secret"]))
    webhook_secrets_sealed(settings)
    old_key = settings.secret_key.get_secret_value()
    assert SecretBox(old_key).open(stored_secret(settings.database_url, hook["id"])) == hook["secret"]

    new_key = Fernet.generate_key().decode()
    webhook_secrets_sealed(sender_settings(api_server, secret_key=SecretStr(f"{new_key},{old_key}")))
    assert SecretBox(new_key).open(stored_secret(settings.database_url, hook["id"])) == hook["secret"]
    # Back under the module's key, for the tests after this one.
    webhook_secrets_sealed(sender_settings(api_server, secret_key=SecretStr(f"{old_key},{new_key}")))
