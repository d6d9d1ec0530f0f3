"""Issue 26's end to end, through the real stack (``grpo api``, the scheduler and Celery workers,
each its own process): a team uploads a dataset and a model (the tiny model packed as a tar.gz)
through ``POST /v1/files`` and submits a job naming both as ``file:`` sources; the job succeeds and
its final model downloads through the API; another team can neither see those files (404) nor
submit with them (422).

With ``GRPO_STORAGE_URL`` at an S3 server process (moto's server mode, tests/storage_server.py),
the API and two workers share no folder: each has its own artifacts folder and cache, the bucket
is all they share, so the worker that ran the job read the uploads from the bucket into its own
cache and the other read nothing. With the local default store (the artifacts folder, which the
API and a worker then share) the same job runs the same way. A cache hit for a second job is
worker/test_file_sources.py's (in one process: cheaper than a second training run here)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid
from pathlib import Path

import httpx
import pytest

from api.store import teams
from api.store.db import session_scope

pytestmark = pytest.mark.slow

TOKEN = "uploaded-files-operator-token-5c0e93b1"
ROWS = [{"prompt": "Is it yes?"}, {"prompt": "What is 2+3?"}, {"prompt": "hello world"}]
JSONL = "".join(json.dumps(row) + "\n" for row in ROWS).encode()


@pytest.fixture(scope="module")
def members(database_url: str) -> dict[str, str]:
    """A member's key of each of two teams of the module's database."""
    keys = {}
    with session_scope(database_url) as session:
        for team in ("alpha", "beta"):
            teams.create_team(session, team)
            keys[team] = teams.create_key(session, team, False, f"{team} member")[1]
    return keys


def packed(folder: Path, top: str) -> bytes:
    """``folder`` as ``tar czf m.tgz top/`` makes it: the files under one top folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(folder, arcname=top)
    return buffer.getvalue()


def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60, trust_env=False)


def uploaded(api: httpx.Client, name: str, content: bytes, purpose: str) -> str:
    response = api.post("/v1/files", data={"purpose": purpose}, files={"file": (name, content)})
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "ready"
    return response.json()["id"]


@pytest.mark.parametrize("storage", ["s3", "local"])
def test_a_job_from_an_uploaded_model_and_dataset_succeeds_and_stays_its_teams(
        storage, request, processes, tiny_spec, pool, wait_for, finished, wait_worker_ready, members,
        tiny_model_dir, tmp_path):
    if storage == "s3":  # all the API and the workers share is the bucket
        s3 = request.getfixturevalue("s3_server")
        env = {"GRPO_STORAGE_URL": s3.url(f"u-{uuid.uuid4().hex[:8]}"), **s3.env}
        workers = [{"GRPO_ARTIFACTS_ROOT": str(tmp_path / f"worker-{n}-artifacts")} for n in (1, 2)]
        url = processes.api(TOKEN, GRPO_ARTIFACTS_ROOT=str(tmp_path / "api-artifacts"), **env)
    else:  # the default: the store is the artifacts folder the API and the worker share
        env, workers = {}, [{}]
        url = processes.api(TOKEN)
    caches = [tmp_path / f"cache-{n}" for n in range(len(workers))]
    processes.scheduler(**env)
    for cache, own in zip(caches, workers, strict=True):
        processes.worker(pool, GRPO_WORKER_CACHE_DIR=str(cache), **own, **env)
    wait_worker_ready(pool, processes, count=len(workers))

    archive = packed(tiny_model_dir, "tiny-model")
    with client(url, members["alpha"]) as alpha, client(url, members["beta"]) as beta:
        dataset_id = uploaded(alpha, "rows.jsonl", JSONL, "dataset")
        model_id = uploaded(alpha, "tiny.tar.gz", archive, "model")
        spec = tiny_spec("uploaded", pool=pool, max_steps=2, model={"source": f"file:{model_id}"},
                         dataset={"source": f"file:{dataset_id}"})

        for file_id in (dataset_id, model_id):  # another team's files are out of sight and of reach
            assert beta.get(f"/v1/files/{file_id}").status_code == 404
        refused = beta.post("/v1/jobs", json=spec)
        assert refused.status_code == 422, refused.text
        assert beta.get("/v1/files").json()["items"] == []

        submitted = alpha.post("/v1/jobs", json=spec)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        done = wait_for(lambda: finished(job_id), 300, "the job to end", processes)
        assert done.status == "succeeded", done.error

        model = alpha.get(f"/v1/jobs/{job_id}/model")
        assert model.status_code == 200, model.text
        with tarfile.open(fileobj=io.BytesIO(model.content)) as tar:
            names = {member.name.split("/", 1)[-1] for member in tar.getmembers()}
        assert {"config.json", "model.safetensors"} <= names
        assert beta.get(f"/v1/jobs/{job_id}/model").status_code == 404

    # The model came through a worker's cache, keyed by the archive's SHA-256; exactly one worker
    # (the one that ran the job) fetched it, and the job's end released its links.
    entry = hashlib.sha256(archive).hexdigest()
    fetched = [cache for cache in caches if (cache / entry / "model" / "tiny-model" / "config.json").exists()]
    assert len(fetched) == 1
    assert not any((fetched[0] / ".links").glob("*/*"))


def test_a_job_on_an_upload_takes_the_prompt_field_the_upload_remembered(
        processes, tiny_spec, pool, wait_for, finished, wait_worker_ready, members, tmp_path) -> None:
    """Uploaded with ``prompt_field=question`` and named by a spec that sets none: the worker
    reads ``question`` as the prompt (the spec's default, ``prompt``, is no column of the file)
    and the ``answer`` column reaches the reward."""
    url = processes.api(TOKEN)
    processes.scheduler()
    processes.worker(pool, GRPO_WORKER_CACHE_DIR=str(tmp_path / "cache"))
    wait_worker_ready(pool, processes)
    rows = [{"question": row["prompt"], "answer": "yes"} for row in ROWS]
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    with client(url, members["alpha"]) as alpha:
        response = alpha.post("/v1/files", data={"purpose": "dataset", "prompt_field": "question"},
                              files={"file": ("questions.jsonl", content)})
        assert response.status_code == 201, response.text
        source = {"source": f"file:{response.json()['id']}"}
        spec = tiny_spec("remembered", pool=pool, max_steps=2, dataset=source, eval_dataset=source,
                         grpo={"eval_strategy": "steps", "eval_steps": 2},
                         rewards=[{"name": "exact_match", "args": {"field": "answer"}}])
        submitted = alpha.post("/v1/jobs", json=spec)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        done = wait_for(lambda: finished(job_id), 300, "the job to end", processes)
        assert done.status == "succeeded", done.error
        assert done.last_step == 2
        stored = alpha.get(f"/v1/jobs/{job_id}").json()["spec"]
        assert stored["dataset"]["prompt_field"] == stored["eval_dataset"]["prompt_field"] == "question"
        samples = alpha.get(f"/v1/jobs/{job_id}/samples").json()["items"]
        rows = [row for sample in samples for row in sample["rows"]]
        assert rows and {row["prompt"] for row in rows} <= {row["prompt"] for row in ROWS}
        assert all(row["rewards"]["exact_match"] in (0.0, 1.0) for row in rows)  # answer was scored
        metrics = alpha.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
        assert any("eval_reward" in item["values"] for item in metrics), metrics  # the eval file's rows
