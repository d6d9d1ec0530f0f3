"""The evaluation before training (``grpo.eval_on_start``) is the record at step 0, written by
the worker's own reporter like every step: each reader serves it by default — the metrics
listing, the samples listing, the WebSocket's backlog and live tail, the CLI client's pages and
``GET /v1/jobs/compare`` — and a cursor at step 0 still means "after it"."""

from __future__ import annotations

import json

from test_stream import open_stream, read_n, read_until_closed, steps_of

from api.cli.client import ApiClient
from api.store.db import session_scope
from api.store.tables import JobMetric
from api.streaming.cursor import Cursor

EVAL_ZERO = {"step": 0, "eval_reward": 0.25, "eval_reward_std": 0.5, "eval_pass@k": 0.5,
             "eval_completions/mean_length": 6.0, "timing/eval": 0.1}
EVAL_ROWS = [{"step": 0, "split": "eval", "prompt": "2+3?", "completion": "5", "reward": 1.0,
              "advantage": None}]


def started_with_eval(api, job_spec, worker) -> int:
    """A running job whose worker reported step 0's evaluation and its samples, then step 1."""
    response = api.post("/v1/jobs", json=job_spec())
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    worker.start(job_id)
    reporter = worker.reporter(job_id)
    reporter.on_step(EVAL_ZERO)
    reporter.on_samples(0, EVAL_ROWS)
    worker.step(job_id, 1)
    return job_id


def test_the_cursor_starts_before_step_zero() -> None:
    cursor = Cursor()
    assert cursor.admit("metrics", {"step": 0}) and not cursor.admit("metrics", {"step": 0})
    assert cursor.admit("samples", {"step": 0})
    assert not Cursor(step=0).admit("metrics", {"step": 0})  # `after=0`: step 0 is already had


def test_step_zero_is_a_row_of_its_own_in_sql(api, api_server, job_spec, worker) -> None:
    job_id = started_with_eval(api, job_spec, worker)
    with session_scope(api_server.settings.database_url) as session:
        rows = session.query(JobMetric).filter_by(job_id=job_id).order_by(JobMetric.step).all()
        assert [(row.step, row.payload) for row in rows][0] == (0, EVAL_ZERO)
        assert [row.step for row in rows] == [0, 1]


def test_the_metrics_listing_serves_step_zero_by_default(api, job_spec, worker) -> None:
    job_id = started_with_eval(api, job_spec, worker)
    items = api.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    assert [item["step"] for item in items] == [0, 1] and items[0]["values"] == EVAL_ZERO
    first = api.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 1}).json()
    assert [item["step"] for item in first["items"]] == [0] and first["next_after"] == 0
    rest = api.get(f"/v1/jobs/{job_id}/metrics", params={"after_step": 0}).json()["items"]
    assert [item["step"] for item in rest] == [1]
    picked = api.get(f"/v1/jobs/{job_id}/metrics", params={"names": "eval_reward"}).json()["items"]
    assert [item["values"] for item in picked] == [{"step": 0, "eval_reward": 0.25}, {"step": 1}]
    below = api.get(f"/v1/jobs/{job_id}/metrics", params={"after_step": -2})
    assert below.status_code == 422 and "after_step" in below.text


def test_the_samples_listing_serves_step_zeros_eval_samples(api, job_spec, worker) -> None:
    job_id = started_with_eval(api, job_spec, worker)
    only = api.get(f"/v1/jobs/{job_id}/samples", params={"step": 0}).json()["items"]
    assert only == [{"step": 0, "rows": EVAL_ROWS}]
    assert [item["step"] for item in api.get(f"/v1/jobs/{job_id}/samples").json()["items"]] == [0]
    below = api.get(f"/v1/jobs/{job_id}/samples", params={"step": -1})
    assert below.status_code == 422 and "step" in below.text


def test_the_streams_backlog_sends_step_zero_and_after_zero_skips_it(api, api_server, api_token, job_spec,
                                                                    worker) -> None:
    job_id = started_with_eval(api, job_spec, worker)
    with open_stream(api_server, job_id, api_token) as ws:
        backlog = read_n(ws, 7)  # 3 events, 2 metrics, 1 samples, the status
    assert steps_of(backlog) == [0, 1] and steps_of(backlog, "samples") == [0]
    assert [m["values"] for m in backlog if m["type"] == "metrics"][0] == EVAL_ZERO
    worker.finish(job_id)
    with open_stream(api_server, job_id, api_token, after=0) as ws:
        messages, code = read_until_closed(ws)
    assert code == 1000 and steps_of(messages) == [1] and steps_of(messages, "samples") == []


def test_the_stream_sends_a_live_step_zero(api, api_server, api_token, job_spec, worker) -> None:
    """Connected before the evaluation finished: step 0 comes from Redis, once."""
    response = api.post("/v1/jobs", json=job_spec())
    job_id = response.json()["id"]
    worker.start(job_id)
    with open_stream(api_server, job_id, api_token) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "event"
        worker.reporter(job_id).on_step(EVAL_ZERO)
        worker.finish(job_id)
        messages, code = read_until_closed(ws)
    assert code == 1000 and steps_of(messages) == [0]


def test_the_cli_client_pages_and_watch_include_step_zero(api, api_server, api_token, job_spec, worker,
                                                          monkeypatch) -> None:
    job_id = started_with_eval(api, job_spec, worker)
    monkeypatch.setattr("api.cli.client.TELEMETRY_PAGE", 1)  # a page per step: step 0 is the first page's
    client = ApiClient(api_server.http_url, api_token)
    assert [item["step"] for item in client.metrics(job_id)["items"]] == [0, 1]
    assert client.metrics(job_id, ["eval_reward"])["items"][0]["values"] == {"step": 0, "eval_reward": 0.25}
    worker.finish(job_id)
    seen: list[dict] = []
    assert client.watch(job_id, seen.append) == "succeeded"
    assert steps_of(seen) == [0, 1] and steps_of(seen, "samples") == [0]


def test_compare_plots_step_zero(api, job_spec, worker) -> None:
    ids = [started_with_eval(api, job_spec, worker) for _ in range(2)]
    body = api.get("/v1/jobs/compare", params={"ids": ",".join(map(str, ids)),
                                               "metrics": "eval_reward,reward"}).json()
    assert body["metrics"]["eval_reward"] == {str(job_id): [[0, 0.25]] for job_id in ids}
    assert body["metrics"]["reward"] == {str(job_id): [[1, 0.01]] for job_id in ids}
    assert {"eval_reward", "eval_pass@k"} <= set(body["metric_names"])
