"""``grpo list --tag T --search TEXT`` through ``api.cli.main.main`` against the module's real
uvicorn server (Postgres and SQLite): the same jobs as ``GET /v1/jobs?tag=&q=``, across pages,
and the tags in the table."""

from __future__ import annotations

import uuid

import pytest
from test_monitor_cli import Grpo


@pytest.fixture
def grpo(capsys, api_server, team_keys) -> Grpo:
    return Grpo(capsys, api_server.http_url, team_keys.alpha)


@pytest.fixture
def alpha(client_for, team_keys):
    return client_for(team_keys.alpha)


def listed(grpo: Grpo, *argv: str) -> list[int]:
    return [job["id"] for job in grpo.json("list", "--all", *argv)["items"]]


def test_list_filters_by_tags_and_text_like_the_api(grpo, alpha, job_spec, monkeypatch) -> None:
    mine = f"cli-{uuid.uuid4().hex[:8]}"
    ids = []
    for name, tags, description in (("Sweep-A", [mine, "gpu"], None), ("other", [mine], "a SWEEP of lr"),
                                    ("sweep-b", [mine, "gpu"], None), ("untagged-sweep", [], None)):
        response = alpha.post("/v1/jobs", json=job_spec(name=name, tags=tags, description=description))
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    monkeypatch.setattr("api.cli.client.JOBS_PAGE", 1)  # every job a page of its own: the filters hold across
    both = grpo.json("list", "--all", "--tag", mine, "--tag", "gpu")["items"]
    assert both == alpha.get("/v1/jobs", params={"tag": [mine, "gpu"], "order": "desc"}).json()["items"]
    assert listed(grpo, "--tag", mine, "--tag", "gpu") == [ids[2], ids[0]]
    assert listed(grpo, "--tag", f"{mine},gpu") == [ids[2], ids[0]]
    assert listed(grpo, "--tag", mine, "--search", "sweep", "--oldest-first") == ids[:3]
    assert listed(grpo, "--tag", mine, "--search", "SWEEP-") == [ids[2], ids[0]]
    code, out, err = grpo("list", "--tag", mine, "--search", "other")
    lines = out.splitlines()
    assert code == 0 and err == "" and lines[0].split()[-1] == "TAGS" and len(lines) == 2
    assert lines[1].split()[:2] == [str(ids[1]), "other"] and lines[1].split()[-1] == mine
    code, out, _ = grpo("list", "--tag", mine, "--search", "nothing-like-it")
    assert code == 0 and out.splitlines()[0].split()[0] == "ID" and len(out.splitlines()) == 1
    code, _, err = grpo("list", "--tag", "not ok")
    assert code == 2 and err.startswith("error: HTTP 422: tag:")
