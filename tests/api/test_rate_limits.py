"""Per-team rate limits over real HTTP (Postgres and SQLite, the session's real Redis): a team's
reads and writes each draw on a token bucket of its own, shared by all its keys and every API
process, and an empty bucket is a 429 with ``Retry-After``; admins are not limited; with Redis
gone each process counts on its own, and nothing becomes a 5xx."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import yaml
from waiting import wait_until


@pytest.fixture
def admin(client_for, team_keys):
    return client_for(team_keys.admin)


@pytest.fixture
def limited(admin, api_server, make_key):
    """``limited(**limits) -> key``: a member key of a new team with those limits."""
    def make(**limits) -> str:
        name = f"rate-{uuid.uuid4().hex[:8]}"
        assert admin.post("/v1/admin/teams", json={"name": name}).status_code == 201
        assert admin.put(f"/v1/admin/teams/{name}/limits", json=limits).status_code == 200
        return make_key(api_server.settings.database_url, name)

    return make


def refused(response) -> int:
    """The 429's ``Retry-After`` in seconds."""
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "rate_limited" and "retry in" in error["message"], error
    return int(response.headers["Retry-After"])


def test_reads_and_writes_have_buckets_of_their_own(limited, client_for, admin, team_keys, job_spec) -> None:
    member = client_for(limited(reads_per_second=0.5, read_burst=4, writes_per_second=0.5, write_burst=2))
    assert [member.get("/v1/jobs").status_code for _ in range(4)] == [200] * 4
    wait = refused(member.get("/v1/jobs"))
    assert 1 <= wait <= 2  # one token at 0.5 a second
    assert "reads limit (0.5 per second, bursts of 4;" in member.get("/v1/me").json()["error"]["message"]

    job = member.post("/v1/jobs", json=job_spec())  # writes draw on the other bucket
    assert job.status_code == 201, job.text
    assert member.post(f"/v1/jobs/{job.json()['id']}/pause").status_code == 200
    refused(member.post(f"/v1/jobs/{job.json()['id']}/resume"))
    assert client_for(team_keys.alpha).get("/v1/jobs").status_code == 200  # another team's budget
    assert all(admin.get("/v1/jobs").status_code == 200 for _ in range(10))  # admins are not limited

    wait_until(lambda: member.get("/v1/jobs").status_code == 200, wait + 2, "a read token to refill")


def test_a_request_costs_one_token_more_per_8_kib_it_carries(limited, client_for, job_spec) -> None:
    member = client_for(limited(writes_per_second=0.05, write_burst=20, reads_per_second=0.05, read_burst=20))
    rows = [{"prompt": f"row {n} " + "z" * 180} for n in range(500)]
    body = json.dumps(job_spec(dataset={"prompts": rows})).encode()
    cost = 1 + len(body) // 8192
    assert 20 - cost < cost <= 19  # of 20: one such submit fits, a second does not, a small one does
    headers = {"Content-Type": "application/json"}
    big = member.post("/v1/jobs", content=body, headers=headers)
    assert big.status_code == 201, big.text
    refused(member.post("/v1/jobs", content=body, headers=headers))
    assert member.post("/v1/jobs", json=job_spec()).status_code == 201
    chunked = iter([body])  # no Content-Length: the body costs what it weighs all the same
    refused(member.post("/v1/jobs", content=chunked, headers=headers))

    # Reading the spec back pays one token before, and the answer's size after.
    answer = member.get(f"/v1/jobs/{big.json()['id']}")
    assert answer.status_code == 200 and len(answer.content) >= 10 * 8192
    left = 20 - 1 - len(answer.content) // 8192
    assert [member.get("/v1/me").status_code for _ in range(left)] == [200] * left
    refused(member.get("/v1/me"))


def test_a_yaml_body_costs_four_times_its_json(limited, client_for, job_spec) -> None:
    member = client_for(limited(writes_per_second=0.05, write_burst=20))
    spec = job_spec(dataset={"prompts": [{"prompt": f"row {n} " + "z" * 180} for n in range(150)]})
    as_yaml, as_json = yaml.safe_dump(spec).encode(), json.dumps(spec).encode()
    assert (1 + 4 * len(as_yaml) // 8192, 1 + len(as_json) // 8192) == (15, 4)  # of 20: 5 left after
    yaml_type, json_type = {"Content-Type": "application/yaml"}, {"Content-Type": "application/json"}
    assert member.post("/v1/jobs", content=as_yaml, headers=yaml_type).status_code == 201
    refused(member.post("/v1/jobs", content=as_yaml, headers=yaml_type))
    assert member.post("/v1/jobs", content=as_json, headers=json_type).status_code == 201


def test_every_api_process_draws_on_the_same_bucket(limited, client_for, serve_api, api_server) -> None:
    # One token back every 100 s: a loaded machine's slow requests never refill the bucket here.
    key = limited(reads_per_second=0.01, read_burst=4)
    with serve_api(api_server.settings) as other:
        here, there = client_for(key), client_for(key, other)
        assert [client.get("/v1/jobs").status_code for client in (here, there, here, there)] == [200] * 4
        refused(there.get("/v1/jobs"))
        refused(here.get("/v1/jobs"))


def test_without_redis_each_process_limits_on_its_own_and_nothing_fails(
        limited, client_for, serve_api, api_server, private_redis) -> None:
    key = limited(reads_per_second=0.2, read_burst=3)
    url, redis_process = private_redis
    with serve_api(api_server.settings.model_copy(update={"redis_url": url})) as server:
        member = client_for(key, server)
        assert member.get("/v1/jobs").status_code == 200  # through Redis
        redis_process.kill()
        redis_process.wait()
        started = time.monotonic()
        answers = [member.get("/v1/jobs").status_code for _ in range(4)]
        # Redis failed: this process's own bucket, full again, lets a burst through, then refuses.
        assert answers == [200, 200, 200, 429], answers
        assert time.monotonic() - started < 5  # no request waited out a Redis timeout
