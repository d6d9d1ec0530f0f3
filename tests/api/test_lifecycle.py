"""The job state machine: a table written out here by hand (not read from ``api.domain.lifecycle``)
says, for every (status, transition) pair, whether the move is allowed, where it leads and what
event it records. The pure module and the store's one writer of ``jobs.status`` must both agree
with it, on SQLite and Postgres; and no other module may write ``status``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from api.domain import lifecycle
from api.domain.lifecycle import (
    JOB_STATUSES,
    JobStatus,
    Transition,
    TransitionRefused,
    allowed,
    stop_requested,
    stronger_stop,
)

ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("queued", "dispatched", "running", "cancelling", "succeeded", "failed", "cancelled", "preempted",
            "pausing", "paused")
HOLDING = {"dispatched", "running", "cancelling", "pausing"}  # a job holds its GPUs (an open allocation)
# transition: (from, to, event type, event level)
EXPECTED: dict[Transition, tuple[set[str], str, str, str]] = {
    Transition.DISPATCH: ({"queued", "preempted"}, "dispatched", "dispatched", "info"),
    Transition.UNDISPATCH: ({"dispatched"}, "queued", "dispatch_failed", "warning"),
    Transition.CLAIM: ({"dispatched"}, "running", "running", "info"),
    Transition.SUCCEED: ({"running", "cancelling", "pausing"}, "succeeded", "succeeded", "info"),
    Transition.FAIL: ({"running", "cancelling", "pausing"}, "failed", "failed", "error"),
    Transition.CANCEL: ({"queued", "preempted", "dispatched", "paused"}, "cancelled", "cancelled", "info"),
    Transition.REQUEST_CANCEL: ({"running", "pausing"}, "cancelling", "cancel_requested", "info"),
    Transition.STOP_CANCELLED: ({"running", "cancelling", "pausing"}, "cancelled", "cancelled", "info"),
    Transition.YIELD: ({"running"}, "preempted", "preempted", "warning"),
    Transition.REQUEUE: ({"dispatched", "running"}, "queued", "requeued", "warning"),
    Transition.PAUSE: ({"queued", "preempted", "dispatched"}, "paused", "paused", "info"),
    Transition.REQUEST_PAUSE: ({"running"}, "pausing", "pause_requested", "info"),
    Transition.STOP_PAUSED: ({"running", "pausing"}, "paused", "paused", "info"),
    Transition.RESUME: ({"paused"}, "queued", "unpaused", "info"),
    Transition.RETRY: ({"failed", "cancelled"}, "queued", "retried", "info"),
}
PAIRS = [pytest.param(status, via, id=f"{status}-{via.value}") for status in STATUSES for via in Transition]


def test_the_table_names_every_status_and_transition() -> None:
    assert sorted(STATUSES) == sorted(JOB_STATUSES) and set(EXPECTED) == set(Transition)


@pytest.mark.parametrize(("status", "via"), PAIRS)
def test_the_pure_machine_allows_exactly_what_the_table_says(status: str, via: Transition) -> None:
    sources, target, _, _ = EXPECTED[via]
    assert allowed(status, via) is (status in sources)
    if status in sources:
        assert lifecycle.target(status, via) == target
    else:
        with pytest.raises(TransitionRefused):
            lifecycle.target(status, via)


# ---- the store, on a real database ----

@pytest.fixture(scope="module")
def team_id(api_database_url: str) -> int:
    from api.store.db import session_scope
    from api.store.teams import DEFAULT_TEAM, team_id_by_name

    with session_scope(api_database_url) as session:
        return team_id_by_name(session, DEFAULT_TEAM)


@pytest.fixture
def job_in(api_database_url: str, team_id: int, job_spec):
    """``job_in(status, worker_id="w1")``: a new job put in ``status`` by hand; one that holds
    GPUs is held by ``worker_id`` and has an open allocation, as a dispatch leaves it."""
    from api.domain.job_spec import JobSpec
    from api.store.db import session_scope
    from api.store.jobs import create_job
    from api.store.tables import Allocation, Job

    def make(status: str, worker_id: str = "w1") -> int:
        with session_scope(api_database_url) as session:
            job, _ = create_job(session, team_id, JobSpec.model_validate(job_spec()))
            holding = status in HOLDING
            session.execute(update(Job).where(Job.id == job.id).values(
                status=status, worker_id=worker_id if holding else None))
            if holding:
                session.add(Allocation(job_id=job.id, team_id=team_id, pool=job.pool, gpus=job.gpus))
        return job.id

    return make


def state_of(database_url: str, job_id: int) -> tuple[str, list[tuple[str, str, str]], int]:
    """The job's status, its events ``(type, level, message)`` and how many allocations are open."""
    from api.store.db import session_scope
    from api.store.tables import Allocation, Job, JobEvent

    with session_scope(database_url) as session:
        status = session.scalar(select(Job.status).where(Job.id == job_id))
        events = session.execute(select(JobEvent.type, JobEvent.level, JobEvent.message)
                                 .where(JobEvent.job_id == job_id).order_by(JobEvent.id)).all()
        open_allocations = session.scalar(select(func.count()).select_from(Allocation).where(
            Allocation.job_id == job_id, Allocation.ended_at.is_(None)))
    return status, [tuple(event) for event in events], open_allocations


