"""GPU-seconds per team and pool over a window (``api.store.usage``, ``GET /v1/usage``), on
Postgres and SQLite: allocations built by hand with known times, each expected value worked
out by hand below, then the same rows seen through the API by a member and an admin."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

T0 = datetime(2020, 1, 1, tzinfo=UTC)  # the store tests' window is [T0, T0 + 1000 s)
UNTIL = T0 + timedelta(seconds=1000)
DAY = datetime(2021, 3, 1, tzinfo=UTC)  # the API tests' window is [DAY, DAY + 1 day)


def at(seconds: float, base: datetime = T0) -> datetime:
    return base + timedelta(seconds=seconds)


@pytest.fixture(scope="module")
def allocate(api_database_url: str, job_spec):
    """``allocate(team, pool, gpus, start, end)``: a job of ``team`` (created on first use)
    holding ``gpus`` GPUs of ``pool`` from ``start`` to ``end`` (None: still holding)."""
    from api.domain.job_spec import JobSpec
    from api.store.db import session_scope
    from api.store.jobs import create_job
    from api.store.tables import Allocation
    from api.store.teams import create_team, team_id_by_name

    def make(team: str, pool: str, gpus: int, start: datetime, end: datetime | None) -> None:
        with session_scope(api_database_url) as session:
            team_id = team_id_by_name(session, team)
            if team_id is None:
                team_id = create_team(session, team).id
            job, _ = create_job(session, team_id, JobSpec.model_validate(job_spec()))
            session.add(Allocation(job_id=job.id, team_id=team_id, pool=pool, gpus=gpus, started_at=start,
                                   ended_at=end))

    return make


@pytest.fixture(scope="module")
def teams(allocate) -> tuple[str, str]:
    """Two teams of their own with the store tests' allocations."""
    one, two = f"u1{uuid.uuid4().hex[:6]}", f"u2{uuid.uuid4().hex[:6]}"
    allocate(one, "p1", 2, at(-300), at(100))  # straddles the start: 100 s x 2 = 200
    allocate(one, "p1", 1, at(400), None)  # still running: from 400 s to now (or until)
    allocate(one, "p2", 4, at(50), at(1100))  # another pool, straddles the end: 950 s x 4 = 3800
    allocate(two, "p1", 3, at(-500), at(-10))  # ended before the window: nothing
    allocate(two, "p1", 3, at(1000), None)  # starts at until, which is excluded: nothing
    allocate(two, "p1", 1, at(999.5), at(1000.25))  # half a second inside
    return one, two


def usage_of(database_url: str, since: datetime, until: datetime, now: datetime, team_id=None) -> dict:
    from api.store.db import session_scope
    from api.store.usage import gpu_usage

    with session_scope(database_url) as session:
        rows = gpu_usage(session, since, until, now, team_id)
    return {(row.team, row.pool): row.gpu_seconds for row in rows}


def test_gpu_seconds_are_the_overlap_of_each_allocation_with_the_window(api_database_url, teams) -> None:
    one, two = teams
    after_the_window = at(5000)  # the running one counts up to until: 600 s x 1
    assert usage_of(api_database_url, T0, UNTIL, after_the_window) == {
        (one, "p1"): 200 + 600, (one, "p2"): 3800, (two, "p1"): 0.5}
    inside_the_window = at(700)  # the running one counts up to now: 300 s x 1; later ones are not yet
    assert usage_of(api_database_url, T0, UNTIL, inside_the_window) == {
        (one, "p1"): 200 + 300, (one, "p2"): 3800, (two, "p1"): 0.5}


def test_one_team_and_an_empty_window(api_database_url, teams) -> None:
    from api.store.db import session_scope
    from api.store.teams import team_id_by_name

    one, two = teams
    with session_scope(api_database_url) as session:
        two_id = team_id_by_name(session, two)
    assert usage_of(api_database_url, T0, UNTIL, at(5000), two_id) == {(two, "p1"): 0.5}
    assert usage_of(api_database_url, at(-2000), at(-600), at(5000)) == {}


# ---- GET /v1/usage ----

@pytest.fixture(scope="module")
def api_rows(allocate, team_keys) -> None:
    """alpha: 2 GPUs for an hour, 1 GPU for 30 min of another pool; beta: 1 GPU for 2 hours,
    half of it before the window."""
    allocate("alpha", "default", 2, at(3600, DAY), at(7200, DAY))
    allocate("alpha", "gpu-b", 1, at(0, DAY), at(1800, DAY))
    allocate("beta", "default", 1, at(-3600, DAY), at(3600, DAY))


