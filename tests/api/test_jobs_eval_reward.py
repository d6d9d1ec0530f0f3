"""The jobs list's eval reward (issue 33 item 9): ``GET /v1/jobs`` and ``GET /v1/jobs/{id}`` carry
each job's latest eval point's ``eval_reward`` (null for a job that has not evaluated), found for a
whole page in one SQL statement, over the real server and database (jobs stepped by the scripted
worker)."""

from __future__ import annotations

from sqlalchemy import event

from api.schemas.jobs import JobRead
from api.store.db import get_engine, session_scope
from api.store.metric_series import with_eval_rewards


def test_a_page_of_jobs_carries_each_ones_latest_eval_reward(api, api_server, job_spec, worker) -> None:
    names = ("evals", "trains", "waits")
    ids = [api.post("/v1/jobs", json=job_spec(name=name)).json()["id"] for name in names]
    evals, trains, waits = ids
    for job_id in (evals, trains):
        worker.start(job_id)
    worker.reporter(evals).on_step({"step": 0, "eval_reward": 0.25, "eval_reward_std": 0.1})
    worker.step(evals, 1)
    worker.reporter(evals).on_step({"step": 2, "reward": 0.5, "eval_reward": 0.75})
    worker.step(evals, 3)  # trained past its last evaluation: that one still counts
    for step in (1, 2):
        worker.step(trains, step)

    page = api.get("/v1/jobs", params={"order": "desc", "limit": 3}).json()["items"]
    listed = {job["id"]: job["eval_reward"] for job in page}
    assert {job_id: listed[job_id] for job_id in ids} == {evals: 0.75, trains: None, waits: None}
    assert api.get(f"/v1/jobs/{evals}").json()["eval_reward"] == 0.75
    assert api.get(f"/v1/jobs/{trains}").json()["eval_reward"] is None
    with_specs = api.get("/v1/jobs", params={"order": "desc", "limit": 3, "include": "spec"}).json()["items"]
    assert [job["eval_reward"] for job in with_specs] == [None, None, 0.75]


def test_a_pages_eval_rewards_take_one_statement(api, api_server, job_spec, worker) -> None:
    ids = [api.post("/v1/jobs", json=job_spec(name=f"page-{n}")).json()["id"] for n in range(12)]
    for n, job_id in enumerate(ids[:6]):
        worker.start(job_id)
        worker.reporter(job_id).on_step({"step": 1, "reward": 0.1, "eval_reward": n / 10})
    jobs = [JobRead.model_validate(api.get(f"/v1/jobs/{job_id}").json()) for job_id in ids]
    url = api_server.settings.database_url
    statements: list[str] = []
    listen = lambda *args: statements.append(args[2])  # noqa: E731 (conn, cursor, statement, ...)
    event.listen(get_engine(url), "before_cursor_execute", listen)
    try:
        with session_scope(url) as session:
            found = with_eval_rewards(session, jobs)
    finally:
        event.remove(get_engine(url), "before_cursor_execute", listen)
    assert [job.eval_reward for job in found] == [n / 10 for n in range(6)] + [None] * 6
    assert len([s for s in statements if "job_metrics" in s]) == 1, statements
