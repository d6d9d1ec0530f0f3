"""The Files API (``/v1/files``) through the real service: uploads streamed to the object store
and back on the local folder store and on an S3 bucket (moto's server, a process of its own:
``tests/storage_server.py``), another team's files out of sight and out of reach, ``file:ID``
sources checked at submit, and a file in use by an unfinished job kept (409 naming the job).
The content checks' refusals are in ``test_files_checks.py``, the CLI in ``test_files_cli.py``."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import httpx
import pytest

from api.storage import ObjectNotFound
from api.storage.keys import file_key

TINY_MODEL = Path(__file__).resolve().parents[2] / "examples" / "tiny-model"
ROWS = b'{"prompt": "2+3?", "answer": "5"}\n{"prompt": [{"role": "user", "content": "hi"}]}\n'


def model_archive(folder: Path = TINY_MODEL, top: str = "", gzip: bool = True) -> bytes:
    """``folder``'s files as a tar(.gz), under ``top/`` when given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as archive:
        for path in sorted(folder.iterdir()):
            archive.add(path, arcname=f"{top}{path.name}")
    return buffer.getvalue()


def upload(client: httpx.Client, name: str, content: bytes, purpose: str = "dataset",
           **fields: str) -> httpx.Response:
    return client.post("/v1/files", data={"purpose": purpose, **fields}, files={"file": (name, content)})


def uploaded(client: httpx.Client, name: str, content: bytes, purpose: str = "dataset") -> dict:
    response = upload(client, name, content, purpose)
    assert response.status_code == 201, response.text
    return response.json()


@pytest.mark.parametrize("name, content, purpose, file_format", [
    ("rows.jsonl", ROWS, "dataset", "jsonl"),
    ("tiny.tar.gz", model_archive(top="tiny-model/"), "model", "tar"),
], ids=["dataset", "model"])
def test_an_upload_round_trips_through_the_store(store_server, client_for, team_keys, name, content, purpose,
                                                 file_format) -> None:
    server, store = store_server
    alpha = client_for(team_keys.alpha, server)
    created = uploaded(alpha, name, content, purpose)
    digest = hashlib.sha256(content).hexdigest()
    assert created["id"].startswith("file-") and len(created["id"]) == 29
    assert {key: created[key] for key in ("purpose", "filename", "format", "bytes", "sha256", "status")} == {
        "purpose": purpose, "filename": name, "format": file_format, "bytes": len(content), "sha256": digest,
        "status": "ready"}
    assert store.stat(file_key(created["id"])).sha256 == digest  # the key the worker reads it by

    assert alpha.get(f"/v1/files/{created['id']}").json() == created
    assert created in alpha.get("/v1/files").json()["items"]
    content_response = alpha.get(f"/v1/files/{created['id']}/content")
    assert content_response.status_code == 200 and content_response.content == content
    assert content_response.headers["content-length"] == str(len(content))
    assert content_response.headers["etag"] == f'"{digest}"'

    assert alpha.delete(f"/v1/files/{created['id']}").json() == created
    assert alpha.get(f"/v1/files/{created['id']}").status_code == 404
    with pytest.raises(ObjectNotFound):
        store.stat(file_key(created["id"]))


def test_a_listing_pages_newest_first(alpha) -> None:
    made = [uploaded(alpha, f"p{index}.jsonl", ROWS)["id"] for index in range(3)]
    first = alpha.get("/v1/files", params={"limit": 2}).json()
    second = alpha.get("/v1/files", params={"limit": 2, "after": first["next_after"]}).json()
    listed = [item["id"] for item in first["items"] + second["items"]]
    assert listed[:3] == made[::-1]
    for file_id in made:
        alpha.delete(f"/v1/files/{file_id}")


