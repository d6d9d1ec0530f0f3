"""Who may hold a job's live stream open, through real uvicorn servers on Postgres and SQLite
sharing one real Redis: stream tickets stay inside the deployment (namespace) that issued them
and a keyless ticket is an admin only under the operator token that signed it; a key revoked
through an API process closes that process's open streams of it at once."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from api.store import bus

OTHER_OPERATOR_TOKEN = "another-operator-token-0b5d2e7f91c4a6"


def _client(server, credential: str) -> httpx.Client:
    return httpx.Client(base_url=server.http_url, headers={"Authorization": f"Bearer {credential}"},
                        timeout=10, trust_env=False)


def _ticket(server, credential: str) -> str:
    with _client(server, credential) as client:
        issued = client.post("/v1/stream-tickets")
    assert issued.status_code == 201, issued.text
    return issued.json()["ticket"]


def _open_with_ticket(server, job_id: int, ticket: str) -> ClientConnection:
    return connect(f"{server.ws_url}/v1/jobs/{job_id}/stream", proxy=None, open_timeout=5,
                   subprotocols=["grpo.v1", f"grpo.ticket.{ticket}"])


def _refused_status(server, job_id: int, ticket: str) -> int:
    with pytest.raises(InvalidStatus) as refused:
        _open_with_ticket(server, job_id, ticket).close()
    return refused.value.response.status_code


def _streams(server, job_id: int, ticket: str) -> bool:
    with _open_with_ticket(server, job_id, ticket) as ws:
        return json.loads(ws.recv(timeout=10))["type"] in ("event", "status")


@pytest.fixture
def serve_all(serve_api):
    """``serve_all(*settings)``: a live server for each, all stopped after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda *settings: [stack.enter_context(serve_api(s)) for s in settings]


def _queued_job(server, credential: str, job_spec) -> int:
    with _client(server, credential) as client:
        created = client.post("/v1/jobs", json=job_spec())
    assert created.status_code == 201, created.text
    return created.json()["id"]


# ---- tickets stay in their deployment ----


def test_a_ticket_opens_streams_only_in_the_namespace_that_issued_it(
        api_database_url, api_settings_factory, serve_all, api_token, make_key, job_spec) -> None:
    """Two stacks on one Redis (and here one database, so the job exists for both): neither
    redeems the other's ticket, nor uses it up."""
    tag = uuid.uuid4().hex[:8]
    member = make_key(api_database_url, "default", label=f"member {tag}")
    first, second = serve_all(api_settings_factory(api_database_url, namespace=f"first{tag}"),
                              api_settings_factory(api_database_url, namespace=f"second{tag}"))
    job_id = _queued_job(second, member, job_spec)
    for credential in (api_token, member):  # a keyless (operator) ticket and a key's
        ticket = _ticket(first, credential)
        assert _refused_status(second, job_id, ticket) == 401
        assert _streams(first, job_id, ticket)  # still unused where it belongs
        assert _refused_status(first, job_id, ticket) == 401  # and single-use there
    with redis.Redis.from_url(first.settings.redis_url) as client:
        ticket = _ticket(first, member)
        ours = list(client.scan_iter(match=first.settings.redis_keys.stream_ticket("*")))
        assert len(ours) == 1 and not list(client.scan_iter(match="grpo:stream-ticket:*"))
        assert _streams(first, job_id, ticket)


def test_a_keyless_ticket_is_an_admin_only_under_the_operator_token_that_signed_it(
        api_database_url, api_settings_factory, serve_all, api_token, make_key, job_spec) -> None:
    """One namespace, three servers: with keys and the operator token, with auth off (every
    caller an admin, no key behind its tickets) and with another operator token. Only the
    first's own operator tickets open its streams as an admin."""
    namespace = f"shared{uuid.uuid4().hex[:8]}"
    keys, open_door, rotated = serve_all(
        api_settings_factory(api_database_url, namespace=namespace),
        api_settings_factory(api_database_url, namespace=namespace, auth="none"),
        api_settings_factory(api_database_url, namespace=namespace, api_token=OTHER_OPERATOR_TOKEN))
    job_id = _queued_job(keys, api_token, job_spec)
    assert _refused_status(keys, job_id, _ticket(open_door, "anything: auth is off")) == 401
    assert _refused_status(rotated, job_id, _ticket(keys, api_token)) == 401
    assert _refused_status(keys, job_id, _ticket(rotated, OTHER_OPERATOR_TOKEN)) == 401
    assert _streams(keys, job_id, _ticket(keys, api_token))
    assert _streams(rotated, job_id, _ticket(rotated, OTHER_OPERATOR_TOKEN))


# ---- a revocation closes this process's streams at once ----


def _read_until_closed(ws: ClientConnection, within: float) -> tuple[list[dict], int | None]:
    """What arrives until the server closes (and its code), or until ``within`` seconds pass
    (code None then)."""
    messages, deadline = [], time.monotonic() + within
    with contextlib.suppress(TimeoutError):
        try:
            while True:
                messages.append(json.loads(ws.recv(timeout=max(0.0, deadline - time.monotonic()))))
        except ConnectionClosed as closed:
            return messages, closed.rcvd.code if closed.rcvd else None
    return messages, None


@pytest.fixture
def stream_publisher(api_database_url, api_settings_factory) -> Iterator:
    """``publish(job_id, step)``: one step's metrics onto the job's Redis stream, as the worker
    publishes them."""
    settings = api_settings_factory(api_database_url)
    with redis.Redis.from_url(settings.redis_url) as client:
        yield lambda job_id, step: bus.publish(client, settings.redis_keys, job_id, "metrics",
                                               {"step": step, "reward": 0.5}, maxlen=1000)


def test_a_key_revoked_through_this_api_closes_its_open_stream_at_once(
        api_database_url, api_settings_factory, serve_all, api_token, job_spec, stream_publisher) -> None:
    """The key cache trusts keys for a minute here; the stream closes with 4401 within a few
    seconds of the revoke and sends nothing published after it."""
    window = 60.0
    [server] = serve_all(api_settings_factory(api_database_url, auth_cache_seconds=window))
    with _client(server, api_token) as admin:
        created = admin.post("/v1/admin/teams/default/keys", json={"label": "revoked while streaming"})
        assert created.status_code == 201, created.text
        key_id, key = created.json()["id"], created.json()["key"]
        job_id = _queued_job(server, key, job_spec)
        with connect(f"{server.ws_url}/v1/jobs/{job_id}/stream", proxy=None, open_timeout=5,
                     additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            while json.loads(ws.recv(timeout=10))["type"] != "status":
                pass  # the backlog ends with the job's status
            stream_publisher(job_id, 1)
            assert json.loads(ws.recv(timeout=10))["step"] == 1  # live
            revoked_at = time.monotonic()
            assert admin.post(f"/v1/admin/keys/{key_id}/revoke").status_code == 200
            stream_publisher(job_id, 2)
            after_revoke, code = _read_until_closed(ws, within=10.0)
            closed_after = time.monotonic() - revoked_at
    assert code == 4401, (code, after_revoke)
    assert closed_after < 5.0 < window
    assert [m for m in after_revoke if m["type"] == "metrics"] == []
