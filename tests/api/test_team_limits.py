"""A team's limits over real HTTP (Postgres and SQLite): the highest priority class its members
may use, at every way a job's class is set (submit, clone, retry, resume, PATCH), and the cap on
its waiting jobs, at every way a job enters the queue; both set by admins per team
(``PUT /v1/admin/teams/{team}/limits``, ``grpo admin set-team-limits``). Rate limits:
tests/api/test_rate_limits.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.fixture
def admin(client_for, team_keys):
    return client_for(team_keys.admin)


@pytest.fixture
def team(fresh_team):
    """``(name, member client)`` of a team of the test's own, at the deployment's defaults."""
    return fresh_team


def error_of(response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error


def set_limits(admin, team: str, **limits) -> dict:
    response = admin.put(f"/v1/admin/teams/{team}/limits", json=limits)
    assert response.status_code == 200, response.text
    return response.json()


def job_ids(client) -> list[int]:
    return [job["id"] for job in client.get("/v1/jobs", params={"limit": 100}).json()["items"]]


def test_a_member_cannot_give_a_job_a_class_above_the_teams_highest(admin, team, job_spec) -> None:
    name, member = team
    error = error_of(member.post("/v1/jobs", json=job_spec(priority="high")), 422, "priority")
    assert "above your team's highest class 'normal'" in error["message"]
    assert job_ids(member) == []  # nothing was queued
    job = member.post("/v1/jobs", json=job_spec()).json()
    assert job["priority"] == "normal"

    error_of(member.patch(f"/v1/jobs/{job['id']}", json={"priority": "high"}), 422, "priority")
    assert member.get(f"/v1/jobs/{job['id']}").json()["priority"] == "normal"  # rolled back
    assert member.patch(f"/v1/jobs/{job['id']}", json={"priority": "low"}).json()["priority"] == "low"

    # An admin may raise it; the member may then not carry that class anywhere else.
    raised = admin.patch(f"/v1/jobs/{job['id']}", json={"priority": "high"})
    assert raised.status_code == 200 and raised.json()["spec"]["priority"] == "high"
    error_of(member.post(f"/v1/jobs/{job['id']}/clone"), 422, "priority")
    clone = member.post(f"/v1/jobs/{job['id']}/clone", json={"priority": "normal"})
    assert clone.status_code == 201 and clone.json()["priority"] == "normal"
    assert member.post(f"/v1/jobs/{job['id']}/pause").json()["status"] == "paused"
    error_of(member.post(f"/v1/jobs/{job['id']}/resume"), 422, "priority")
    assert member.get(f"/v1/jobs/{job['id']}").json()["status"] == "paused"  # the move rolled back
    assert member.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    error_of(member.post(f"/v1/jobs/{job['id']}/retry"), 422, "priority")
    assert member.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"
    assert admin.post(f"/v1/jobs/{job['id']}/retry").json()["status"] == "queued"

    set_limits(admin, name, max_priority="high")
    assert member.post("/v1/jobs", json=job_spec(priority="high")).json()["priority"] == "high"


def test_a_team_held_to_low_gets_low_by_default(admin, team, job_spec) -> None:
    name, member = team
    set_limits(admin, name, max_priority="low")
    assert member.post("/v1/jobs", json=job_spec()).json()["priority"] == "low"
    error_of(member.post("/v1/jobs", json=job_spec(priority="normal")), 422, "priority")
    keyed = {"Idempotency-Key": "low-default"}
    first = member.post("/v1/jobs", json=job_spec(name="keyed"), headers=keyed)
    again = member.post("/v1/jobs", json=job_spec(name="keyed"), headers=keyed)
    assert (first.status_code, again.status_code, again.json()["id"]) == (201, 200, first.json()["id"])


def test_the_queue_cap_holds_at_every_way_into_the_queue(admin, team, job_spec) -> None:
    name, member = team
    set_limits(admin, name, max_queued_jobs=2)
    first, second = (member.post("/v1/jobs", json=job_spec()).json() for _ in range(2))
    error = error_of(member.post("/v1/jobs", json=job_spec()), 409, "max_queued_jobs")
    assert error["code"] == "queue_full" and "2 jobs waiting" in error["message"]
    error_of(member.post(f"/v1/jobs/{first['id']}/clone"), 409, "max_queued_jobs")
    assert len(job_ids(member)) == 2

    member.post(f"/v1/jobs/{second['id']}/pause")  # a paused job waits for nothing: room for one
    third = member.post("/v1/jobs", json=job_spec())
    assert third.status_code == 201, third.text
    error_of(member.post(f"/v1/jobs/{second['id']}/resume"), 409, "max_queued_jobs")
    assert member.get(f"/v1/jobs/{second['id']}").json()["status"] == "paused"
    member.post(f"/v1/jobs/{third.json()['id']}/cancel")
    assert member.post(f"/v1/jobs/{second['id']}/cancel").json()["status"] == "cancelled"
    assert member.post(f"/v1/jobs/{second['id']}/retry").json()["status"] == "queued"
    error_of(member.post(f"/v1/jobs/{third.json()['id']}/retry"), 409, "max_queued_jobs")

    replay = {"Idempotency-Key": "cap"}  # a replay queues nothing, so the cap does not refuse it
    set_limits(admin, name, max_queued_jobs=3)
    keyed = member.post("/v1/jobs", json=job_spec(), headers=replay)
    assert keyed.status_code == 201
    assert member.post("/v1/jobs", json=job_spec(), headers=replay).status_code == 200


def test_concurrent_submits_never_pass_the_cap(admin, team, job_spec) -> None:
    name, member = team
    set_limits(admin, name, max_queued_jobs=3)
    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(lambda _: member.post("/v1/jobs", json=job_spec()).status_code, range(12)))
    assert codes == [201] * 3 + [409] * 9
    assert len(job_ids(member)) == 3


def test_team_limits_are_set_by_admins_and_checked(admin, team, client_for, team_keys) -> None:
    name, member = team
    path = f"/v1/admin/teams/{name}/limits"
    teams = {t["name"]: t for t in admin.get("/v1/admin/teams").json()["items"]}
    assert set(teams[name]["limits"].values()) == {None}  # the defaults
    body = {"max_priority": "high", "max_queued_jobs": 5, "reads_per_second": 2.5, "read_burst": 10,
            "writes_per_second": 1, "write_burst": 4, "serve_idle_seconds": 120, "gpu_hours_budget": 12.5,
            "budget_period": "week"}
    assert set_limits(admin, name, **body)["limits"] == body
    for bad, param in (({"max_priority": "urgent"}, "max_priority"),
                       ({"max_queued_jobs": -1}, "max_queued_jobs"),
                       ({"reads_per_second": 0}, "reads_per_second"), ({"write_burst": 0}, "write_burst"),
                       ({"reads_per_second": "inf"}, "reads_per_second"), ({"burst": 3}, "burst"),
                       ({"serve_idle_seconds": 0}, "serve_idle_seconds"),
                       ({"gpu_hours_budget": -1}, "gpu_hours_budget"),
                       ({"gpu_hours_budget": "nan"}, "gpu_hours_budget"),
                       ({"budget_period": "year"}, "budget_period")):
        error_of(admin.put(path, json=bad), 422, param)
    error_of(admin.put("/v1/admin/teams/nobody/limits", json={}), 404, "team")
    assert member.put(path, json={"max_priority": "high"}).status_code == 403
    assert client_for(team_keys.alpha).put(path, json={}).status_code == 403
    assert {t["name"]: t for t in admin.get("/v1/admin/teams").json()["items"]}[name]["limits"] == body
    cleared = set_limits(admin, name, max_queued_jobs=5)  # a PUT replaces: the rest back to defaults
    assert cleared["limits"] == {**dict.fromkeys(body), "max_queued_jobs": 5}
