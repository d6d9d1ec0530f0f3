"""What writers publish reaches WebSocket clients at once, not at the next SQL re-read: against a
server whose safety-net re-reads come only after 5 s of quiet stream or an hour of busy one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from test_stream import kinds, open_stream, read_n, read_until_closed, submit  # tests/api helpers

PROMPT_S = 2.5  # well inside the 5 s quiet wait: only a publish can deliver this fast


@pytest.fixture(scope="module")
def quiet_server(api_server, api_settings_factory, serve_api) -> Iterator:
    """A second server on the module's database whose SQL re-reads are too rare to matter."""
    settings = api_settings_factory(api_server.settings.database_url, stream_block_seconds=5.0,
                                    stream_recheck_seconds=3600.0)
    with serve_api(settings) as server:
        yield server


@pytest.fixture
def quiet_api(quiet_server, client_for, api_token):
    return client_for(api_token, quiet_server)


def test_an_event_the_api_writes_reaches_the_stream_at_once(quiet_server, quiet_api, api_token,
                                                             job_spec) -> None:
    job_id = submit(quiet_api, job_spec)
    with open_stream(quiet_server, job_id, api_token) as ws:
        assert kinds(read_n(ws, 2)) == ["event", "status"]
        assert quiet_api.patch(f"/v1/jobs/{job_id}", json={"priority": "high"}).status_code == 200
        message = json.loads(ws.recv(timeout=PROMPT_S))
    events = quiet_api.get(f"/v1/jobs/{job_id}/events").json()["items"]
    assert message == {"type": "event", "event": {k: events[-1][k] for k in ("id", "ts", "level", "type",
                                                                              "message", "data")}}
    assert message["event"]["type"] == "priority_changed" and message["event"]["data"]["to"] == "high"


def test_cancelling_a_queued_job_ends_its_stream_at_once(quiet_server, quiet_api, api_token,
                                                         job_spec) -> None:
    job_id = submit(quiet_api, job_spec)
    with open_stream(quiet_server, job_id, api_token) as ws:
        read_n(ws, 2)
        assert quiet_api.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
        started = time.monotonic()
        messages, code = read_until_closed(ws, timeout=PROMPT_S)
    assert time.monotonic() - started < PROMPT_S
    assert code == 1000 and kinds(messages) == ["event", "status"]
    assert messages[0]["event"]["type"] == "cancelled"
    assert messages[1]["status"] == "cancelled" and messages[1]["job"]["status"] == "cancelled"


def test_a_published_status_makes_the_server_re_read_the_job_at_once(quiet_server, api_token, worker,
                                                                     quiet_api, job_spec) -> None:
    job_id = submit(quiet_api, job_spec)
    worker.start(job_id)
    with open_stream(quiet_server, job_id, api_token) as ws:
        assert kinds(read_n(ws, 4))[-1] == "status"
        worker.finish(job_id, "succeeded")
        started = time.monotonic()
        messages, code = read_until_closed(ws, timeout=PROMPT_S)
    assert time.monotonic() - started < PROMPT_S
    assert code == 1000 and kinds(messages) == ["event", "status"]
    assert messages[0]["event"]["type"] == "succeeded"
    assert messages[1]["job"] == quiet_api.get(f"/v1/jobs/{job_id}").json()
