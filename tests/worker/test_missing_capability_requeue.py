"""A worker that gets a job needing a capability it cannot offer (the scheduler went by a heartbeat
that is stale, or no longer true: its sandbox broke since it started) does not fail the job: the
attempt ends as the machine's fault before the model loads, and the job goes back to the queue,
where the scheduler places it on a worker that advertises the capability. Real Postgres; the
sandbox is made unavailable by hiding bwrap from this process."""

from __future__ import annotations

import pytest
from sandbox_guard import needs_sandbox

from api.domain.lifecycle import Transition
from api.store.attempts import claim
from api.store.db import session_scope
from api.store.jobs import transition
from api.store.tables import utcnow
from grpo_core.rewards.sandbox import CAPABILITY, sandbox_problem

WORKER = "no-sandbox-worker"
CODE_ROWS = [{"prompt": "Read n and print 2n.", "tests": [{"input": "2", "output": "4"}]}]


@pytest.fixture
def without_bwrap(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox_problem.cache_clear()
    yield
    monkeypatch.undo()
    sandbox_problem.cache_clear()


def test_a_code_tests_job_on_a_worker_without_the_sandbox_goes_back_to_the_queue(
        submit, tiny_spec, task_settings, database_url, job_of, tmp_path, monkeypatch, without_bwrap):
    import worker.attempt
    from worker.attempt_files import AttemptFiles
    from worker.heartbeat import CAPABILITY_MISSING
    from worker.outcome import Fault
    from worker.runner import _requeue

    def must_not_train(*args, **kwargs):
        raise AssertionError("the model was loaded on a worker that cannot score the job")

    monkeypatch.setattr(worker.attempt, "train_reporting", must_not_train)
    job_id = submit(tiny_spec(dataset={"prompts": CODE_ROWS}, rewards=[{"name": "code_tests"}]))
    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH,
                          values={"dispatched_at": utcnow(), "worker_id": WORKER})
        job = claim(session, job_id, WORKER)
    fault = worker.attempt.run_attempt(job, task_settings, WORKER, AttemptFiles(tmp_path))
    assert isinstance(fault, Fault) and fault.code == CAPABILITY_MISSING, fault
    assert CAPABILITY in fault.message and "bwrap" in fault.message
    assert fault.data["missing"] == [CAPABILITY]

    assert _requeue(job, WORKER, task_settings, None, fault) == "queued"
    requeued = job_of(job_id)
    assert (requeued.status, requeued.worker_id, requeued.error) == ("queued", None, None)


def _reaches_training(submit, spec, database_url, task_settings, tmp_path, monkeypatch) -> bool:
    import worker.attempt
    from worker.attempt_files import AttemptFiles

    trained = []
    monkeypatch.setattr(worker.attempt, "train_reporting", lambda *args: trained.append(args) or "trained")
    job_id = submit(spec)
    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
        job = claim(session, job_id, WORKER)
    return worker.attempt.run_attempt(job, task_settings, WORKER, AttemptFiles(tmp_path)) == "trained"


def test_a_job_that_needs_nothing_is_not_held_up_by_a_missing_sandbox(
        submit, tiny_spec, task_settings, database_url, tmp_path, monkeypatch, without_bwrap):
    assert _reaches_training(submit, tiny_spec(), database_url, task_settings, tmp_path, monkeypatch)


@needs_sandbox
def test_a_code_tests_job_on_a_worker_with_the_sandbox_trains(
        submit, tiny_spec, task_settings, database_url, tmp_path, monkeypatch):
    spec = tiny_spec(dataset={"prompts": CODE_ROWS}, rewards=[{"name": "code_tests"}])
    assert _reaches_training(submit, spec, database_url, task_settings, tmp_path, monkeypatch)
