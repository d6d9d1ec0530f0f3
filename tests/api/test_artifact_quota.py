"""A team's artifact quota counts its jobs' artifacts and its uploaded files, read where they are
kept (the local folder store and an S3 bucket on moto's server process: ``store_server``), through
the real API: ``GET /v1/me`` shows both parts, an upload that would pass the quota is refused
before it is stored (413 ``artifact_quota_exceeded`` naming the figures), and deleting a file or a
job frees its bytes. Uploads checked at once take turns, so two never fit in the room for one;
``grpo me`` prints the parts."""

from __future__ import annotations

import uuid

import httpx
import pytest

from api.storage import ObjectStore
from api.storage.keys import file_key
from api.store import teams
from api.store.db import session_scope

ROWS = b'{"prompt": "2+3?", "answer": "5"}\n'
WEIGHTS = 5000


@pytest.fixture
def team(api_server, make_key) -> tuple[str, str]:
    """``(name, member key)`` of a team of the test's own, so its usage starts at zero."""
    name = f"q{uuid.uuid4().hex[:8]}"
    with session_scope(api_server.settings.database_url) as session:
        teams.create_team(session, name)
    return name, make_key(api_server.settings.database_url, name)


def usage(client: httpx.Client) -> tuple[int, int, int]:
    """``(artifact_bytes, job_artifact_bytes, file_bytes)`` of ``GET /v1/me``."""
    me = client.get("/v1/me")
    assert me.status_code == 200, me.text
    return me.json()["artifact_bytes"], me.json()["job_artifact_bytes"], me.json()["file_bytes"]


def upload(client: httpx.Client, content: bytes) -> httpx.Response:
    return client.post("/v1/files", data={"purpose": "dataset"}, files={"file": ("rows.jsonl", content)})


def set_quota(database_url: str, team: str, count: int | None) -> None:
    with session_scope(database_url) as session:
        teams.set_artifact_quota(session, team, count)


def finished_job_with_artifacts(client: httpx.Client, worker, job_spec, store: ObjectStore) -> int:
    """A succeeded job whose final model the store holds, as a worker leaves it."""
    submitted = client.post("/v1/jobs", json=job_spec())
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    worker.start(job_id)
    store.put_stream(f"jobs/{job_id}/model/model.safetensors", [b"w" * (WEIGHTS - 100)])
    store.put_stream(f"jobs/{job_id}/model/config.json", [b"c" * 100])
    worker.finish(job_id)
    return job_id


def test_files_and_job_artifacts_count_and_deleting_either_frees_them(
        store_server, client_for, team, worker, job_spec) -> None:
    server, store = store_server
    name, key = team
    client = client_for(key, server)
    assert usage(client) == (0, 0, 0)

    dataset = upload(client, ROWS)
    assert dataset.status_code == 201, dataset.text
    assert usage(client) == (len(ROWS), 0, len(ROWS))
    job_id = finished_job_with_artifacts(client, worker, job_spec, store)
    assert usage(client) == (WEIGHTS + len(ROWS), WEIGHTS, len(ROWS))

    # Room for 99 more bytes: an upload of 100 is refused before a row or an object is written.
    set_quota(server.settings.database_url, name, WEIGHTS + len(ROWS) + 99)
    listed = client.get("/v1/files").json()["items"]
    objects = [info.key for info in store.list("files")]
    refused = upload(client, ROWS[:-1].ljust(99, b" ") + b"\n")  # 100 bytes, a valid row
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert error["code"] == "artifact_quota_exceeded" and error["param"] == "file"
    used = WEIGHTS + len(ROWS)
    assert error["message"].startswith(
        f"this upload (100 bytes) would take the team's artifacts to {used + 100} bytes, over its quota of "
        f"{used + 99} bytes ({WEIGHTS} bytes of job artifacts and {len(ROWS)} bytes of uploaded files in "
        "use); nothing was stored")
    assert client.get("/v1/files").json()["items"] == listed
    assert [info.key for info in store.list("files")] == objects
    assert upload(client, ROWS).status_code == 201  # what fits is taken
    assert usage(client) == (WEIGHTS + 2 * len(ROWS), WEIGHTS, 2 * len(ROWS))

    # Deleting a file frees its bytes, deleting the job its artifacts': then the upload fits.
    assert client.delete(f"/v1/files/{dataset.json()['id']}").status_code == 200
    assert usage(client) == (WEIGHTS + len(ROWS), WEIGHTS, len(ROWS))
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert usage(client) == (len(ROWS), 0, len(ROWS))
    assert list(store.list(f"jobs/{job_id}")) == []
    accepted = upload(client, ROWS[:-1].ljust(99, b" ") + b"\n")
    assert accepted.status_code == 201, accepted.text
    assert store.stat(file_key(accepted.json()["id"])).size == 100
    assert usage(client) == (len(ROWS) + 100, 0, len(ROWS) + 100)


