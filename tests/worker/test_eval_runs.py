"""Evaluation during training through the real service (issue 25's "Done when"): jobs with an
``eval_dataset`` submitted over HTTP to ``grpo api``, dispatched by the scheduler process, trained
by a Celery worker with 2 CPU slots, on Postgres and Redis. Their eval metrics are in SQL at steps
0, N, 2N, ... and the last step, arrive over the WebSocket, are charted in TensorBoard under TRL's
``eval/`` names, and are the same on 1 and 2 ranks and across a pause and a resume.

One test, three jobs of one spec: the comparisons need the uninterrupted 1-rank run, and each
service process and job costs seconds of imports on the 2-core machine the suite is sized for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from tensorboard_events import read_scalar_events
from waiting import wait_until

from api.artifacts.paths import tensorboard_dir
from api.cli.client import ApiClient
from api.store.db import session_scope
from api.store.tables import JobMetric, JobSample
from grpo_core.algorithm.eval_metrics import EVAL_SPLIT
from grpo_core.run.tracking import tracker_name

pytestmark = pytest.mark.slow

TOKEN = "eval-runs-operator-token-3d9a61c0"
STEPS, EVERY = 8, 3
EVAL_POINTS = [0, 3, 6, 8]  # eval_on_start, every EVERY steps, and the final step always
# Prompts of their own, so the eval reward is not the training reward: the tiny random model says
# "the" in some completions and not in others (tests/grpo_core/test_evaluation.py); the length
# reward gives each eval point figures that are not whole fractions of the prompt count.
EVAL_PROMPTS = ["hello world", "the answer is", "two plus two", "let me think", "first then"]
# Two CPU slots, and a bounded wait in the ranks' collectives so a lost rank fails the test.
WORKER = {"GRPO_WORKER_GPUS": "2", "GRPO_RANK_TIMEOUT_SECONDS": "120"}
# Sampled eval completions (temperature 1, two per prompt): they match across runs only if each
# eval point's randomness is keyed to the step, not drawn from wherever a rank's generator is.
EVALUATION = {"eval_strategy": "steps", "eval_steps": EVERY, "eval_on_start": True,
              "eval_num_generations": 2, "eval_temperature": 1.0}


def eval_spec(tiny_spec: Callable[..., dict], pool: str, name: str, gpus: int) -> dict[str, Any]:
    # No periodic checkpoint: the paused job's only one is the one its pause writes, wherever it lands.
    return tiny_spec(name, max_steps=STEPS, resources={"pool": pool, "gpus": gpus},
                     grpo=EVALUATION, eval_dataset={"prompts": [{"prompt": p} for p in EVAL_PROMPTS]},
                     rewards=[{"name": "contains", "args": {"text": "the"}},
                              {"name": "length_target", "args": {"target": 12}}],
                     report_to=["tensorboard"], checkpoint_every=1000)


def evaluated(values: dict[str, Any]) -> dict[str, Any]:
    """The eval figures of a step's record, less eval time (wall clock, never the same twice)."""
    return {name: value for name, value in values.items() if name.startswith("eval_")}


def sql_rows(database_url: str, job_id: int) -> dict[int, tuple[int, dict[str, Any]]]:
    """``{step: (attempt, payload)}`` from job_metrics itself: the API serves steps from 1 only."""
    with session_scope(database_url) as session:
        rows = session.execute(select(JobMetric.step, JobMetric.attempt, JobMetric.payload)
                               .where(JobMetric.job_id == job_id).order_by(JobMetric.step)).all()
    return {step: (attempt, payload) for step, attempt, payload in rows}


def eval_completions(database_url: str, job_id: int) -> dict[int, list[str]]:
    """``{step: [eval completion, ...]}`` from job_samples, in prompt order."""
    with session_scope(database_url) as session:
        rows = session.execute(select(JobSample.step, JobSample.rows).where(JobSample.job_id == job_id)).all()
    found = {step: [row["completion"] for row in logged if row.get("split") == EVAL_SPLIT]
             for step, logged in rows}
    return {step: completions for step, completions in found.items() if completions}


class Followed:
    """The job's WebSocket stream, read in a thread from before the job starts until it ends."""

    def __init__(self, api: ApiClient, job_id: int) -> None:
        self.messages: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=api.watch, args=(job_id, self.messages.append), daemon=True)
        self.thread.start()

    def eval_steps(self) -> dict[int, dict[str, Any]]:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the stream did not end with the job"
        return {m["step"]: evaluated(m["values"]) for m in self.messages
                if m["type"] == "metrics" and evaluated(m["values"])}


def run_stack(processes, pool: str, wait_worker_ready) -> ApiClient:
    url = processes.api(TOKEN)
    processes.scheduler()
    processes.worker(pool, **WORKER)
    wait_worker_ready(pool, processes)
    api = ApiClient(url, TOKEN)

    def registered() -> bool:  # by the scheduler from the worker's heartbeat: then a submit is admitted
        pools = api.http.get("/v1/admin/pools").json()["items"]
        return any(p["name"] == pool and p["max_worker_gpus"] == 2 for p in pools)

    wait_until(registered, 60, f"pool {pool} to be registered with its 2 slots", details=processes.logs)
    return api


