"""Which user actions apply in which status: a table written out here by hand (not read from
``api.domain.lifecycle``) that every job read's ``actions`` must follow, and ``GET /v1/lifecycle`` must
serve; and, over real HTTP (Postgres and SQLite), each action's route answers a 409 exactly
where a job read leaves the action out (a cancel or pause asked again is no error)."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from api.domain import lifecycle
from api.store.db import session_scope
from api.store.tables import Job
from api.vocabulary import PRIORITIES

STATUSES = ("queued", "dispatched", "running", "cancelling", "succeeded", "failed", "cancelled", "preempted",
            "pausing", "paused")
# status: the actions a job in it offers, in the order the API lists them
EXPECTED: dict[str, list[str]] = {
    "queued": ["cancel", "pause", "set_priority", "clone"],
    "dispatched": ["cancel", "pause", "set_priority", "clone"],
    "running": ["cancel", "pause", "set_priority", "clone"],
    "cancelling": ["set_priority", "clone"],
    "succeeded": ["clone", "download_model", "delete"],
    "failed": ["retry", "clone", "delete"],
    "cancelled": ["retry", "clone", "delete"],
    "preempted": ["cancel", "pause", "set_priority", "clone"],
    "pausing": ["cancel", "set_priority", "clone"],
    "paused": ["cancel", "resume", "set_priority", "clone"],
}
# Asked again, these change nothing and answer the job (200): not offered, not refused either.
ASKED_ALREADY = {("cancel", "cancelling"), ("pause", "pausing"), ("pause", "paused")}
MOVES = ("cancel", "pause", "resume", "retry")


def test_the_table_names_every_status_and_action() -> None:
    assert sorted(EXPECTED) == sorted(lifecycle.JOB_STATUSES) == sorted(STATUSES)
    offered = {action for actions in EXPECTED.values() for action in actions}
    assert offered == {action.value for action in lifecycle.Action}


@pytest.mark.parametrize("status", STATUSES)
def test_the_pure_table_offers_what_the_written_table_says(status: str) -> None:
    assert lifecycle.actions_for(status) == EXPECTED[status]


def test_every_moving_action_applies_where_one_of_its_moves_may_start() -> None:
    """What the store tries (its transitions) and what a read offers cannot drift apart."""
    for action, moves in lifecycle.ACTION_MOVES.items():
        can_start = {status for status in STATUSES if any(lifecycle.allowed(status, move) for move in moves)}
        assert set(lifecycle.ACTIONS[action]) == can_start, action


def test_the_lifecycle_route_serves_the_module(api) -> None:
    served = api.get("/v1/lifecycle")
    assert served.status_code == 200
    assert served.json() == {
        "statuses": list(STATUSES),
        "terminal": ["succeeded", "failed", "cancelled"],
        "actions": {action: [s for s in STATUSES if action in EXPECTED[s]]
                    for action in ("cancel", "pause", "resume", "retry", "set_priority", "clone",
                                   "download_model", "delete")},
        "priorities": list(PRIORITIES),
    }


@pytest.fixture(scope="module")
def api_server(api_database_url: str, api_settings_factory, serve_api):
    """The module's server, with a write burst for its many actions (the limit has its own tests)."""
    with serve_api(api_settings_factory(api_database_url, team_write_burst=10_000)) as server:
        yield server


@pytest.fixture
def job_in(alpha, api_server, job_spec):
    """``job_in(status)``: a job submitted over HTTP, then put in ``status`` by hand."""

    def make(status: str) -> int:
        job_id = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
        with session_scope(api_server.settings.database_url) as session:
            session.execute(update(Job).where(Job.id == job_id).values(status=status))
        return job_id

    return make


@pytest.mark.parametrize("status", STATUSES)
def test_every_job_read_carries_the_actions_of_its_status(alpha, job_in, status: str) -> None:
    job_id = job_in(status)
    assert alpha.get(f"/v1/jobs/{job_id}").json()["actions"] == EXPECTED[status]
    listed = alpha.get("/v1/jobs", params={"status": status, "order": "desc", "limit": 1}).json()["items"]
    assert [(job["id"], job["actions"]) for job in listed] == [(job_id, EXPECTED[status])]


@pytest.mark.parametrize("status", STATUSES)
def test_an_action_is_refused_exactly_where_reads_leave_it_out(alpha, job_in, status: str) -> None:
    for action in MOVES:
        job_id = job_in(status)
        answer = alpha.post(f"/v1/jobs/{job_id}/{action}")
        if action in EXPECTED[status]:
            assert answer.status_code == 200 and answer.json()["status"] != status, (action, answer.text)
        elif (action, status) in ASKED_ALREADY:
            assert answer.status_code == 200 and answer.json()["status"] == status, (action, answer.text)
        else:
            refused = answer.json()["error"]["code"] if answer.status_code == 409 else answer.text
            assert refused == "conflict", (action, status)
            assert alpha.get(f"/v1/jobs/{job_id}").json()["status"] == status
    job_id = job_in(status)
    other = next(priority for priority in PRIORITIES if priority != "normal")
    changed = alpha.patch(f"/v1/jobs/{job_id}", json={"priority": other})
    assert changed.status_code == (200 if "set_priority" in EXPECTED[status] else 409), changed.text
    assert alpha.post(f"/v1/jobs/{job_id}/clone").status_code == 201


def test_an_answer_carries_the_actions_of_the_status_it_left_the_job_in(alpha, job_in) -> None:
    job_id = job_in("running")
    assert alpha.post(f"/v1/jobs/{job_id}/pause").json()["actions"] == EXPECTED["pausing"]
    assert alpha.post(f"/v1/jobs/{job_id}/cancel").json()["actions"] == EXPECTED["cancelling"]
