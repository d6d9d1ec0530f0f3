"""Failure text that a database would refuse (a NUL byte, an unpaired surrogate, megabytes of
traceback) is still stored when an attempt ends: otherwise the ending fails and the job is
requeued forever. Through the store's ``finish`` on Postgres and SQLite, read back over HTTP."""

from __future__ import annotations

from api.store.jobs import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, storable_text


def test_a_failure_with_nul_bytes_and_an_overlong_traceback_is_stored_and_shown(
    api, api_server, worker, job_spec
) -> None:
    from api.domain.lifecycle import JobStatus
    from api.store import attempts
    from api.store.db import session_scope

    job_id = api.post("/v1/jobs", json=job_spec(name="nul-failure")).json()["id"]
    worker.start(job_id)
    message = "reward crashed on b'\x00\x01' \ud800 row"
    lines = "Traceback (most recent call last):\n" + "  frame\x00\n" * 20_000 + "ValueError: bad row\x00"
    with session_scope(api_server.settings.database_url) as session:
        assert attempts.finish(
            session,
            job_id,
            worker_id="scripted",
            outcome=JobStatus.FAILED,
            message=message,
            error_code="reward_error",
            error_message=message,
            traceback=lines,
        )
    error = api.get(f"/v1/jobs/{job_id}").json()["error"]
    assert error["code"] == "reward_error"
    assert error["message"] == "reward crashed on b'\ufffd\x01' ? row"
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert error["traceback"].endswith("ValueError: bad row\ufffd")  # the last line, which says the most
    assert "characters cut" in error["traceback"] and len(error["traceback"]) <= MAX_TRACEBACK_CHARS
    events = api.get(f"/v1/jobs/{job_id}/events").json()["items"]
    assert [e["message"] for e in events if e["type"] == "failed"] == [error["message"]]


def test_storable_text_keeps_short_text_and_caps_long_text_at_its_limit() -> None:
    assert storable_text("fine", 10) == "fine"
    long = "a" * 5_000 + "b" * 5_000
    capped = storable_text(long, MAX_MESSAGE_CHARS)
    assert len(capped) <= MAX_MESSAGE_CHARS and capped.startswith("a") and capped.endswith("b")
    assert "characters cut" in capped