@pytest.mark.parametrize(("status", "via"), PAIRS)
def test_the_store_moves_or_refuses_as_the_table_says(api_database_url: str, job_in, status: str,
                                                      via: Transition) -> None:
    from api.store.db import session_scope
    from api.store.jobs import transition

    job_id = job_in(status)
    _, events_before, _ = state_of(api_database_url, job_id)
    published: list = []
    with session_scope(api_database_url, publish=published.extend) as session:
        moved = transition(session, job_id, via=via, message="as the table says")
    now, events, open_allocations = state_of(api_database_url, job_id)
    sources, target, event, level = EXPECTED[via]
    if status in sources:
        assert moved is not None and moved.status == now == target
        assert events == [*events_before, (event, level, "as the table says")]
        assert [(m.job_id, m.kind) for m in published] == [(job_id, "event"), (job_id, "status")]
        assert published[0].data["type"] == event and published[1].data == {"status": target}
        assert open_allocations == (1 if target in HOLDING else 0)
    else:
        assert moved is None and now == status
        assert events == events_before and published == []
        assert open_allocations == (1 if status in HOLDING else 0)


def test_only_the_worker_holding_a_job_ends_it_and_a_failure_carries_its_error(api_database_url: str,
                                                                              job_in) -> None:
    from api.store.attempts import finish
    from api.store.db import session_scope
    from api.store.jobs import get_job

    job_id = job_in("running", worker_id="owner")
    published: list = []
    ending = {"outcome": JobStatus.FAILED, "message": "boom", "error_code": "internal_error",
              "error_message": "boom", "traceback": "Traceback (most recent call last):\n  boom"}
    with session_scope(api_database_url, publish=published.extend) as session:
        assert finish(session, job_id, worker_id="stranger", **ending) is None
    assert published == [] and state_of(api_database_url, job_id)[0] == "running"
    with session_scope(api_database_url, publish=published.extend) as session:
        assert finish(session, job_id, worker_id="owner", **ending).status == "failed"
    assert published[-1].data == {"status": "failed", "error": {"code": "internal_error", "message": "boom"}}
    with session_scope(api_database_url) as session:
        assert get_job(session, job_id).error.traceback is None  # only an admin's read carries it
        assert get_job(session, job_id, traceback=True).error.traceback == ending["traceback"]


def test_a_transition_sets_no_status_of_its_own(api_database_url: str, job_in) -> None:
    from api.store.db import session_scope
    from api.store.jobs import transition

    job_id = job_in("queued")
    with pytest.raises(ValueError, match="from its rule"), session_scope(api_database_url) as session:
        transition(session, job_id, via=Transition.CANCEL, values={"status": "succeeded"})
    assert state_of(api_database_url, job_id)[0] == "queued"


# ---- one writer ----

WRITER = Path("api/store/jobs.py")


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _sets_status(args: list[ast.expr], keywords: list[ast.keyword]) -> bool:
    """A ``status`` keyword, or a ``"status"`` key in a dict literal among the arguments."""
    dicts = [node for arg in [*args, *(keyword.value for keyword in keywords)]
             for node in ast.walk(arg) if isinstance(node, ast.Dict)]
    keys = [key.value for node in dicts for key in node.keys if isinstance(key, ast.Constant)]
    return "status" in keys or any(keyword.arg == "status" for keyword in keywords)


def status_writes(source: str) -> list[int]:
    """Lines of ``update(...)``, ``.values(...)`` or ``transition(...)`` calls that set
    ``status`` themselves, and of ``execute(update(...), {"status": ...})``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node)
        if name == "execute" and node.args:
            updating = any(isinstance(inner, ast.Call) and _name(inner) == "update"
                           for inner in ast.walk(node.args[0]))
            if updating and _sets_status(node.args[1:], node.keywords):
                lines.append(node.lineno)
        elif name in {"update", "values", "transition"} and _sets_status(node.args, node.keywords):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_status_written_by_hand() -> None:
    assert status_writes("stmt = update(Job).values(status='failed')") == [1]
    assert status_writes("session.execute(update(t), {'status': 'queued'})") == [1]
    assert status_writes("transition(s, 1, via=v, values={'status': 'x'})") == [1]
    assert status_writes("bus.encode('status', {'status': job.status})") == []


def test_no_module_but_the_store_writes_a_jobs_status() -> None:
    offenders = {}
    for path in sorted([*(ROOT / "api").rglob("*.py"), *(ROOT / "worker").rglob("*.py")]):
        relative = path.relative_to(ROOT)
        if relative != WRITER and (lines := status_writes(path.read_text())):
            offenders[str(relative)] = lines
    assert offenders == {}
    assert status_writes((ROOT / WRITER).read_text()), "the scan no longer sees the one writer"


def test_one_ranking_of_stop_requests_a_cancel_over_a_pause_over_a_preemption():
    assert stop_requested(cancel_requested=True, status="pausing", preempt_requested=True) == "cancel"
    assert stop_requested(cancel_requested=False, status="pausing", preempt_requested=True) == "pause"
    assert stop_requested(cancel_requested=False, status="running", preempt_requested=True) == "preempt"
    assert stop_requested(cancel_requested=False, status="running", preempt_requested=False) is None
    ladder = [None, "preempt", "pause", "cancel"]
    for i, weaker in enumerate(ladder):
        for stronger in ladder[i:]:
            assert stronger_stop(weaker, stronger) == stronger_stop(stronger, weaker) == stronger
