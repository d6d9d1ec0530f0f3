"""``retry_transient``: a dropped connection is retried with a bounded, growing backoff; an error
about the statement itself is not; a database away for the whole budget becomes
``DatabaseUnavailable``. The errors are SQLAlchemy's own, as its engine raises them; one test
drops a real Postgres session under a real write."""

from __future__ import annotations

import pytest
from sqlalchemy import exc, text

from api.store.db import session_scope
from worker.retrying import DATABASE_UNAVAILABLE, DatabaseUnavailable, is_transient, retry_transient


class AdminShutdown(Exception):
    """Stands for the driver's error behind a wrapped SQLAlchemy error."""


def dropped() -> exc.OperationalError:
    return exc.OperationalError("INSERT INTO job_metrics ...", {}, AdminShutdown("terminating connection"),
                                connection_invalidated=True)


def failing(errors: list[Exception], result: str = "written"):
    """A call that raises ``errors`` in turn, then returns ``result``; ``calls`` counts tries."""
    def call() -> str:
        call.calls += 1
        if errors:
            raise errors.pop(0)
        return result

    call.calls = 0
    return call


def test_transient_errors_are_retried_with_a_growing_backoff_until_the_call_succeeds():
    slept: list[float] = []
    call = failing([dropped(), exc.InterfaceError("SELECT 1", {}, AdminShutdown("connection closed")),
                    exc.OperationalError("SELECT 1", {}, AdminShutdown("could not connect")), dropped()])
    assert retry_transient(call, 60, "metrics", sleep=slept.append) == "written"
    assert call.calls == 5 and len(slept) == 4
    # Doubling from 0.1 s, each jittered into the upper half of its step.
    for delay, step in zip(slept, (0.1, 0.2, 0.4, 0.8), strict=True):
        assert step / 2 <= delay <= step


@pytest.mark.parametrize("error", [
    exc.IntegrityError("INSERT", {}, AdminShutdown("duplicate key")),
    exc.DataError("INSERT", {}, AdminShutdown("invalid byte sequence")),
    exc.ProgrammingError("SELEC", {}, AdminShutdown("syntax error")),
    ValueError("not a database error"),
])
def test_an_error_about_the_statement_is_raised_at_once(error):
    call = failing([error])
    with pytest.raises(type(error)):
        retry_transient(call, 60, sleep=lambda _: pytest.fail("must not back off"))
    assert call.calls == 1 and not is_transient(error)


def test_a_database_away_for_the_whole_budget_is_database_unavailable():
    call = failing([dropped() for _ in range(1000)])
    with pytest.raises(DatabaseUnavailable) as raised:
        retry_transient(call, 0.3, "step 7's metrics")  # real sleeps: 0.3 s in all
    assert raised.value.code == DATABASE_UNAVAILABLE
    assert isinstance(raised.value.__cause__, exc.OperationalError)
    assert "step 7's metrics" in str(raised.value) and "terminating connection" in str(raised.value)
    assert 2 <= call.calls < 10


def test_a_terminated_postgres_session_is_retried_on_a_new_connection(database_url):
    """The server ends the session in the middle of a transaction, as an operator's
    ``pg_terminate_backend`` or a failover does; the whole transaction is tried again on a new
    connection and succeeds."""
    backends = []

    def write() -> int:
        with session_scope(database_url) as session:
            backends.append(session.execute(text("SELECT pg_backend_pid()")).scalar_one())
            if len(backends) == 1:
                session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
            return session.execute(text("SELECT 42")).scalar_one()

    assert retry_transient(write, 30, "a write") == 42
    assert len(backends) == 2 and backends[0] != backends[1]