def test_another_teams_file_is_not_found_nor_usable(alpha, beta, job_spec, pool) -> None:
    mine = uploaded(alpha, "rows.jsonl", ROWS)
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        response = beta.request(method, f"/v1/files/{mine['id']}{path}")
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["param"] == "file_id"
    assert mine["id"] not in [item["id"] for item in beta.get("/v1/files").json()["items"]]
    spec = job_spec(pool=pool, dataset={"source": f"file:{mine['id']}"})
    refused = beta.post("/v1/jobs", json=spec)
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "dataset.source"
    assert "your team has no file" in refused.json()["error"]["message"]
    assert alpha.get(f"/v1/files/{mine['id']}").status_code == 200  # beta's attempts changed nothing
    alpha.delete(f"/v1/files/{mine['id']}")


def test_file_sources_are_checked_at_submit(alpha, job_spec, pool) -> None:
    dataset = uploaded(alpha, "rows.jsonl", ROWS)
    model = uploaded(alpha, "tiny.tar.gz", model_archive(), "model")
    accepted = alpha.post("/v1/jobs", json=job_spec(
        pool=pool, model={"source": f"file:{model['id']}"}, dataset={"source": f"file:{dataset['id']}"},
        eval_dataset={"source": f"file:{dataset['id']}"}))
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["model"]["source"] == f"file:{model['id']}"
    reward = [{"name": "reward_model", "args": {"model": f"file:{model['id']}"}}]
    assert alpha.post("/v1/jobs", json=job_spec(pool=pool, rewards=reward)).status_code == 201

    unknown = f"file-{'0' * 24}"
    for fields, param, words in (
        ({"model": {"source": f"file:{dataset['id']}"}}, "model.source", "uploaded as a dataset"),
        ({"dataset": {"source": f"file:{model['id']}"}}, "dataset.source", "uploaded as a model"),
        ({"eval_dataset": {"source": f"file:{unknown}"}}, "eval_dataset.source", "your team has no file"),
        ({"rewards": [{"name": "reward_model", "args": {"model": f"file:{dataset['id']}"}}]},
         "rewards.0.args.model", "uploaded as a dataset"),
        ({"rewards": [{"name": "reward_model", "args": {"model": f"file:{model['id']}"}},
                      {"name": "reward_model", "args": {"model": "path:tiny"}}]},  # one root for both
         "rewards.1.args.model", "not both"),
        ({"dataset": {"source": "file:abc"}}, "dataset.source", "file:file-"),
        ({"model": {"source": "file:../etc"}}, "model.source", "file:file-"),
    ):
        refused = alpha.post("/v1/jobs", json=job_spec(pool=pool, **fields))
        assert refused.status_code == 422, (fields, refused.text)
        error = refused.json()["error"]
        assert error["param"] == param and words in error["message"], error


def test_a_file_an_unfinished_job_uses_cannot_be_deleted(alpha, job_spec, pool) -> None:
    dataset = uploaded(alpha, "rows.jsonl", ROWS)
    job = alpha.post("/v1/jobs", json=job_spec(pool=pool, dataset={"source": f"file:{dataset['id']}"})).json()
    refused = alpha.delete(f"/v1/files/{dataset['id']}")
    assert refused.status_code == 409, refused.text
    assert f"job {job['id']} (dataset.source)" in refused.json()["error"]["message"]
    assert alpha.get(f"/v1/files/{dataset['id']}/content").content == ROWS  # still there, whole
    assert alpha.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    assert alpha.delete(f"/v1/files/{dataset['id']}").status_code == 200
    # Retried without its file, the job could only fail on its worker: refused, left cancelled.
    retried = alpha.post(f"/v1/jobs/{job['id']}/retry")
    assert retried.status_code == 422 and retried.json()["error"]["param"] == "dataset.source", retried.text
    assert alpha.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"


def test_the_openapi_document_describes_the_upload(api) -> None:
    operation = api.get("/openapi.json").json()["paths"]["/v1/files"]["post"]
    schema = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert schema["required"] == ["file", "purpose"]
    assert schema["properties"]["purpose"]["enum"] == ["dataset", "model", "fine-tune"]