def test_a_failed_upload_stops_counting_and_another_teams_usage_is_its_own(
        store_server, client_for, team, team_keys, monkeypatch) -> None:
    """An upload the store refused is left ``error``: its bytes are not the team's to pay for
    (the storage sweep removes whatever the store kept of it). Another team's files never count."""
    server, store = store_server
    client = client_for(team[1], server)
    beta = client_for(team_keys.beta, server)
    beta_before = usage(beta)

    from api.storage import StorageUnavailable

    def refused(*args, **kwargs):
        raise StorageUnavailable("the store is away (test)")

    with monkeypatch.context() as patched:  # not the fixture's own settings, which stay
        patched.setattr(type(store), "put_file", refused)
        failed = upload(client, ROWS)
    assert failed.status_code == 503, failed.text
    [row] = client.get("/v1/files").json()["items"]
    assert row["status"] == "error"
    assert usage(client) == (0, 0, 0)
    assert upload(client, ROWS).status_code == 201
    assert usage(client) == (len(ROWS), 0, len(ROWS))
    assert usage(beta) == beta_before


def test_grpo_me_prints_the_two_parts_against_the_quota(capsys, api_server, client_for, team) -> None:
    import json

    from api.cli.main import main

    name, key = team
    client = client_for(key)
    assert upload(client, ROWS).status_code == 201
    set_quota(api_server.settings.database_url, name, 10 * len(ROWS))
    capsys.readouterr()
    assert main(["me", "--api-url", api_server.http_url, "--api-key", key]) == 0
    team_id = client.get("/v1/me").json()["team_id"]
    assert capsys.readouterr().out.splitlines() == [
        f"team {name} (id {team_id}), key {key[:12]}…",
        f"storage: {len(ROWS)} bytes, quota {10 * len(ROWS)} bytes (10.0% used)",
        "  job artifacts:  0 bytes (grpo rm ID frees a finished job's)",
        f"  uploaded files: {len(ROWS)} bytes (grpo files rm ID frees one)"]
    assert main(["me", "--json", "--api-url", api_server.http_url, "--api-key", key]) == 0
    assert json.loads(capsys.readouterr().out) == client.get("/v1/me").json()


def test_uploads_checked_at_once_take_turns_so_two_never_share_the_room_for_one(
        api_server, client_for, team) -> None:
    """The check holds the team's row (Postgres): an upload checked while another's row is being
    written waits for it, then counts it. (SQLite, the embedded database, has no row locks.)"""
    import threading

    from sqlalchemy import select

    from api.store import files
    from api.store.tables import Team

    database_url = api_server.settings.database_url
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite has no row locks: the embedded database is for one user")
    name, key = team
    set_quota(database_url, name, len(ROWS))  # room for one
    with session_scope(database_url) as session:
        team_id = session.scalar(select(Team.id).where(Team.name == name))
    answers: list[httpx.Response] = []
    with session_scope(database_url) as session:
        assert files.quota_for_upload(session, team_id) == (len(ROWS), 0)  # as an upload being checked
        racing = threading.Thread(target=lambda: answers.append(upload(client_for(key), ROWS)))
        racing.start()
        racing.join(1.0)
        assert racing.is_alive() and not answers  # waits for this one's row
        files.add_file(session, files.new_file_id(), team_id, "dataset", "first.jsonl", "jsonl", len(ROWS),
                       "0" * 64)
    racing.join(10)
    [answer] = answers
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "artifact_quota_exceeded"
