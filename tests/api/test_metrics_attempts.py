"""A step's record is written once per attempt: a retried write of the same attempt (whose first
try may have committed) changes nothing, a later attempt that trained the step again replaces it,
and an event retried with its timestamp is recorded once. On Postgres and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from specs import tiny_spec
from sqlalchemy import select

from api.domain.job_spec import JobSpec
from api.store.clock import Backoff, db_now
from api.store.db import session_scope
from api.store.jobs import create_job
from api.store.tables import JobMetric
from api.store.teams import DEFAULT_TEAM, team_id_by_name
from api.store.telemetry import add_event_once, list_events, list_metrics, record_metrics


@pytest.fixture
def job_id(api_database_url: str) -> int:
    with session_scope(api_database_url) as session:
        team = team_id_by_name(session, DEFAULT_TEAM)
        job, _ = create_job(session, team, JobSpec.model_validate(tiny_spec()))
    return job.id


def write(url: str, job_id: int, step: int, attempt: int | None, reward: float) -> bool:
    with session_scope(url) as session:
        return record_metrics(session, job_id, {"step": step, "reward": reward}, attempt)


def stored(url: str, job_id: int) -> list[tuple[int, int | None, float]]:
    with session_scope(url) as session:
        rows = session.execute(select(JobMetric.step, JobMetric.attempt, JobMetric.payload)
                               .where(JobMetric.job_id == job_id).order_by(JobMetric.step)).all()
    return [(step, attempt, payload["reward"]) for step, attempt, payload in rows]


def test_a_retry_of_the_same_attempt_is_a_no_op_and_a_later_attempt_replaces_the_step(api_database_url,
                                                                                      job_id):
    url = api_database_url
    assert write(url, job_id, 1, 1, 0.1) and write(url, job_id, 2, 1, 0.2)
    assert not write(url, job_id, 2, 1, 0.25)  # the same attempt again: its first try committed
    assert stored(url, job_id) == [(1, 1, 0.1), (2, 1, 0.2)]
    # Attempt 2 resumed from a checkpoint before step 2 and trained it again.
    assert write(url, job_id, 2, 2, 0.3) and write(url, job_id, 3, 2, 0.4)
    assert not write(url, job_id, 2, 1, 0.9)  # a late write of the older attempt loses
    assert stored(url, job_id) == [(1, 1, 0.1), (2, 2, 0.3), (3, 2, 0.4)]
    with session_scope(url) as session:
        assert [(m.step, m.values["reward"]) for m in list_metrics(session, job_id)] == [(1, 0.1), (2, 0.3),
                                                                                          (3, 0.4)]


def test_a_record_without_an_attempt_is_replaced_by_any_attempt(api_database_url, job_id):
    assert write(api_database_url, job_id, 1, None, 0.1)
    assert not write(api_database_url, job_id, 1, None, 0.2)
    assert write(api_database_url, job_id, 1, 1, 0.3)
    assert stored(api_database_url, job_id) == [(1, 1, 0.3)]


def test_an_event_retried_with_its_timestamp_is_recorded_once(api_database_url, job_id):
    ts = datetime.now(UTC)
    for expected in (True, False):
        with session_scope(api_database_url) as session:
            assert add_event_once(session, job_id, "checkpoint", "step 3", {"step": 3}, ts) is expected
    with session_scope(api_database_url) as session:
        assert add_event_once(session, job_id, "checkpoint", "step 6", {"step": 6}, ts + timedelta(seconds=1))
        messages = [e.message for e in list_events(session, job_id) if e.type == "checkpoint"]
    assert messages == ["step 3", "step 6"]


def test_the_database_clock_is_utc_and_backoff_doubles_to_its_cap(api_database_url):
    with session_scope(api_database_url) as session:
        first = db_now(session)
    with session_scope(api_database_url) as session:
        second = db_now(session)
    assert first.tzinfo is not None and first.utcoffset() == timedelta(0)
    assert first <= second
    # The same host's clock (SQLite) or the server's on this machine: within a minute of ours.
    assert abs(first - datetime.now(UTC)) < timedelta(seconds=60)
    backoff = Backoff(first=5, most=30)
    assert [backoff.delay(n) for n in (0, 1, 2, 3, 4, 5)] == [5, 5, 10, 20, 30, 30]
    assert backoff.until(first, 2) == first + timedelta(seconds=10)
    assert Backoff().until(first, 3) is None
