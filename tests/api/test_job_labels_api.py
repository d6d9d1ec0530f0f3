"""Finding jobs again: ``tags`` and ``description`` on a spec and on ``PATCH``, and
``GET /v1/jobs?tag=&q=`` with the status filter and the cursor, over real HTTP on Postgres and on
SQLite (``api_server``). The module's server is shared, so each test tags its jobs with a tag of
its own and filters by it."""

from __future__ import annotations

import uuid

import pytest


def submit(client, spec: dict) -> dict:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return response.json()


def listed(client, **params) -> list[int]:
    """The ids of every job the filters match, page after page of one job each (the cursor)."""
    ids: list[int] = []
    after = 0
    while True:
        response = client.get("/v1/jobs", params={**params, "limit": 1, "after": after})
        assert response.status_code == 200, response.text
        page = response.json()
        ids += [job["id"] for job in page["items"]]
        if page["next_after"] is None:
            return ids
        after = page["next_after"]


@pytest.fixture
def mine() -> str:
    """A tag no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


def test_submitted_tags_and_description_are_read_back(api, job_spec, mine) -> None:
    job = submit(api, job_spec(name="labelled", tags=[mine, "team:nlp", mine, "exp/v2"],
                               description="Tries a longer\ncontext"))
    assert job["tags"] == [mine, "team:nlp", "exp/v2"]  # a repeat counts once, the order is kept
    assert job["description"] == "Tries a longer\ncontext"
    assert job["spec"]["tags"] == job["tags"] and job["spec"]["description"] == job["description"]
    read = api.get(f"/v1/jobs/{job['id']}").json()
    summary = api.get("/v1/jobs", params={"tag": mine}).json()["items"]
    assert (read["tags"], read["description"]) == (job["tags"], job["description"])
    assert [(item["id"], item["tags"], item["description"]) for item in summary] == [
        (job["id"], job["tags"], job["description"])]
    plain = submit(api, job_spec(name="plain"))
    assert (plain["tags"], plain["description"]) == ([], None)
    assert "tags" not in plain["spec"] and "description" not in plain["spec"]  # as specs from before


def test_tags_filter_needs_all_of_them_and_pages_by_the_cursor(api, job_spec, mine) -> None:
    both = [submit(api, job_spec(name=f"both-{i}", tags=[mine, "gpu"]))["id"] for i in range(3)]
    only_mine = submit(api, job_spec(name="only-mine", tags=[mine]))["id"]
    submit(api, job_spec(name="only-gpu", tags=["gpu"]))
    assert listed(api, tag=mine) == [*both, only_mine]
    assert listed(api, tag=[mine, "gpu"]) == both
    assert listed(api, tag=[mine, "gpu"], order="desc") == both[::-1]
    assert listed(api, tag=[mine, "no-such-tag"]) == []
    api.post(f"/v1/jobs/{both[1]}/cancel").raise_for_status()
    assert listed(api, tag=mine, status="queued") == [both[0], both[2], only_mine]
    assert listed(api, tag=mine, status=["cancelled", "failed"]) == [both[1]]


def test_search_ignores_case_in_name_and_description_and_takes_wildcards_literally(api, job_spec,
                                                                                   mine) -> None:
    by_name = submit(api, job_spec(name="Reasoning-Sweep_3", tags=[mine]))["id"]
    by_text = submit(api, job_spec(name="other", tags=[mine], description="a REASONING run at 50% lr"))["id"]
    neither = submit(api, job_spec(name="reasoningXsweepY3", tags=[mine]))["id"]
    assert listed(api, tag=mine, q="reasoning") == [by_name, by_text, neither]
    assert listed(api, tag=mine, q="reasoning-sweep") == [by_name]
    assert listed(api, tag=mine, q="sweep_3") == [by_name]  # "_" is no one-character wildcard
    assert listed(api, tag=mine, q="50%") == [by_text]
    assert listed(api, tag=mine, q="%") == [by_text]  # "%" is no "anything"
    assert listed(api, tag=mine, q="reasoning", status="queued", order="desc") == [neither, by_text, by_name]
    too_long = api.get("/v1/jobs", params={"q": "x" * 201})
    assert too_long.status_code == 422 and too_long.json()["error"]["param"] == "q"


def test_patch_changes_tags_and_description_in_the_read_the_spec_and_the_filter(api, job_spec,
                                                                                  mine) -> None:
    job = submit(api, job_spec(name="to-relabel", tags=[mine, "old"], description="first words"))
    api.post(f"/v1/jobs/{job['id']}/cancel").raise_for_status()  # labels change in any status
    changed = api.patch(f"/v1/jobs/{job['id']}", json={"tags": [mine, "new", "new"]})
    assert changed.status_code == 200, changed.text
    read = api.get(f"/v1/jobs/{job['id']}").json()
    for seen in (changed.json(), read):
        assert (seen["tags"], seen["spec"]["tags"]) == ([mine, "new"], [mine, "new"])
        assert (seen["description"], seen["spec"]["description"]) == ("first words", "first words")
    assert read["spec"] == {**job["spec"], "tags": [mine, "new"]}  # nothing else in the spec moved
    assert listed(api, tag=[mine, "new"]) == [job["id"]] and listed(api, tag=[mine, "old"]) == []
    cleared = api.patch(f"/v1/jobs/{job['id']}", json={"description": None}).json()
    assert cleared["description"] is None and "description" not in cleared["spec"]  # as a spec without one
    assert cleared["tags"] == [mine, "new"]
    assert listed(api, tag=mine, q="first") == []
    clone = api.post(f"/v1/jobs/{job['id']}/clone", json={"name": "relabelled-copy"})
    assert clone.status_code == 201, clone.text
    assert listed(api, tag=[mine, "new"]) == [job["id"], clone.json()["id"]]


def test_a_refused_part_of_a_patch_changes_nothing(api, job_spec, mine) -> None:
    job = submit(api, job_spec(name="finished", tags=[mine]))
    api.post(f"/v1/jobs/{job['id']}/cancel").raise_for_status()
    late = api.patch(f"/v1/jobs/{job['id']}", json={"priority": "high", "tags": [mine, "late"]})
    assert late.status_code == 409
    assert api.get(f"/v1/jobs/{job['id']}").json()["tags"] == [mine]
    both = submit(api, job_spec(name="waiting", tags=[mine]))
    moved = api.patch(f"/v1/jobs/{both['id']}", json={"priority": "high", "description": "urgent"}).json()
    assert (moved["priority"], moved["description"], moved["spec"]["priority"]) == ("high", "urgent", "high")
    assert moved["spec"]["description"] == "urgent"


@pytest.mark.parametrize(("body", "param"), [
    ({"tags": ["ok", "has space"]}, "tags.1"),
    ({"tags": ["ok", "", "x"]}, "tags.1"),
    ({"tags": ["a" * 65]}, "tags.0"),
    ({"tags": [f"t{i}" for i in range(17)]}, "tags"),
    ({"description": "bell\x07"}, "description"),
    ({"description": "x" * 2001}, "description"),
])
def test_bad_labels_are_422_naming_the_field(api, job_spec, body, param) -> None:
    refused = api.post("/v1/jobs", json=job_spec(name="bad-labels", **body))
    assert refused.status_code == 422 and refused.json()["error"]["param"] == param, refused.text
    job = submit(api, job_spec(name="good-labels"))
    patched = api.patch(f"/v1/jobs/{job['id']}", json=body)
    assert patched.status_code == 422 and patched.json()["error"]["param"] == param, patched.text


def test_a_patch_must_change_something(api, job_spec) -> None:
    job = submit(api, job_spec(name="unchanged"))
    for body in ({}, {"tags": None}, {"priority": None}):
        refused = api.patch(f"/v1/jobs/{job['id']}", json=body)
        assert refused.status_code == 422, (body, refused.text)
    bad_filter = api.get("/v1/jobs", params={"tag": ["ok", "not ok"]})
    assert bad_filter.status_code == 422 and bad_filter.json()["error"]["param"] == "tag"


def test_another_teams_jobs_never_match(alpha, beta, job_spec, mine) -> None:
    theirs = submit(alpha, job_spec(name="alpha-secret", tags=[mine], description="shared words"))
    ours = submit(beta, job_spec(name="beta-job", tags=[mine], description="shared words"))
    assert listed(beta, tag=mine) == [ours["id"]]
    assert listed(beta, q="shared words", tag=mine) == [ours["id"]]
    assert listed(beta, q="alpha-secret") == []
    assert beta.patch(f"/v1/jobs/{theirs['id']}", json={"tags": ["mine-now"]}).status_code == 404
    assert alpha.get(f"/v1/jobs/{theirs['id']}").json()["tags"] == [mine]
