"""A job's WebSocket stream while Redis goes away, against a real uvicorn server on Postgres and
a private ``redis-server`` this test stops: a connected stream is closed with 1013 (try again
later, reconnect with the cursor) rather than 1011, and a new handshake is refused with 503
``unavailable`` while Redis is down."""

from __future__ import annotations

import json

import httpx
import pytest
import service_db
from test_stream import open_stream, read_until_closed
from websockets.exceptions import InvalidStatus

from api.cli.dev import stop_process

TRY_AGAIN = 1013


def test_a_stream_whose_redis_goes_away_closes_1013_and_the_handshake_is_then_refused_503(
        private_redis, api_settings_factory, serve_api, job_spec, api_token) -> None:
    redis_url, redis_process = private_redis
    with service_db.fresh_postgres_url("grpo_outage") as url, service_db.migrated(url), \
            serve_api(api_settings_factory(url, redis_url=redis_url)) as server, \
            httpx.Client(base_url=server.http_url, trust_env=False, timeout=10,
                         headers={"Authorization": f"Bearer {api_token}"}) as client:
        response = client.post("/v1/jobs", json=job_spec())
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        with open_stream(server, job_id, api_token) as ws:
            # The backlog (the submit event), then the job's status: the stream is live.
            while (first := json.loads(ws.recv(timeout=10)))["type"] != "status":
                pass
            assert first["status"] == "queued"
            stop_process(redis_process, grace=2)
            rest, code = read_until_closed(ws, timeout=20)
        assert code == TRY_AGAIN, rest
        with pytest.raises(InvalidStatus) as refused:
            open_stream(server, job_id, api_token)
        assert refused.value.response.status_code == 503
        assert json.loads(refused.value.response.body)["error"]["code"] == "unavailable"
        assert client.get(f"/v1/jobs/{job_id}").status_code == 200  # SQL alone still answers
