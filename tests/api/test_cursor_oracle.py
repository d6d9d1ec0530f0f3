"""Issue 32 item 6: no oracle in cursors. On every listing with an ``after`` cursor, another
team's id answers exactly as an id never used at the same place in the order: it tells the
caller nothing of whether the id exists or when it was made. (Webhook deliveries: tests of their
own, ``test_webhooks*.py``.) Ids never used are drawn from the same Postgres sequence, so they
stand where the other team's id stands; a file's id is random, so a never-used one is made up."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from api.store.db import session_scope

pytestmark = pytest.mark.parametrize("api_database_url", ["postgres"], indirect=True)


def _never_used(server, table: str) -> int:
    """An id the table's sequence hands out and no row will ever have."""
    with session_scope(server.settings.database_url) as session:
        return session.execute(text(f"SELECT nextval(pg_get_serial_sequence('{table}', 'id'))")).scalar_one()


def _same_answer(client, path: str, theirs, never_used, **params) -> dict:
    with_theirs = client.get(path, params={**params, "after": theirs})
    with_unused = client.get(path, params={**params, "after": never_used})
    assert with_theirs.status_code == with_unused.status_code == 200, (with_theirs.text, with_unused.text)
    assert with_theirs.json() == with_unused.json(), path
    return with_theirs.json()


def _upload(client, name: str) -> str:
    response = client.post("/v1/files", data={"purpose": "dataset"},
                           files={"file": (name, b'{"prompt": "hi"}\n')})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_files_after_another_teams_id_is_as_after_an_unknown_one(alpha, beta) -> None:
    mine = [_upload(alpha, f"a{n}.jsonl") for n in range(3)]
    theirs = _upload(beta, "b.jsonl")
    mine.append(_upload(alpha, "a3.jsonl"))
    page = _same_answer(alpha, "/v1/files", theirs, f"file-{uuid.uuid4().hex[:24]}", limit=200)
    assert mine[-1] in [item["id"] for item in page["items"]]  # from the newest, as for any unknown id


def test_jobs_after_another_teams_id_is_as_after_a_never_used_one(api_server, alpha, beta, job_spec) -> None:
    alpha.post("/v1/jobs", json=job_spec(name="mine-before"))
    never_used = _never_used(api_server, "jobs")
    theirs = beta.post("/v1/jobs", json=job_spec(name="theirs")).json()["id"]
    after = [alpha.post("/v1/jobs", json=job_spec(name=f"mine-{n}")).json()["id"] for n in range(2)]
    page = _same_answer(alpha, "/v1/jobs", theirs, never_used, limit=100)
    assert [job["id"] for job in page["items"]] == after
    for params in ({"order": "desc"}, {"include": "spec"}, {"q": "mine"}):
        _same_answer(alpha, "/v1/jobs", theirs, never_used, limit=100, **params)


def test_events_after_another_teams_event_id_is_as_after_a_never_used_one(api_server, alpha, beta,
                                                                           job_spec) -> None:
    mine = alpha.post("/v1/jobs", json=job_spec(name="mine")).json()["id"]
    other = beta.post("/v1/jobs", json=job_spec(name="theirs")).json()["id"]
    theirs = beta.get(f"/v1/jobs/{other}/events").json()["items"][-1]["id"]
    never_used = _never_used(api_server, "job_events")
    assert alpha.post(f"/v1/jobs/{mine}/cancel").status_code == 200
    page = _same_answer(alpha, f"/v1/jobs/{mine}/events", theirs, never_used)
    assert page["items"] and all(event["id"] > never_used for event in page["items"])
