"""A python grader's failures in real jobs (the Celery task: supervisor and job process): one that
raises on every row fails the job ``reward_error`` at step 1 with the exception, the grader's line
and a failing row, in the job's error and its events; one that raises on some rows trains on,
each step's warning event carrying the first exception and the count, and each sample row it
failed on carrying its own."""

from __future__ import annotations

from failing_graders import ALWAYS, ROWS, SOMETIMES

from api.domain.lifecycle import Transition
from api.store.db import session_scope
from api.store.jobs import transition
from api.store.tables import utcnow
from api.store.telemetry import list_events, list_samples


def run_task(database_url: str, job_id: int) -> str:
    from worker.tasks import run_job

    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
    return run_job(job_id)


def grader_spec(tiny_spec, source: str, steps: int) -> dict:
    return tiny_spec("graded", max_steps=steps, dataset={"prompts": ROWS},
                     rewards=[{"name": "python", "args": {"source": source}}])


def unscored_events(database_url: str, job_id: int) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=200) if e.type == "reward_unscored"]


def test_a_grader_that_raises_on_every_row_fails_the_job_at_step_one(task_settings, submit, tiny_spec,
                                                                     database_url, job_of):
    job_id = submit(grader_spec(tiny_spec, ALWAYS, steps=5))
    assert run_task(database_url, job_id) == "failed"

    job = job_of(job_id)
    assert job.error.code == "reward_error" and job.last_step == 0 and job.status_label == "failed"
    message = job.error.message
    assert "failed on every row of step 1 (4 rows)" in message
    assert "KeyError: 'no_such_key'" in message
    assert "grader.py line 2: return 1.0 / len(item['no_such_key'])" in message
    assert '"prompt": "Say' in message and '"answer":' in message  # a failing row
    [event] = unscored_events(database_url, job_id)
    assert event.level == "warning" and "KeyError: 'no_such_key'" in event.message
    error = event.data["errors"]["python"]
    assert error["rows"] == 4 and "grader.py line 2" in error["error"]
    assert error["row"]["answer"] in {"yes", "no"} and "completion" in error["row"]


def test_a_grader_that_raises_on_some_rows_warns_with_the_exception_and_the_count(task_settings, submit,
                                                                                 tiny_spec, database_url,
                                                                                 job_of):
    job_id = submit(grader_spec(tiny_spec, SOMETIMES, steps=2))
    assert run_task(database_url, job_id) == "succeeded"

    events = unscored_events(database_url, job_id)
    assert [e.data["step"] for e in events] == [1, 2]
    for event in events:
        error = event.data["errors"]["python"]
        assert event.data["rows"] == error["rows"] == 2  # each step: both completions of the 'no' row
        assert "ValueError: cannot grade a no (grader.py line 3: raise ValueError('cannot grade a no'))" \
            in event.message
        assert "failed on 2 of 4 row(s)" in event.message and error["row"]["answer"] == "no"
    job = job_of(job_id)
    assert job.unscored_rows == 4 and job.status_label == "succeeded with warnings"
    # Each sample row a reward could not score says why; the rows it scored carry no error.
    with session_scope(database_url) as session:
        [samples] = list_samples(session, job_id, step=1)
    failed = [row for row in samples.rows if row["columns"]["answer"] == "no"]
    scored = [row for row in samples.rows if row["columns"]["answer"] == "yes"]
    assert failed and scored
    for row in failed:
        assert row["error"].startswith("reward 'python': ValueError: cannot grade a no"), row
        assert "grader.py line 3" in row["error"]
    assert all("error" not in row for row in scored)
