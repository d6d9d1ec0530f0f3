"""``/v1/jobs`` over real HTTP: a uvicorn server on Postgres and on SQLite (``api_server``)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, func, pool, select

from api.store.tables import Job, JobEvent


def row_counts(database_url: str) -> tuple[int, int]:
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return (
                conn.scalar(select(func.count()).select_from(Job)),
                conn.scalar(select(func.count()).select_from(JobEvent)),
            )
    finally:
        engine.dispose()


def submit(api, spec: dict, **headers) -> dict:
    response = api.post("/v1/jobs", json=spec, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


def test_submit_queues_the_job(api, job_spec, api_server) -> None:
    from api.store.db import session_scope
    from api.store.pools import ensure_pool

    with session_scope(api_server.settings.database_url) as session:
        ensure_pool(session, "a100")  # a pool its workers have not registered yet: any size fits
    spec = job_spec(name="first", priority="high", resources={"gpus": 2, "pool": "a100"})
    response = api.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["name"] == "first" and job["status"] == "queued" and job["priority"] == "high"
    assert (job["pool"], job["gpus"], job["max_steps"], job["last_step"]) == ("a100", 2, 20, 0)
    assert job["spec"]["grpo"]["num_generations"] == 2
    assert job["spec"]["grpo"]["beta"] == 0.04  # defaults are filled in
    assert job["error"] is None and job["attempt"] == 0
    # No scheduler runs in these tests: a read says so (tests/api/test_no_scheduler.py).
    assert api.get(f"/v1/jobs/{job['id']}").json() == {**job, "pending_reason": "no_scheduler"}
    events = api.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    assert [e["type"] for e in events] == ["queued"]


def test_idempotency_key_replays_or_conflicts(api, api_server, job_spec) -> None:
    first = submit(api, job_spec(name="idem"), **{"Idempotency-Key": "k-123"})
    before = row_counts(api_server.settings.database_url)
    replay = api.post("/v1/jobs", json=job_spec(name="idem"), headers={"Idempotency-Key": "k-123"})
    assert replay.status_code == 200 and replay.json() == first
    clash = api.post("/v1/jobs", json=job_spec(name="other"), headers={"Idempotency-Key": "k-123"})
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "conflict"
    assert clash.json()["error"]["param"] == "Idempotency-Key"
    assert row_counts(api_server.settings.database_url) == before
    assert submit(api, job_spec(name="idem"), **{"Idempotency-Key": "k-456"})["id"] != first["id"]
    empty = api.post("/v1/jobs", json=job_spec(name="idem"), headers={"Idempotency-Key": ""})
    assert empty.status_code == 422 and empty.json()["error"]["param"] == "Idempotency-Key"


def test_concurrent_retries_with_one_key_make_one_job(api, api_server, job_spec) -> None:
    from concurrent.futures import ThreadPoolExecutor

    before = row_counts(api_server.settings.database_url)
    with ThreadPoolExecutor(8) as pool:
        responses = list(
            pool.map(
                lambda _: api.post(
                    "/v1/jobs", json=job_spec(name="race"), headers={"Idempotency-Key": "race"}
                ),
                range(8),
            )
        )
    assert sorted(r.status_code for r in responses) == [200] * 7 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert row_counts(api_server.settings.database_url) == (before[0] + 1, before[1] + 1)


def test_concurrent_retries_with_one_key_and_two_bodies_make_one_job(api, api_server, job_spec) -> None:
    from concurrent.futures import ThreadPoolExecutor

    before = row_counts(api_server.settings.database_url)
    names = ["race-a", "race-b"] * 4
    with ThreadPoolExecutor(8) as pool:
        responses = list(
            pool.map(
                lambda name: api.post(
                    "/v1/jobs", json=job_spec(name=name), headers={"Idempotency-Key": "race-2"}
                ),
                names,
            )
        )
    winner = next(r.json() for r in responses if r.status_code == 201)
    assert sorted(r.status_code for r in responses) == [200] * 3 + [201] + [409] * 4
    for name, response in zip(names, responses, strict=True):
        if name == winner["name"]:
            assert response.json() == winner
        else:
            assert response.json()["error"]["param"] == "Idempotency-Key"
    assert row_counts(api_server.settings.database_url) == (before[0] + 1, before[1] + 1)


def test_the_same_body_without_a_key_makes_a_new_job_each_time(api, api_server, job_spec) -> None:
    before = row_counts(api_server.settings.database_url)
    first, second = (submit(api, job_spec(name="no-key")) for _ in range(2))
    assert first["id"] != second["id"] and first["spec"] == second["spec"]
    assert row_counts(api_server.settings.database_url) == (before[0] + 2, before[1] + 2)
    events = api.get(f"/v1/jobs/{second['id']}/events").json()["items"]
    assert [(e["type"], e["data"]) for e in events] == [("queued", {"priority": "normal", "pool": "default"})]


def test_list_filters_by_status_and_pages_by_cursor(api, worker, job_spec) -> None:
    start = submit(api, job_spec(name="mark"))["id"]
    ids = [submit(api, job_spec(name=f"list-{i}"))["id"] for i in range(5)]
    worker.start(ids[1])
    worker.start(ids[3])
    seen, after = [], start
    while after is not None:
        page = api.get("/v1/jobs", params={"after": after, "limit": 2}).json()
        assert len(page["items"]) <= 2
        seen += [job["id"] for job in page["items"]]
        after = page["next_after"]
    assert seen == ids
    newest, after = [], 0  # order=desc: newest first, and `after` continues downwards
    while len(newest) < 6:
        page = api.get("/v1/jobs", params={"after": after, "limit": 2, "order": "desc"}).json()
        newest += [job["id"] for job in page["items"]]
        after = page["next_after"]
    assert newest == [*reversed(ids), start]
    running_desc = api.get("/v1/jobs", params={"status": "running", "order": "desc", "limit": 2}).json()
    assert [job["id"] for job in running_desc["items"]] == [ids[3], ids[1]]
    running = api.get("/v1/jobs", params={"after": start, "status": "running"}).json()
    assert [job["id"] for job in running["items"]] == [ids[1], ids[3]] and running["next_after"] is None
    both = api.get("/v1/jobs", params=[("after", start), ("status", "running"), ("status", "queued")]).json()
    assert [job["id"] for job in both["items"]] == ids
    bad = api.get("/v1/jobs", params={"status": "sleeping"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "status"
    too_many = api.get("/v1/jobs", params={"limit": 101})
    assert too_many.status_code == 422 and too_many.json()["error"]["code"] == "invalid_request"
    assert too_many.json()["error"]["param"] == "limit"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/jobs/999999",
        "/v1/jobs/999999/events",
        "/v1/jobs/999999/metrics",
        "/v1/jobs/999999/samples",
        "/v1/jobs/999999/checkpoints",
    ],
)
def test_unknown_job_is_404(api, path: str) -> None:
    response = api.get(path)
    assert response.status_code == 404
    expected = {"code": "not_found", "message": "job 999999 not found", "param": "job_id"}
    assert response.json() == {"error": expected}
    assert api.post("/v1/jobs/999999/cancel").status_code == 404


def test_cancel_queued_running_and_finished(api, worker, job_spec) -> None:
    queued, running, done = (submit(api, job_spec(name=n))["id"] for n in ("q", "r", "d"))
    cancelled = api.post(f"/v1/jobs/{queued}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["finished_at"] is not None
    worker.start(running)
    cancelling = api.post(f"/v1/jobs/{running}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancel_requested"] is True
    assert api.post(f"/v1/jobs/{running}/cancel").json()["status"] == "cancelling"  # asking twice is fine
    worker.start(done)
    worker.finish(done, "succeeded")
    for job_id, status in ((done, "succeeded"), (queued, "cancelled")):
        again = api.post(f"/v1/jobs/{job_id}/cancel")
        assert again.status_code == 409, again.text
        assert again.json()["error"] == {
            "code": "conflict",
            "message": f"job {job_id} already {status}",
            "param": "job_id",
        }


def test_events_page_by_cursor(api, worker, job_spec) -> None:
    job_id = submit(api, job_spec())["id"]
    worker.start(job_id)
    for n in range(3):
        worker.event(job_id, "checkpoint", f"saved {n}", {"n": n})
    first = api.get(f"/v1/jobs/{job_id}/events", params={"limit": 2}).json()
    assert [e["type"] for e in first["items"]] == ["queued", "dispatched"]
    second = api.get(f"/v1/jobs/{job_id}/events", params={"after": first["next_after"], "limit": 10}).json()
    assert [e["type"] for e in second["items"]] == ["running", "checkpoint", "checkpoint", "checkpoint"]
    assert second["next_after"] is None and second["items"][-1]["data"] == {"n": 2}
    assert set(second["items"][0]) == {"id", "job_id", "ts", "level", "type", "message", "data"}


def test_metrics_filter_by_step_limit_and_names(api, worker, job_spec) -> None:
    job_id = submit(api, job_spec())["id"]
    worker.start(job_id)
    records = [worker.step(job_id, step) for step in range(1, 8)]
    everything = api.get(f"/v1/jobs/{job_id}/metrics").json()
    assert [m["values"] for m in everything["items"]] == records and everything["next_after"] is None
    page = api.get(f"/v1/jobs/{job_id}/metrics", params={"after_step": 2, "limit": 3}).json()
    assert [m["step"] for m in page["items"]] == [3, 4, 5] and page["next_after"] == 5
    rest = api.get(f"/v1/jobs/{job_id}/metrics", params={"after_step": 5, "limit": 3}).json()
    assert [m["step"] for m in rest["items"]] == [6, 7] and rest["next_after"] is None
    names = [("names", "reward,kl"), ("names", "clip_ratio/region_mean")]
    named = api.get(f"/v1/jobs/{job_id}/metrics", params=[*names, ("after_step", 6)]).json()
    assert named["items"][0]["values"] == {
        "step": 7,
        "reward": records[6]["reward"],
        "kl": records[6]["kl"],
        "clip_ratio/region_mean": 0.02,
    }
    assert api.get(f"/v1/jobs/{job_id}").json()["last_step"] == 7


def test_samples_and_checkpoints(api, worker, job_spec) -> None:
    from api.store import telemetry
    from api.store.db import session_scope

    job_id = submit(api, job_spec())["id"]
    worker.start(job_id)
    for step in (10, 20):
        worker.samples(job_id, step, [{"prompt": "2+3?", "completion": str(step), "reward": 1.0}])
    with session_scope(worker.database_url) as session:
        telemetry.record_checkpoint(session, job_id, 10, "/artifacts/1/step-10", 1)
        telemetry.record_checkpoint(session, job_id, 20, "/artifacts/1/step-20", 1)
    samples = api.get(f"/v1/jobs/{job_id}/samples").json()["items"]
    assert [s["step"] for s in samples] == [20, 10] and samples[0]["rows"][0]["completion"] == "20"
    one = api.get(f"/v1/jobs/{job_id}/samples", params={"step": 10}).json()["items"]
    assert [s["step"] for s in one] == [10]
    checkpoints = api.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    assert [(c["step"], c["path"], c["attempt"]) for c in checkpoints] == [
        (10, "/artifacts/1/step-10", 1),
        (20, "/artifacts/1/step-20", 1),
    ]


BAD_SPECS = [
    # (what to change, the param the 422 must name)
    ({"grpo": {"num_generations": 1}}, "grpo.num_generations"),
    ({"grpo": {"temperature": 0}}, "grpo.temperature"),
    ({"surprise": True}, "surprise"),
    ({"model": {"source": "path:tiny", "dtype": "int3"}}, "model.dtype"),
    ({"model": {"source": "ftp://example.com/model"}}, "model.source"),
    ({"rewards": [{"name": "no_such_reward"}]}, "rewards.0.name"),
    (
        {"rewards": [{"name": "exact_match"}, {"name": "exact_match", "args": {"strip": "maybe"}}]},
        "rewards.1.args.strip",
    ),
    ({"rewards": [{"name": "exact_match", "args": {"colour": "red"}}]}, "rewards.0.args.colour"),
    ({"model": {"source": "path:../outside"}}, "model.source"),
    ({"model": {"source": "path:/etc"}}, "model.source"),
    ({"model": {"source": "path:escape"}}, "model.source"),  # a symlink inside the root, leading out
    ({"model": {"source": "path:missing"}}, "model.source"),
    ({"dataset": {"source": "path:nope.jsonl"}}, "dataset.source"),
    ({"dataset": {"source": "path:leak.jsonl"}}, "dataset.source"),
    ({"dataset": {"source": "path:../outside/secret.jsonl"}}, "dataset.source"),
    ({"dataset": {"prompts": [{"prompt": "x"}], "source": "path:prompts.jsonl"}}, "dataset"),
    ({"resources": {"gpus": 1, "sharding": "fsdp"}}, "resources.sharding"),  # nothing to shard over
    ({"resources": {"sharding": "zero3"}}, "resources.sharding"),
]


@pytest.mark.parametrize(("change", "param"), BAD_SPECS, ids=[param for _, param in BAD_SPECS])
def test_bad_spec_is_422_naming_the_field_and_writes_nothing(
    api, api_server, job_spec, change, param
) -> None:
    before = row_counts(api_server.settings.database_url)
    response = api.post("/v1/jobs", json=job_spec(**change), headers={"Idempotency-Key": f"bad-{param}"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_spec" and error["param"] == param, error
    assert error["message"].startswith(f"{param}: ")
    assert str(api_server.settings.models_root) not in error["message"]  # server paths stay private
    assert row_counts(api_server.settings.database_url) == before


def test_every_invalid_field_is_listed(api, job_spec) -> None:
    spec = job_spec(grpo={"num_generations": 1, "beta": -1, "max_steps": 0}, bogus=1)
    error = api.post("/v1/jobs", json=spec).json()["error"]
    params = [e["param"] for e in error["errors"]]
    assert error["param"] == params[0]
    assert set(params) == {"grpo.num_generations", "grpo.beta", "grpo.max_steps", "bogus"}
    assert all(e["message"] for e in error["errors"])


def test_valid_path_sources_are_accepted(api, job_spec, service_roots) -> None:
    absolute = f"path:{service_roots['models'] / 'tiny'}"
    job = submit(api, job_spec(model={"source": absolute}, dataset={"source": "path:prompts.jsonl"}))
    assert job["spec"]["dataset"]["source"] == "path:prompts.jsonl"
    assert submit(api, job_spec(model={"source": "hf:Qwen/Qwen2.5-0.5B-Instruct"}))["status"] == "queued"


def test_malformed_json_is_422(api, api_server) -> None:
    before = row_counts(api_server.settings.database_url)
    response = api.post("/v1/jobs", content=b'{"name": ', headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]["param"] == "body"
    assert api.post("/v1/jobs", json=[1, 2]).status_code == 422
    assert row_counts(api_server.settings.database_url) == before


def test_body_over_the_limit_is_413_declared_or_streamed(api, api_server, job_spec) -> None:
    before = row_counts(api_server.settings.database_url)
    big = job_spec(dataset={"prompts": [{"prompt": "x" * 1000, "answer": "y"}] * 1100})  # ~1.1 MiB
    declared = api.post("/v1/jobs", json=big)
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: httpx sends it chunked
        for _ in range(20):
            yield b" " * 65536

    streamed = api.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413, streamed.text
    assert row_counts(api_server.settings.database_url) == before
    assert submit(api, job_spec(dataset={"prompts": [{"prompt": "x" * 1000}] * 900}))["id"]  # under 1 MiB


def test_auth_is_required(api_server, api_token, job_spec) -> None:
    import httpx

    with httpx.Client(base_url=api_server.http_url, trust_env=False) as anonymous:
        missing = anonymous.get("/v1/jobs")
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["code"] == "unauthorized"
        for header in ("Bearer wrong-token", "Basic dXNlcjpwYXNz", "Bearer"):
            assert anonymous.get("/v1/jobs", headers={"Authorization": header}).status_code == 401
        assert anonymous.get("/v1/jobs", params={"token": api_token}).status_code == 401  # never in a URL
        before = row_counts(api_server.settings.database_url)
        assert anonymous.post("/v1/jobs", json=job_spec()).status_code == 401
        assert row_counts(api_server.settings.database_url) == before
        assert anonymous.get("/v1/rewards").status_code == 401
        assert anonymous.get("/healthz").status_code == 200  # probes stay open


def test_a_spec_may_be_submitted_as_yaml(api, api_server, job_spec) -> None:
    """The same spec as a YAML body is the same job; YAML errors, aliases and bad fields are 422s
    with the JSON path's field names, and the size limit holds."""
    import yaml

    spec = job_spec(name="from-yaml")
    as_yaml = api.post("/v1/jobs", content=yaml.safe_dump(spec), headers={"Content-Type": "application/yaml"})
    assert as_yaml.status_code == 201, as_yaml.text
    as_json = api.post("/v1/jobs", json=spec).json()
    assert {k: v for k, v in as_yaml.json().items() if k not in ("id", "created_at")} == {
        k: v for k, v in as_json.items() if k not in ("id", "created_at")}

    def post_yaml(text: str, media: str = "application/x-yaml; charset=utf-8"):
        return api.post("/v1/jobs", content=text.encode(), headers={"Content-Type": media})

    broken = post_yaml("name: [unclosed\n")
    assert broken.status_code == 422 and broken.json()["error"]["param"] == "body"
    aliased = post_yaml("a: &x [1, 2]\nb: *x\n")  # aliases could expand exponentially: refused
    assert aliased.status_code == 422 and "aliases" in aliased.json()["error"]["message"]
    bad = post_yaml(yaml.safe_dump(job_spec(grpo={"num_generations": 1})), "text/yaml")
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "grpo.num_generations"
    huge = post_yaml("name: " + "x" * (api_server.settings.max_request_bytes + 1))
    assert huge.status_code == 413
    assert "application/yaml" in api.get("/openapi.json").json()["paths"]["/v1/jobs"]["post"]["requestBody"][
        "content"]


