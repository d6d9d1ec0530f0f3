"""Issue 12's findings against the API (items 3, 5, 6 and 9), each replayed through a real
server on Postgres and SQLite and refused or contained: weak operator tokens and non-Bearer
schemes, keys in WebSocket URLs and access logs, open sockets of revoked keys, inputs that
gave 500s, and what members and anonymous callers learn of the servers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from api.settings import Settings
from api.store import teams
from api.store.db import session_scope

BIGINT_OVER = 2**63
INT_OVER = 2**31


# ---- item 3: tokens ----


@pytest.mark.parametrize("token", ["", "   ", "short-but-not-a-placeholder", "x" * 31])
def test_a_short_or_empty_operator_token_refuses_to_start(token: str) -> None:
    with pytest.raises(ValidationError, match="GRPO_API_TOKEN must be at least 32 characters"):
        Settings(api_token=token)
    assert Settings(api_token="x" * 32).api_token is not None
    assert Settings(api_token=None).api_token is None  # unset: no operator token at all


def test_only_the_bearer_scheme_is_read(api_server, api_token) -> None:
    with httpx.Client(base_url=api_server.http_url, trust_env=False) as anonymous:
        for header in ("x", "Basic dXNlcjpwYXNz", "Bearer", "Bearer \"\"", f"Token {api_token}",
                       f"Basic {api_token}", f"{api_token}"):
            response = anonymous.get("/v1/me", headers={"Authorization": header})
            assert response.status_code == 401, header
        assert anonymous.get("/v1/me", headers={"Authorization": f"bearer {api_token}"}).status_code == 200


# ---- item 6: no 5xx from plain input ----


def test_integers_beyond_their_column_are_422_naming_the_parameter(api, api_server, api_token,
                                                                   job_spec) -> None:
    job_id = api.post("/v1/jobs", json=job_spec()).json()["id"]
    cases = [
        (f"/v1/jobs/{BIGINT_OVER}", {}, "job_id"),
        (f"/v1/jobs/{BIGINT_OVER}/events", {}, "job_id"),
        ("/v1/jobs", {"after": BIGINT_OVER}, "after"),
        (f"/v1/jobs/{job_id}/events", {"after": BIGINT_OVER}, "after"),
        (f"/v1/jobs/{job_id}/metrics", {"after_step": INT_OVER}, "after_step"),
        (f"/v1/jobs/{job_id}/samples", {"step": INT_OVER}, "step"),
    ]
    for path, params, param in cases:
        response = api.get(path, params=params)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["error"]["param"] == param
    assert api.post(f"/v1/jobs/{BIGINT_OVER}/cancel").status_code == 422
    assert api.post(f"/v1/admin/keys/{BIGINT_OVER}/revoke").status_code == 422
    # The largest values the columns hold are fine: nothing there.
    assert api.get(f"/v1/jobs/{BIGINT_OVER - 1}").status_code == 404
    assert api.get(f"/v1/jobs/{job_id}/metrics", params={"after_step": INT_OVER - 1}).json()["items"] == []
    # The WebSocket's cursors too, refused in the handshake rather than accepted and then 1011.
    for query in (f"after={INT_OVER}", f"after_event={BIGINT_OVER}"):
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{api_server.ws_url}/v1/jobs/{job_id}/stream?{query}",
                    additional_headers={"Authorization": f"Bearer {api_token}"}, proxy=None, open_timeout=5)
        assert refused.value.response.status_code == 422, query


def test_nul_and_over_long_strings_are_422_naming_the_field(api, job_spec) -> None:
    cases = [
        (job_spec(name="a\x00b"), "name"),
        (job_spec(model={"source": "path:ti\x00ny"}), "model.source"),
        (job_spec(model={"source": "path:" + "a" * 1000}), "model.source"),
        (job_spec(model={"source": "path:tiny/" + "a" * 300 + "/x"}), "model.source"),
    ]
    before = api.get("/v1/jobs", params={"limit": 100}).json()["items"]
    for spec, param in cases:
        response = api.post("/v1/jobs", json=spec)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["param"] == param
    assert api.get("/v1/jobs", params={"limit": 100}).json()["items"] == before  # nothing queued
    for path, param in [("/v1/admin/teams/a%00b", "team"), ("/v1/admin/teams/" + "a" * 1000, "team")]:
        response = api.patch(path, json={"weight": 2})
        assert response.status_code == 422 and response.json()["error"]["param"] == param, response.text
    response = api.put("/v1/admin/teams/alpha/quotas/p%00ol", json={"gpus": 1})
    assert response.status_code == 422 and response.json()["error"]["param"] == "pool"
    response = api.post("/v1/admin/teams/default/keys", json={"label": "a\x00b"})
    assert response.status_code == 422 and response.json()["error"]["param"] == "label"
    assert api.get("/v1/queue", params={"pool": "a\x00"}).status_code == 422


def test_hostile_yaml_and_json_bodies_are_4xx(api) -> None:
    yaml_headers = {"Content-Type": "application/yaml"}
    deep = "name: " + "[" * 400 + "]" * 400
    nested = "name:\n" + "".join("  " * depth + "a:\n" for depth in range(1, 400)) + "  " * 400 + "b: 1\n"
    huge = "name: x\ncheckpoint_every: " + "9" * 5000
    for body in (deep, nested, huge):
        response = api.post("/v1/jobs", content=body, headers=yaml_headers)
        assert response.status_code == 422, response.text[:300]
        assert response.json()["error"]["param"] == "body"
    json_deep = '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for body in (json_deep, '{"checkpoint_every": ' + "9" * 5000 + "}"):
        response = api.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, response.text[:300]


# ---- item 5: keys out of URLs and logs; revoked keys' sockets close ----


def _stream_url(server, job_id: int, query: str = "") -> str:
    return f"{server.ws_url}/v1/jobs/{job_id}/stream" + (f"?{query}" if query else "")


def _first_message(ws) -> dict:
    return json.loads(ws.recv(timeout=10))


def test_a_stream_ticket_opens_one_stream_once(api_server, client_for, team_keys, job_spec) -> None:
    alpha, beta = client_for(team_keys.alpha), client_for(team_keys.beta)
    job_id = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    issued = alpha.post("/v1/stream-tickets")
    assert issued.status_code == 201 and issued.json()["expires_in"] == 30
    ticket = issued.json()["ticket"]
    protocols = ["grpo.v1", f"grpo.ticket.{ticket}"]
    with connect(_stream_url(api_server, job_id), subprotocols=protocols, proxy=None, open_timeout=5) as ws:
        assert ws.subprotocol == "grpo.v1"
        assert _first_message(ws)["type"] in ("event", "status")
    for attempt in (protocols, None):  # used: refused as a subprotocol and in the query alike
        with pytest.raises(InvalidStatus) as refused:
            connect(_stream_url(api_server, job_id, "" if attempt else f"ticket={ticket}"),
                    subprotocols=attempt, proxy=None, open_timeout=5)
        assert refused.value.response.status_code == 401
    # A ticket stands for its key's team: another team's ticket finds no such job.
    other = beta.post("/v1/stream-tickets").json()["ticket"]
    with pytest.raises(InvalidStatus) as refused:
        connect(_stream_url(api_server, job_id, f"ticket={other}"), proxy=None, open_timeout=5)
    assert refused.value.response.status_code == 404
    with pytest.raises(InvalidStatus) as refused:
        connect(_stream_url(api_server, job_id), subprotocols=["grpo.v1", "grpo.ticket.made-up"], proxy=None,
                open_timeout=5)
    assert refused.value.response.status_code == 401
    assert client_for(None).post("/v1/stream-tickets").status_code == 401


class _Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def server_log():
    """Every line uvicorn's access and error loggers write during the test, at INFO."""
    captured = _Captured()
    loggers = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
        logger.addHandler(captured)
    yield captured.lines
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(captured)
        logger.setLevel(level)


