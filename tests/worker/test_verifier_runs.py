"""``http_verifier`` rewards in the service's jobs, against a verifier server this test starts:
the job's process finds the registration in the database and scores through it (rows the
verifier answers null are a ``reward_unscored`` warning); a verifier that is down fails the job
``reward_unavailable`` in a real worker process after 3 steps in a row, each a warning event, and
the auth secret shows in no event or error."""

from __future__ import annotations

import pytest
from test_run_job import dispatch_by_hand, events
from verifier_server import closed_port_url, verifier_server

from api.domain.lifecycle import Transition
from api.scheduling.scheduler import celery_client
from api.schemas.verifiers import VerifierSet
from api.store import verifiers
from api.store.attempts import claim
from api.store.db import session_scope
from api.store.jobs import transition
from api.store.tables import utcnow
from api.store.telemetry import list_events, list_metrics
from grpo_core.spec.run_spec import REWARD_TIMEOUT_STEPS

pytestmark = pytest.mark.slow
SECRET = "Bearer verifier-secret-in-the-db"


def register(database_url: str, name: str, url: str) -> None:
    body = VerifierSet(team="default", url=url, auth_header="Authorization", auth_secret=SECRET,
                       timeout_seconds=2, max_batch_size=2)
    with session_scope(database_url) as session:
        verifiers.set_verifier(session, name, body)


def verifier_rewards(name: str) -> list[dict]:
    return [{"name": "http_verifier", "args": {"verifier": name, "columns": ["answer"]}}]


ROWS = [{"prompt": "Say yes.", "answer": "yes"}, {"prompt": "Say no.", "answer": "no"}]


def test_a_job_scores_through_its_registered_verifier(task_settings, submit, tiny_spec, job_of, database_url,
                                                      tmp_path):
    from worker.attempt import run_attempt
    from worker.attempt_files import AttemptFiles
    from worker.runner import record_outcome

    with verifier_server() as server:
        register(database_url, "scoring-grader", server.url)
        server.script = [("entries", [None])]  # the first row of the first request: no score
        job_id = submit(tiny_spec(max_steps=2, rewards=verifier_rewards("scoring-grader"),
                                  dataset={"prompts": ROWS}))
        with session_scope(database_url) as session:
            assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
            job = claim(session, job_id, "late-worker")
        outcome = run_attempt(job, task_settings, "late-worker", AttemptFiles(tmp_path))
        assert record_outcome(job, "late-worker", task_settings, None, outcome) == "succeeded", outcome

    # 2 steps x 2 prompts x 2 completions, at most 2 rows a request, each with its reference.
    sent = [item for seen in server.seen for item in seen.items]
    assert len(sent) == 8 and all(len(seen.items) <= 2 for seen in server.seen)
    assert {item["columns"]["answer"] for item in sent} == {"yes", "no"}
    assert all(seen.headers["Authorization"] == SECRET for seen in server.seen)
    with session_scope(database_url) as session:
        metrics = list_metrics(session, job_id)
        unscored = [e for e in list_events(session, job_id, limit=100) if e.type == "reward_unscored"]
    assert [m.step for m in metrics] == [1, 2]
    assert all("rewards/http_verifier/mean" in m.values for m in metrics)
    assert [(e.level, e.data) for e in unscored] == [
        ("warning", {"step": 1, "rows": 1, "rewards": ["http_verifier"]})]


def test_a_verifier_that_stays_down_fails_the_job_as_reward_unavailable(
        processes, submit, tiny_spec, finished, wait_for, pool, settings, database_url, wait_worker_ready):
    register(database_url, "down-grader", closed_port_url())
    job_id = submit(tiny_spec(pool=pool, max_steps=10, rewards=verifier_rewards("down-grader"),
                              dataset={"prompts": ROWS}))
    processes.worker(pool)
    [worker_id] = wait_worker_ready(pool, processes)
    dispatch_by_hand(settings, celery_client(settings), job_id, worker_id, copies=1)
    job = wait_for(lambda: finished(job_id), 180, "the job to end", processes)

    assert job.status == "failed" and job.error.code == "reward_unavailable", job.error
    assert f"in {REWARD_TIMEOUT_STEPS} steps in a row" in job.error.message
    assert "verifier 'down-grader' is unavailable" in job.error.message
    assert "ConnectError" in job.error.message
    warnings = events(database_url, job_id, "reward_unavailable")
    assert [(e.level, e.data["step"], e.data["rewards"]) for e in warnings] == [
        ("warning", step, ["http_verifier"]) for step in range(1, REWARD_TIMEOUT_STEPS + 1)]
    texts = [job.error.message, job.error.traceback or "", *(e.message for e in warnings)]
    assert not any("verifier-secret" in text for text in texts)


def test_a_verifier_deleted_after_the_submit_fails_the_job_as_invalid_spec(task_settings, submit, tiny_spec,
                                                                            job_of, database_url, tmp_path):
    from worker.attempt import run_attempt
    from worker.attempt_files import AttemptFiles
    from worker.runner import record_outcome

    register(database_url, "short-lived", "http://127.0.0.1:9/score")
    job_id = submit(tiny_spec(rewards=verifier_rewards("short-lived"), dataset={"prompts": ROWS}))
    with session_scope(database_url) as session:
        verifiers.delete_verifier(session, "short-lived")
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
        job = claim(session, job_id, "late-worker")
    outcome = run_attempt(job, task_settings, "late-worker", AttemptFiles(tmp_path))
    assert record_outcome(job, "late-worker", task_settings, None, outcome) == "failed"
    error = job_of(job_id).error
    assert error.code == "invalid_spec"
    assert error.message.startswith("rewards.0.args.verifier: no verifier 'short-lived' is registered")
