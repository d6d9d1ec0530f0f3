"""Who may hold a job's live stream open, through real uvicorn servers on Postgres and SQLite
sharing one real Redis: stream tickets stay inside the deployment (namespace) that issued them
and a keyless ticket is an admin only under the operator token that signed it."""

from __future__ import annotations

import contextlib
import json
import uuid

import httpx
import pytest
import redis
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

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