def test_the_access_log_holds_no_key_or_ticket(api_server, client_for, team_keys, job_spec,
                                               server_log) -> None:
    alpha = client_for(team_keys.alpha)
    job_id = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    tickets = [alpha.post("/v1/stream-tickets").json()["ticket"] for _ in range(2)]
    with connect(_stream_url(api_server, job_id), subprotocols=["grpo.v1", f"grpo.ticket.{tickets[0]}"],
                 proxy=None, open_timeout=5) as ws:
        _first_message(ws)
    with connect(_stream_url(api_server, job_id, f"after=0&ticket={tickets[1]}"), proxy=None,
                 open_timeout=5) as ws:
        _first_message(ws)
    # A client that still sends its key in the URL is refused, and its key is not logged either.
    with pytest.raises(InvalidStatus):
        connect(_stream_url(api_server, job_id, f"token={team_keys.alpha}"), proxy=None, open_timeout=5)
    alpha.get("/v1/jobs", params={"token": team_keys.alpha, "api_key": team_keys.alpha})
    logged = "\n".join(server_log)
    assert f"/v1/jobs/{job_id}/stream" in logged and "[redacted]" in logged  # it did log these
    for secret in (team_keys.alpha, *tickets):
        assert secret not in logged


def test_a_revoked_keys_open_stream_is_closed_4401(api_database_url, api_settings_factory, serve_api,
                                                  make_key, job_spec) -> None:
    """Revoked in SQL by another process (``grpo admin revoke-key``): the socket, which this
    process's cache would otherwise trust, closes within the cache's TTL."""
    key = make_key(api_database_url, "beta", label="revoked while streaming")
    with serve_api(api_settings_factory(api_database_url, auth_cache_seconds=1.0)) as server, \
            httpx.Client(base_url=server.http_url, headers={"Authorization": f"Bearer {key}"},
                         trust_env=False) as holder:
        job_id = holder.post("/v1/jobs", json=job_spec()).json()["id"]
        with connect(_stream_url(server, job_id), additional_headers={"Authorization": f"Bearer {key}"},
                     proxy=None, open_timeout=5) as ws:
            assert _first_message(ws)["type"] in ("event", "status")
            with session_scope(api_database_url) as session:
                teams.revoke_key(session, next(k.id for k in teams.list_keys(session, "beta")
                                               if k.label == "revoked while streaming"))
            with pytest.raises(ConnectionClosed) as closed:
                while True:  # the job's backlog and status first; then the close
                    ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