def check_eval_points(database_url: str, settings, job_id: int, streamed: Followed,
                      paused_at: int = STEPS) -> tuple[dict[int, dict[str, Any]], dict[int, list[str]]]:
    """The job's eval figures at each eval point, the same in SQL, over the WebSocket and in
    TensorBoard, each point recorded once: by the first attempt up to ``paused_at`` (where a
    pause stopped the job), by the second after it. Returned by step, with the eval completions."""
    rows = sql_rows(database_url, job_id)
    assert sorted(rows) == list(range(STEPS + 1))  # every step once, step 0 its evaluation alone
    assert {step: attempt for step, (attempt, _) in rows.items()} == {
        step: 1 if step <= paused_at else 2 for step in rows}  # the resumed attempt redid none
    in_sql = {step: evaluated(payload) for step, (_, payload) in rows.items() if evaluated(payload)}
    assert sorted(in_sql) == EVAL_POINTS
    assert {"eval_reward", "eval_reward_std", "eval_rewards/contains/mean", "eval_pass@k",
            "eval_completions/mean_length"} <= in_sql[0].keys()
    assert all("timing/eval" in rows[step][1] for step in EVAL_POINTS)
    completions = eval_completions(database_url, job_id)
    assert sorted(completions) == EVAL_POINTS
    assert all(len(texts) == 2 * len(EVAL_PROMPTS) for texts in completions.values())

    # The stream serves every eval point, step 0's (eval_on_start) included: a cursor starts
    # before the first step.
    assert streamed.eval_steps() == in_sql

    # TensorBoard: one scalar per eval figure and eval point, across every attempt's event file.
    events = read_scalar_events(tensorboard_dir(settings, job_id))
    charted = [(tag, step) for tag, step, _ in events if tag.startswith("eval/")]
    assert len(charted) == len(set(charted)), "an eval point was charted twice"
    assert sorted({step for _, step in charted}) == EVAL_POINTS
    values = {(tag, step): value for tag, step, value in events}
    for step, figures in in_sql.items():
        for name, value in figures.items():
            # TensorBoard keeps a scalar as float32: equal to its SQL double to float32's precision.
            assert values[(tracker_name(name), step)] == pytest.approx(value, rel=1e-6), (step, name)
    return in_sql, completions


def pause_and_resume(api: ApiClient, job_id: int, wait_for, processes) -> int:
    """Pause the job mid-run over HTTP, resume it once paused; the step it paused at.

    Asked just before an eval point, the pause lands on it more often than not (its evaluation
    makes it the longest step): the case where the resumed attempt must not evaluate the
    checkpointed point again. Wherever it lands, each point must be recorded once."""
    def trained() -> bool:
        job = api.job(job_id)
        return job["status"] == "running" and job["last_step"] >= EVERY - 1

    wait_for(trained, 180, "the job to train", processes, interval=0.02)
    assert api.act(job_id, "pause")["status"] == "pausing"
    paused = wait_for(lambda: (job := api.job(job_id))["status"] == "paused" and job, 60, "the pause",
                      processes)
    assert 1 <= paused["last_step"] < STEPS, paused  # mid-run, past step 0's evaluation
    assert api.act(job_id, "resume")["status"] == "queued"
    return paused["last_step"]


def test_eval_points_through_the_service_on_one_and_two_ranks_and_across_a_pause(
        processes, tiny_spec, pool, settings, database_url, wait_for, wait_worker_ready):
    api = run_stack(processes, pool, wait_worker_ready)

    def run(name: str, gpus: int, pause: bool = False) -> tuple[int, Followed, int]:
        job_id = api.submit(eval_spec(tiny_spec, pool, name, gpus))["id"]
        followed = Followed(api, job_id)
        paused_at = pause_and_resume(api, job_id, wait_for, processes) if pause else STEPS
        done = wait_for(lambda: (job := api.job(job_id))["status"] in ("succeeded", "failed") and job, 300,
                        f"job {name} to end", processes, interval=0.2)
        assert done["status"] == "succeeded", done["error"]
        return job_id, followed, paused_at

    one = check_eval_points(database_url, settings, *run("one-rank", 1))
    two = check_eval_points(database_url, settings, *run("two-ranks", 2))
    resumed = check_eval_points(database_url, settings, *run("paused", 1, pause=True))

    # Figures that differ between eval points, or equal runs would prove little.
    figures, _ = one
    assert len({values["eval_reward"] for values in figures.values()}) > 1, figures
    # Exactly equal, not to a tolerance: each eval point's figures are computed once, on rank 0,
    # from every rank's completions gathered in prompt order, and the completions themselves
    # (keyed randomness) are the same token for token, so no sum runs in another order. A
    # difference is a different completion, which the completions compared beside them name.
    assert two == one
    assert resumed == one