def test_a_priority_change_is_one_value_in_the_row_and_the_spec(api, job_spec) -> None:
    job = submit(api, job_spec(priority="low"))
    changed = api.patch(f"/v1/jobs/{job['id']}", json={"priority": "high"}).json()
    read = api.get(f"/v1/jobs/{job['id']}").json()
    for seen in (changed, read):
        assert (seen["priority"], seen["spec"]["priority"]) == ("high", "high")
    assert read["spec"] == {**job["spec"], "priority": "high"}  # nothing else in the spec moved


def test_a_failures_traceback_is_shown_to_admins_only(api, api_server, worker, job_spec, client_for,
                                                      make_key) -> None:
    from api.domain.lifecycle import JobStatus
    from api.store import attempts
    from api.store.db import session_scope

    job_id = submit(api, job_spec(name="fails"))["id"]
    worker.start(job_id)
    lines = 'Traceback (most recent call last):\n  File "reward.py", line 3\nValueError: bad row'
    with session_scope(api_server.settings.database_url) as session:
        assert attempts.finish(session, job_id, worker_id="scripted", outcome=JobStatus.FAILED,
                               message="bad row", error_code="reward_error", error_message="bad row",
                               traceback=lines)
    member = client_for(make_key(api_server.settings.database_url, "default"))  # same team, no admin
    for client, expected in ((api, lines), (member, None)):
        read = client.get(f"/v1/jobs/{job_id}").json()
        assert read["error"] == {"code": "reward_error", "message": "bad row", "traceback": expected}
        listed = client.get("/v1/jobs", params={"status": "failed", "order": "desc", "limit": 1}).json()
        assert listed["items"][0]["error"]["traceback"] == expected