# ---- item 9: what members and anonymous callers see ----


def test_members_see_checkpoint_names_admins_see_paths(api_server, client_for, team_keys, worker,
                                                        job_spec) -> None:
    alpha, admin = client_for(team_keys.alpha), client_for(team_keys.admin)
    job_id = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    worker.start(job_id)
    worker.step(job_id, 1)
    path = f"/srv/artifacts/job-{job_id}/checkpoints/step-1"
    worker.reporter(job_id).on_checkpoint(1, Path(path))
    event = worker.event(job_id, "checkpoint", "checkpoint at step 1", {"step": 1, "path": path})
    assert admin.get(f"/v1/jobs/{job_id}").json()["latest_checkpoint"] == path
    assert [c["path"] for c in admin.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]] == [path]
    assert alpha.get(f"/v1/jobs/{job_id}").json()["latest_checkpoint"] == "step-1"
    assert [c["path"] for c in alpha.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]] == ["step-1"]
    def checkpoint_event(client) -> dict:
        events = client.get(f"/v1/jobs/{job_id}/events").json()["items"]
        return next(e for e in events if e["id"] == event["id"])["data"]

    assert checkpoint_event(admin) == {"step": 1, "path": path}
    assert checkpoint_event(alpha) == {"step": 1, "path": "step-1"}
    listed = alpha.get("/v1/jobs", params={"limit": 100}).json()["items"]
    assert {job["latest_checkpoint"] for job in listed if job["id"] == job_id} == {"step-1"}
    ticket = alpha.post("/v1/stream-tickets").json()["ticket"]
    protocols = ["grpo.v1", f"grpo.ticket.{ticket}"]
    with connect(_stream_url(api_server, job_id, f"after=1&after_event={event['id'] - 1}"),
                 subprotocols=protocols, proxy=None, open_timeout=5) as ws:
        streamed, status = _first_message(ws), _first_message(ws)  # nothing else is past those cursors
    assert streamed["type"] == "event" and streamed["event"]["data"] == {"step": 1, "path": "step-1"}
    assert status["type"] == "status" and status["job"]["latest_checkpoint"] == "step-1"
    cancelled = alpha.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["latest_checkpoint"] == "step-1"
    assert path not in json.dumps([streamed, status]) + cancelled.text