def window(client, **params):
    response = client.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_member_sees_its_own_team_and_an_admin_every_team(client_for, team_keys, api_rows) -> None:
    params = {"since": "2021-03-01T00:00:00Z", "until": "2021-03-02T00:00:00Z"}
    alpha = [{"team": "alpha", "pool": "default", "gpu_seconds": 7200.0, "gpu_hours": 2.0},
             {"team": "alpha", "pool": "gpu-b", "gpu_seconds": 1800.0, "gpu_hours": 0.5}]
    beta = [{"team": "beta", "pool": "default", "gpu_seconds": 3600.0, "gpu_hours": 1.0}]
    seen = window(client_for(team_keys.alpha), **params)
    budgets = seen.pop("budgets")
    assert seen == {"since": "2021-03-01T00:00:00Z", "until": "2021-03-02T00:00:00Z", "items": alpha}
    # This period's budget, whatever the window: none set, and nothing used since (the rows are of 2021).
    assert [(b["team"], b["gpu_hours_budget"], b["used_gpu_hours"], b["left_gpu_hours"])
            for b in budgets] == [("alpha", None, 0, None)]
    assert window(client_for(team_keys.beta), **params)["items"] == beta
    admin = window(client_for(team_keys.admin), **params)
    assert [item for item in admin["items"] if item["team"] in ("alpha", "beta")] == alpha + beta
    assert {"alpha", "beta", "default"} <= {budget["team"] for budget in admin["budgets"]}


def test_the_window_defaults_to_the_last_7_days_or_days_before_until(client_for, team_keys, api_rows) -> None:
    alpha = client_for(team_keys.alpha)
    default = window(alpha)
    since, until = (datetime.fromisoformat(default[key].replace("Z", "+00:00")) for key in ("since", "until"))
    assert until - since == timedelta(days=7) and abs(until - datetime.now(UTC)) < timedelta(minutes=5)
    # An offset is read as one; 2 days back from 2021-03-02T01:00Z covers all of alpha's rows.
    back = window(alpha, days=2, until="2021-03-02T02:00:00+01:00")
    assert (back["since"], back["until"]) == ("2021-02-28T01:00:00Z", "2021-03-02T01:00:00Z")
    assert [item["gpu_seconds"] for item in back["items"]] == [7200.0, 1800.0]
    assert window(alpha, since="2021-03-01T01:30:00", until="2021-03-01T02:00:00")["items"] == [
        {"team": "alpha", "pool": "default", "gpu_seconds": 3600.0, "gpu_hours": 1.0}]


@pytest.mark.parametrize(("params", "param"), [
    ({"days": 3, "since": "2021-03-01T00:00:00Z"}, "days"),
    ({"since": "2021-03-02T00:00:00Z", "until": "2021-03-01T00:00:00Z"}, "since"),
    ({"since": "2020-01-01T00:00:00Z", "until": "2021-03-01T00:00:00Z"}, "since"),
    ({"days": 367}, "days"),
    ({"days": 0}, "days"),
    ({"until": "0001-01-02T00:00:00Z"}, "until"),
    ({"since": "9999-12-31T23:00:00-05:00"}, "since"),
])
def test_a_bad_window_is_a_422_naming_its_parameter(client_for, team_keys, params, param) -> None:
    response = client_for(team_keys.alpha).get("/v1/usage", params=params)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param


# ---- grpo usage ----

def grpo(capsys, server, key: str, *argv: str) -> tuple[int, str, str]:
    from api.cli.main import main

    capsys.readouterr()
    code = main(["usage", *argv, "--api-url", server.http_url, "--api-key", key])
    out, err = capsys.readouterr()
    return code, out, err


def test_grpo_usage_prints_the_apis_rows_as_a_table(capsys, api_server, client_for, team_keys,
                                                     api_rows) -> None:
    import json

    window_args = ("--since", "2021-03-01T00:00:00Z", "--until", "2021-03-02T00:00:00Z")
    code, out, _ = grpo(capsys, api_server, team_keys.alpha, *window_args)
    assert code == 0
    assert out.splitlines()[:6] == [
        "GPU use from 2021-03-01 00:00:00 to 2021-03-02 00:00:00 UTC",
        "TEAM   POOL     GPU-HOURS  GPU-SECONDS",
        "alpha  default          2         7200",
        "alpha  gpu-b          0.5         1800",
        "",
        "GPU-hour budgets this period (UTC)",
    ]
    [budget] = [line.split() for line in out.splitlines()[7:]]  # under its header: alpha's, none set
    assert budget[:5] == ["alpha", "month", "none", "0", "none"]
    code, out, _ = grpo(capsys, api_server, team_keys.alpha, *window_args, "--json")
    answer = client_for(team_keys.alpha).get("/v1/usage", params={"since": "2021-03-01T00:00:00Z",
                                                                   "until": "2021-03-02T00:00:00Z"}).json()
    assert code == 0 and json.loads(out) == answer
    code, out, _ = grpo(capsys, api_server, team_keys.beta, "--days", "1", "--until", "2021-02-01T00:00:00Z")
    assert code == 0 and out.splitlines()[1] == "no GPU use in this window"


def test_grpo_usage_refuses_a_bad_window(capsys, api_server, team_keys) -> None:
    code, _, err = grpo(capsys, api_server, team_keys.alpha, "--days", "400")
    assert code == 2 and "days" in err
    with pytest.raises(SystemExit) as refused:  # argparse: --days and --since exclude each other
        grpo(capsys, api_server, team_keys.alpha, "--days", "3", "--since", "2021-03-01T00:00:00Z")
    assert refused.value.code == 2
