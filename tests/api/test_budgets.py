"""GPU-hour budgets over real HTTP (Postgres and SQLite), with the worker's own store calls standing
in for a worker and allocations moved back in time by hand instead of waiting: a team's budget
per calendar period refuses every way into the queue and pauses its jobs, a job's own
``max_gpu_hours`` pauses it (the scheduler's pass, :func:`api.store.budgets.pause_over_budget`)
and refuses its resume until raised, ``GET /v1/usage`` says what is left, and the dry run of a
submit estimates GPU-hours. The same through the real scheduler and worker processes:
tests/worker/test_budget_runs.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from api.limits.budgets import period_bounds
from api.limits.gpu_estimate import Throughput
from api.store.attempts import stop_paused
from api.store.budgets import pause_over_budget
from api.store.db import session_scope
from api.store.tables import Allocation, Job, JobMetric

NO_HISTORY = Throughput(1000.0, 0.0, 0)


@pytest.fixture
def admin(client_for, team_keys):
    return client_for(team_keys.admin)


def error_of(response, param: str) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("budget_exhausted", param), error
    return error["message"]


def held_for(database_url: str, job_id: int, seconds: float) -> None:
    """The job's allocations as if it had held its GPUs ``seconds`` longer: each started that much
    earlier (an open one counts on up to now)."""
    with session_scope(database_url) as session:
        for row in session.query(Allocation).filter(Allocation.job_id == job_id):
            row.started_at = row.started_at - timedelta(seconds=seconds)


def scheduler_pass(api_server) -> list[int]:
    with session_scope(api_server.settings.database_url) as session:
        return pause_over_budget(session, api_server.settings)


def budget_of(client, team: str) -> dict:
    [budget] = [b for b in client.get("/v1/usage").json()["budgets"] if b["team"] == team]
    return budget


@pytest.mark.parametrize(("period", "now", "start", "end"), [
    ("day", datetime(2024, 2, 29, 23, 59, tzinfo=UTC), datetime(2024, 2, 29, tzinfo=UTC),
     datetime(2024, 3, 1, tzinfo=UTC)),
    ("week", datetime(2024, 3, 3, 12, tzinfo=UTC), datetime(2024, 2, 26, tzinfo=UTC),  # a Sunday
     datetime(2024, 3, 4, tzinfo=UTC)),
    ("week", datetime(2024, 3, 4, tzinfo=UTC), datetime(2024, 3, 4, tzinfo=UTC),  # a Monday's first instant
     datetime(2024, 3, 11, tzinfo=UTC)),
    ("month", datetime(2024, 12, 31, 23, 59, tzinfo=UTC), datetime(2024, 12, 1, tzinfo=UTC),
     datetime(2025, 1, 1, tzinfo=UTC)),
])
def test_periods_are_calendar_periods_in_utc(period, now, start, end) -> None:
    assert period_bounds(period, now) == (start, end)


def test_a_period_starts_by_utc_whatever_the_offset_of_now() -> None:
    # 2024-03-31 22:30 at UTC-3 is 2024-04-01 01:30 UTC: April's month, and Monday the 1st's week.
    late = datetime(2024, 3, 31, 22, 30, tzinfo=timezone(timedelta(hours=-3)))
    april = datetime(2024, 4, 1, tzinfo=UTC)
    assert period_bounds("month", late) == (april, datetime(2024, 5, 1, tzinfo=UTC))
    assert period_bounds("week", late)[0] == datetime(2024, 4, 1, tzinfo=UTC)


def test_a_team_over_its_budget_is_refused_everywhere_and_its_jobs_paused(admin, fresh_team, job_spec, worker,
                                                                         api_server) -> None:
    name, member = fresh_team
    url = api_server.settings.database_url
    running = member.post("/v1/jobs", json=job_spec(name="runs")).json()
    waiting = member.post("/v1/jobs", json=job_spec(name="waits")).json()
    ended = member.post("/v1/jobs", json=job_spec(name="ended")).json()
    member.post(f"/v1/jobs/{ended['id']}/cancel")
    worker.start(running["id"])
    # Monthly: the allocations moved back below stay in this period unless run in a month's first half hour.
    monthly = {"gpu_hours_budget": 0.5, "budget_period": "month"}
    limits = admin.put(f"/v1/admin/teams/{name}/limits", json=monthly)
    assert limits.status_code == 200 and limits.json()["limits"]["gpu_hours_budget"] == 0.5

    held_for(url, running["id"], 1000)  # 1000 GPU-seconds of 1800: under the budget
    assert scheduler_pass(api_server) == []
    budget = budget_of(member, name)
    assert budget["gpu_hours_budget"] == 0.5 and budget["period"] == "month"
    assert budget["used_gpu_hours"] == pytest.approx(1000 / 3600, abs=0.01)
    assert budget["left_gpu_hours"] == pytest.approx(0.5 - 1000 / 3600, abs=0.01)

    held_for(url, running["id"], 900)  # now over
    assert sorted(scheduler_pass(api_server)) == sorted([running["id"], waiting["id"]])
    assert scheduler_pass(api_server) == []  # pausing and paused: nothing more to stop
    assert member.get(f"/v1/jobs/{running['id']}").json()["status"] == "pausing"
    assert member.get(f"/v1/jobs/{waiting['id']}").json()["status"] == "paused"
    [event] = [e for e in member.get(f"/v1/jobs/{waiting['id']}/events").json()["items"]
               if e["type"] == "budget_reached"]
    assert event["level"] == "warning" and event["data"]["budget"] == "team"
    assert event["data"]["team"] == name and event["data"]["limit_gpu_hours"] == 0.5
    assert budget_of(member, name)["left_gpu_hours"] == 0

    message = error_of(member.post("/v1/jobs", json=job_spec()), "team.gpu_hours_budget")
    assert "of its 0.5 GPU-hours this month" in message and "UTC" in message
    error_of(member.post("/v1/jobs", params={"dry_run": "true"}, json=job_spec()), "team.gpu_hours_budget")
    error_of(member.post(f"/v1/jobs/{running['id']}/clone"), "team.gpu_hours_budget")
    error_of(member.post(f"/v1/jobs/{waiting['id']}/resume"), "team.gpu_hours_budget")
    error_of(member.post(f"/v1/jobs/{ended['id']}/retry"), "team.gpu_hours_budget")
    assert member.get(f"/v1/jobs/{waiting['id']}").json()["status"] == "paused"  # the resume rolled back

    # An admin raises it: the paused job resumes, and submits go through again.
    admin.put(f"/v1/admin/teams/{name}/limits", json={**monthly, "gpu_hours_budget": 2})
    assert member.post(f"/v1/jobs/{waiting['id']}/resume").json()["status"] == "queued"
    assert member.post("/v1/jobs", json=job_spec()).status_code == 201


def test_a_job_over_its_own_budget_pauses_with_an_event_and_a_webhook_delivery(
        admin, fresh_team, job_spec, worker, api_server) -> None:
    from webhook_receiver import receiver_url

    name, member = fresh_team
    url = api_server.settings.database_url
    hook = admin.post("/v1/webhooks", json={"url": receiver_url(9), "events": ["job.budget"], "team": name})
    assert hook.status_code == 201, hook.text
    spec = job_spec(name="capped", resources={"max_gpu_hours": 0.01})
    job = member.post("/v1/jobs", json=spec).json()
    assert job["spec"]["resources"]["max_gpu_hours"] == 0.01
    other = member.post("/v1/jobs", json=job_spec(name="uncapped")).json()
    worker.start(job["id"])
    worker.start(other["id"])
    held_for(url, other["id"], 10_000)  # no budget of its own, and its team has none
    held_for(url, job["id"], 30)  # 30 of 36 GPU-seconds
    assert scheduler_pass(api_server) == []
    held_for(url, job["id"], 10)

    assert scheduler_pass(api_server) == [job["id"]]
    assert member.get(f"/v1/jobs/{other['id']}").json()["status"] == "running"
    events = member.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    [asked] = [e for e in events if e["type"] == "pause_requested"]
    assert "budget is used up" in asked["message"]
    [reached] = [e for e in events if e["type"] == "budget_reached"]
    assert reached["data"]["budget"] == "job" and reached["data"]["limit_gpu_hours"] == 0.01
    assert reached["data"]["used_gpu_hours"] == pytest.approx(40 / 3600, abs=0.002)
    [delivery] = admin.get(f"/v1/webhooks/{hook.json()['id']}/deliveries").json()["items"]
    assert (delivery["event"], delivery["job_id"], delivery["status"]) == ("job.budget", job["id"], "pending")

    with session_scope(url) as session:  # the worker checkpoints at its next step and stops
        assert stop_paused(session, job["id"], "scripted", 3)
    message = error_of(member.post(f"/v1/jobs/{job['id']}/resume"), "resources.max_gpu_hours")
    assert f"PATCH /v1/jobs/{job['id']}" in message
    assert member.get(f"/v1/jobs/{job['id']}").json()["status"] == "paused"

    raised = member.patch(f"/v1/jobs/{job['id']}", json={"max_gpu_hours": 0.05})
    assert raised.status_code == 200 and raised.json()["spec"]["resources"]["max_gpu_hours"] == 0.05
    assert member.post(f"/v1/jobs/{job['id']}/resume").json()["status"] == "queued"
    removed = member.patch(f"/v1/jobs/{job['id']}", json={"max_gpu_hours": None}).json()
    assert "max_gpu_hours" not in removed["spec"]["resources"]
    with session_scope(url) as session:
        assert session.get(Job, job["id"]).max_gpu_hours is None
    for bad in (0, -1, "inf", 2e9):
        assert member.patch(f"/v1/jobs/{job['id']}", json={"max_gpu_hours": bad}).status_code == 422
    member.post(f"/v1/jobs/{job['id']}/cancel")
    assert member.patch(f"/v1/jobs/{job['id']}", json={"max_gpu_hours": 1}).status_code == 409


def test_a_dry_run_checks_everything_creates_nothing_and_estimates(fresh_team, job_spec, worker, api_server,
                                                                    pool) -> None:
    name, member = fresh_team
    url = api_server.settings.database_url
    spec = job_spec(name="guess", pool=pool, grpo={"max_steps": 20, "num_generations": 2,
                                                   "prompts_per_step": 2, "max_completion_length": 8})
    before = member.get("/v1/jobs").json()["items"]
    answer = member.post("/v1/jobs", params={"dry_run": "true"}, json=spec)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["dry_run"] is True and body["spec"]["priority"] == "normal"  # as it would be stored
    assert member.get("/v1/jobs").json()["items"] == before
    estimate = body["estimate"]
    # tests/specs.py's prompts: 10, 12, 11 and 29 characters, 15.5 on average: 4 tokens.
    assert (estimate["prompt_tokens"], estimate["tokens_per_step"], estimate["steps"]) == (4, 2 * 2 * 12, 20)
    assert estimate["tokens"] == 48 * 20 and estimate["basis"] == "default"
    assert estimate["tokens_per_gpu_second"] == api_server.settings.estimate_tokens_per_gpu_second
    assert estimate["gpu_hours"] == pytest.approx(960 / estimate["tokens_per_gpu_second"] / 3600)
    assert body["team_budget"]["team"] == name and body["team_budget"]["gpu_hours_budget"] is None
    bad = member.post("/v1/jobs", params={"dry_run": "true"}, json=job_spec(grpo={"num_generations": 1}))
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "grpo.num_generations"

    # A job of the pool succeeded: 3000 tokens from its first step record to its last, 30 s apart, is
    # 100 a GPU-second; it held its GPU 50 s for 3100 tokens, 31 s of them: 19 GPU-seconds beyond.
    done = member.post("/v1/jobs", json=spec).json()
    worker.start(done["id"])
    worker.burst(done["id"], range(1, 21))
    first = datetime(2020, 1, 1, tzinfo=UTC)
    with session_scope(url) as session:
        for step, tokens, seconds in ((1, 100, 0), (20, 3100, 30)):
            session.execute(update(JobMetric).where(JobMetric.job_id == done["id"], JobMetric.step == step)
                            .values(payload={"step": step, "num_tokens": tokens},
                                    ts=first + timedelta(seconds=seconds)))
    worker.finish(done["id"])
    with session_scope(url) as session:
        session.execute(update(Allocation).where(Allocation.job_id == done["id"])
                        .values(started_at=first, ended_at=first + timedelta(seconds=50)))
    measured = member.post("/v1/jobs", params={"dry_run": "true"}, json=spec).json()["estimate"]
    assert (measured["basis"], measured["measured_jobs"]) == ("measured", 1)
    assert measured["tokens_per_gpu_second"] == pytest.approx(100)
    assert measured["startup_gpu_seconds"] == pytest.approx(19)
    assert measured["gpu_hours"] == pytest.approx((19 + 960 / 100) / 3600)


def test_the_rate_is_the_steady_one_and_start_up_the_rest() -> None:
    from api.limits.gpu_estimate import PastRun, measured

    one_gpu = PastRun(gpus=1, held_gpu_seconds=110, tokens=1000, steady_tokens=900, steady_seconds=90)
    two_gpus = PastRun(gpus=2, held_gpu_seconds=60, tokens=400, steady_tokens=200, steady_seconds=10)
    # (900 + 200) tokens over (90 + 2 × 10) GPU-seconds: 10 a GPU-second; beyond it, 110 - 100 on
    # one GPU and (60 - 40) / 2 on each of two: 10 GPU-seconds a GPU.
    both = measured([one_gpu, two_gpus])
    assert (both.tokens_per_gpu_second, both.startup_gpu_seconds, both.jobs) == (10, 10, 2)
    single_steps = [PastRun(gpus=1, held_gpu_seconds=8, tokens=40, steady_tokens=0, steady_seconds=0)]
    assert measured(single_steps) == Throughput(5.0, 0.0, 1)  # no span to tell the rate from start-up
    idle = PastRun(gpus=1, held_gpu_seconds=5, tokens=0, steady_tokens=0, steady_seconds=0)
    assert measured([]) is None and measured([idle]) is None
    fast = PastRun(gpus=1, held_gpu_seconds=1, tokens=1000, steady_tokens=900, steady_seconds=1)
    assert measured([fast]).startup_gpu_seconds == 0  # never below none


def test_an_estimate_counts_what_the_shape_generates() -> None:
    from specs import tiny_spec

    from api.domain.job_spec import JobSpec
    from api.limits.gpu_estimate import estimate

    chat = [{"prompt": [{"role": "system", "content": "x" * 30}, {"role": "user", "content": "y" * 10}]}]
    spec = JobSpec.model_validate(tiny_spec(dataset={"prompts": chat}, resources={"gpus": 2}, grpo={
        "max_steps": 9, "num_iterations": 2, "max_prompt_length": 64, "max_completion_length": 20}))
    guess = estimate(spec, Throughput(100.0, 3.0, 1), "measured")
    assert guess.prompt_tokens == 10  # 40 characters of messages
    assert guess.tokens_per_step == 2 * 2 * (10 + 20)
    assert guess.tokens == 120 * 5  # 9 steps, each round trained twice: 5 that generate
    assert guess.gpu_hours == pytest.approx((2 * 3 + 600 / 100) / 3600)  # start-up on each of 2 GPUs
    long_prompts = JobSpec.model_validate(tiny_spec(dataset={"prompts": [{"prompt": "z" * 1000}]},
                                                    grpo={"max_prompt_length": 32}))
    assert estimate(long_prompts, NO_HISTORY, "default").prompt_tokens == 32  # truncated as the job would
    by_epochs = JobSpec.model_validate(tiny_spec(dataset={"source": "path:prompts.jsonl"},
                                                 grpo={"max_steps": -1, "max_prompt_length": 50}))
    unknown = estimate(by_epochs, NO_HISTORY, "default")
    assert (unknown.prompt_tokens, unknown.steps, unknown.gpu_hours) == (50, None, None)


def grpo(capsys, server, token: str, *argv: str) -> tuple[int, str, str]:
    from api.cli.main import main

    capsys.readouterr()
    code = main([*argv, "--api-url", server.http_url, "--api-key", token])
    out, err = capsys.readouterr()
    return code, out, err


def test_grpo_estimates_a_spec_and_sets_a_jobs_budget(capsys, api_server, api, api_token, job_spec,
                                                      tmp_path) -> None:
    import json

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec(name="cli-guess")))
    before = [job["id"] for job in api.get("/v1/jobs").json()["items"]]
    code, out, _ = grpo(capsys, api_server, api_token, "submit", str(spec), "--estimate")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("job cli-guess in pool default: about ") and "GPU-hours (20 steps)" in lines[0]
    assert "48 tokens a step (4 prompt tokens" in lines[1] and "tokens per GPU-second" in lines[2]
    assert lines[-1] == "nothing was submitted (a dry run)"
    code, out, _ = grpo(capsys, api_server, api_token, "submit", str(spec), "--estimate", "--json")
    assert code == 0 and json.loads(out)["dry_run"] is True
    assert [job["id"] for job in api.get("/v1/jobs").json()["items"]] == before

    job = api.post("/v1/jobs", json=job_spec(name="cli-budget")).json()
    code, out, _ = grpo(capsys, api_server, api_token, "set-budget", str(job["id"]), "0.5")
    assert code == 0 and out.strip() == f"job {job['id']} (queued) has a budget of 0.5 GPU-hours"
    assert api.get(f"/v1/jobs/{job['id']}").json()["spec"]["resources"]["max_gpu_hours"] == 0.5
    api.post(f"/v1/jobs/{job['id']}/pause")
    code, out, _ = grpo(capsys, api_server, api_token, "set-budget", str(job["id"]), "none")
    assert code == 0 and "no budget of its own; `grpo resume" in out
    with pytest.raises(SystemExit) as refused:  # argparse: not a number of GPU-hours
        grpo(capsys, api_server, api_token, "set-budget", str(job["id"]), "0")
    assert refused.value.code == 2
    api.post(f"/v1/jobs/{job['id']}/cancel")
    code, _, err = grpo(capsys, api_server, api_token, "set-budget", str(job["id"]), "2")
    assert code == 2 and "already cancelled" in err
