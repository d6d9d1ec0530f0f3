"""Rewards over their time budget, through the job process's body (run in this process, as in
``test_disk_full.py``) and the recording of its outcome: the finding's regex times out at every
step, each such step is a warning event and trains with its rows unscorable, and the third step in
a row fails the job ``reward_timeout`` (grpo_core.spec.run_spec.REWARD_TIMEOUT_STEPS). The service's cap
(GRPO_MAX_REWARD_TIMEOUT_SECONDS) bounds a budget the spec asked for, even one the submit did
not check (this job is queued through the store)."""

from __future__ import annotations

from api.domain.lifecycle import Transition
from api.store.attempts import claim
from api.store.db import session_scope
from api.store.jobs import transition
from api.store.tables import utcnow
from api.store.telemetry import list_events, list_metrics
from grpo_core.spec.run_spec import REWARD_TIMEOUT_STEPS

CATASTROPHIC = [{"name": "regex_match", "args": {"pattern": "(?s)(.|.)*(?!)"}}]


def test_rewards_over_budget_step_after_step_fail_the_job_as_reward_timeout(
    task_settings, submit, tiny_spec, job_of, database_url, tmp_path
):
    from worker.attempt import run_attempt
    from worker.attempt_files import AttemptFiles
    from worker.runner import record_outcome

    job_id = submit(tiny_spec(max_steps=10, rewards=CATASTROPHIC, reward_timeout_seconds=600,
                              grpo={"max_completion_length": 48}))
    settings = task_settings.model_copy(update={"max_reward_timeout_seconds": 0.2})
    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
        job = claim(session, job_id, "late-worker")
    outcome = run_attempt(job, settings, "late-worker", AttemptFiles(tmp_path))
    assert record_outcome(job, "late-worker", settings, None, outcome) == "failed"

    job = job_of(job_id)
    assert job.error.code == "reward_timeout" and "reward_timeout_seconds (0.2 s)" in job.error.message
    assert f"in {REWARD_TIMEOUT_STEPS} steps in a row (last: step {REWARD_TIMEOUT_STEPS}" in job.error.message
    with session_scope(database_url) as session:
        warnings = [e for e in list_events(session, job_id, limit=100) if e.type == "reward_timeout"]
        metrics = list_metrics(session, job_id)
    assert [(e.level, e.data["step"], e.data["rewards"]) for e in warnings] == [
        ("warning", step, ["regex_match"]) for step in range(1, REWARD_TIMEOUT_STEPS + 1)]
    assert "their rows were left unscorable" in warnings[0].message
    # The steps before the last trained on unscorable rows: no reward, advantage 0 everywhere.
    assert [m.step for m in metrics] == list(range(1, REWARD_TIMEOUT_STEPS))
    assert all(m.values["reward"] is None for m in metrics)
    assert all(m.values["advantages/max"] == 0.0 for m in metrics)
