"""``grpo metrics`` of a job that evaluates, through ``api.cli.main.main`` against the module's real
uvicorn server (Postgres and SQLite), the worker's own reporter writing the steps: the table gains
the eval columns, ``--eval`` keeps the eval points (step 0's evaluation before training first)
with their eval metrics, in text, CSV and JSON."""

from __future__ import annotations

import uuid

import pytest
from test_monitor_cli import Grpo

EVAL = {"eval_reward": 0.5, "eval_reward_std": 0.25, "eval_pass@k": 0.5, "eval_rewards/contains/mean": 0.5,
        "eval_completions/mean_length": 6.0, "eval_completions/clipped_ratio": 0.0, "timing/eval": 0.125}


@pytest.fixture
def grpo(capsys, api_server, team_keys) -> Grpo:
    return Grpo(capsys, api_server.http_url, team_keys.alpha)


@pytest.fixture
def evaluated_job(alpha, job_spec, worker) -> str:
    """Steps 0 (the evaluation before training), 1, 2 and 3, evaluating at 0 and 2."""
    response = alpha.post("/v1/jobs", json=job_spec(name=f"ev-{uuid.uuid4().hex[:6]}"))
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    worker.start(job_id)
    reporter = worker.reporter(job_id)
    reporter.on_step({"step": 0, **EVAL})
    for step in (1, 2, 3):
        record = {"step": step, "reward": 0.25 * step, "kl": 0.001}
        reporter.on_step({**record, **({**EVAL, "eval_reward": 0.75} if step == 2 else {})})
    return str(job_id)


def test_the_table_shows_every_step_with_the_eval_columns(grpo, evaluated_job) -> None:
    code, out, err = grpo("metrics", evaluated_job)
    lines = out.splitlines()
    assert code == 0 and err == ""
    assert lines[0].split() == ["STEP", "reward", "kl", "eval_reward", "eval_pass@k"]
    assert [line.split() for line in lines[1:]] == [["0", "-", "-", "0.5", "0.5"],
                                                    ["1", "0.25", "0.001", "-", "-"],
                                                    ["2", "0.5", "0.001", "0.75", "0.5"],
                                                    ["3", "0.75", "0.001", "-", "-"]]


def test_eval_keeps_the_eval_points_with_their_metrics(grpo, alpha, evaluated_job) -> None:
    code, out, _ = grpo("metrics", evaluated_job, "--eval")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["STEP", "eval_reward", "eval_reward_std", "eval_pass@k",
                                "eval_completions/mean_length", "eval_completions/clipped_ratio",
                                "timing/eval", "eval_rewards/contains/mean"]
    assert [line.split()[:2] for line in lines[1:]] == [["0", "0.5"], ["2", "0.75"]]
    assert grpo("metrics", evaluated_job, "--eval", "--csv", "--names", "eval_pass@k,reward")[1] == \
        "step,eval_pass@k,reward\n0,0.5,\n2,0.5,0.5\n"
    every = alpha.get(f"/v1/jobs/{evaluated_job}/metrics").json()["items"]
    assert grpo.json("metrics", evaluated_job, "--eval") == {"items": [every[0], every[2]],
                                                             "next_after": None}


def test_eval_says_when_a_job_has_no_eval_points(grpo, alpha, job_spec, worker) -> None:
    job_id = alpha.post("/v1/jobs", json=job_spec(name=f"ev-{uuid.uuid4().hex[:6]}")).json()["id"]
    worker.start(job_id)
    worker.step(job_id, 1)
    code, out, _ = grpo("metrics", str(job_id), "--eval")
    assert code == 0 and out.startswith("no eval steps yet")
    code, out, _ = grpo("metrics", str(job_id))  # no eval columns for a job that does not evaluate
    assert code == 0 and "eval" not in out.splitlines()[0]


def test_watch_draws_the_eval_reward_of_a_job_that_evaluates(grpo, worker, evaluated_job,
                                                             monkeypatch) -> None:
    worker.finish(int(evaluated_job))
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "72")
    code, out, _ = grpo("watch", evaluated_job)
    last = out.split("\x1b[J")[-1].splitlines()
    # Its two eval points (step 0's before training, and step 2's) beside training's three steps.
    assert code == 0 and last[2].split() == ["reward", "0.75", "▁▅█", "0.25..0.75"], last
    assert last[5].split() == ["eval", "reward", "0.75", "▁█", "0.5..0.75"], last
    assert max(map(len, last)) <= 71  # within the terminal's width
