"""Jobs through the real stack (``grpo api``, the scheduler and a Celery worker, each its own
process) with ``GRPO_STORAGE_URL`` at an S3 server process (moto's server mode,
tests/storage_server.py), the API and the worker each given an artifacts folder of its own, so
they share no folder: the job succeeds, its checkpoints are whole in the bucket, and its final
model, a checkpoint and its TensorBoard files download through the API from the bucket. Then the
S3 server killed while the job trains and checkpoints, and started again: the job keeps training,
retries, finishes in its first attempt, and every checkpoint SQL records is whole in the bucket."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

import httpx
import pytest

from api.artifact_paths import MODEL_MARK, checkpoint_key, model_key, stored_checkpoint_steps
from api.storage import open_store
from api.store.db import session_scope
from api.store.telemetry import list_events
from worker.checkpoint_uploads import UPLOAD_RETRY_EVENT

pytestmark = pytest.mark.slow

TOKEN = "object-store-operator-token-8d41e7a2"


def members(body: bytes) -> dict[str, bytes]:
    """The files of a downloaded tar, by their name under its top folder."""
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.fixture
def bucket_env(s3_server) -> dict[str, str]:
    """A prefix of the session's bucket for this test, as every process of the stack reads it."""
    return {"GRPO_STORAGE_URL": s3_server.url(f"t-{uuid.uuid4().hex[:8]}"), **s3_server.env}


def start_stack(processes, pool: str, wait_worker_ready, env: dict[str, str], tmp_path: Path) -> httpx.Client:
    """API and worker with artifacts folders of their own: all they share is the bucket."""
    url = processes.api(TOKEN, GRPO_ARTIFACTS_ROOT=str(tmp_path / "api-artifacts"), **env)
    processes.scheduler(**env)
    processes.worker(pool, GRPO_ARTIFACTS_ROOT=str(tmp_path / "worker-artifacts"), **env)
    wait_worker_ready(pool, processes)
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30,
                        trust_env=False)


def recorded_steps(api: httpx.Client, job_id: int) -> list[int]:
    return sorted(c["step"] for c in api.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"])


def test_a_job_stores_its_artifacts_in_the_bucket_and_the_api_serves_them_from_there(
        processes, submit, tiny_spec, pool, wait_for, finished, wait_worker_ready, bucket_env, tmp_path):
    store = open_store(bucket_env["GRPO_STORAGE_URL"], env=bucket_env)
    job_id = submit(tiny_spec("stored", pool=pool, max_steps=4, checkpoint_every=2, checkpoint_keep_last=2,
                              report_to=["tensorboard"]))
    with start_stack(processes, pool, wait_worker_ready, bucket_env, tmp_path) as api:
        done = wait_for(lambda: finished(job_id), 180, "the job to end", processes)
        assert done.status == "succeeded", done.error

        assert stored_checkpoint_steps(store, job_id) == recorded_steps(api, job_id) == [2, 4]
        assert not (tmp_path / "api-artifacts" / "jobs").exists()  # nothing came through a folder
        model = api.get(f"/v1/jobs/{job_id}/model")
        assert model.status_code == 200 and int(model.headers["content-length"]) == len(model.content)
        files = members(model.content)
        with store.open_read(f"{model_key(job_id)}/model.safetensors") as stream:
            assert files["model.safetensors"] == b"".join(stream)
        assert MODEL_MARK in files and "config.json" in files
        part = api.get(f"/v1/jobs/{job_id}/model", headers={"Range": "bytes=700-1799"})
        assert part.status_code == 206 and part.content == model.content[700:1800]

        checkpoint = members(api.get(f"/v1/jobs/{job_id}/checkpoints/2/archive").content)
        with store.open_read(f"{checkpoint_key(job_id, 2)}/model.safetensors") as stream:
            assert checkpoint["model.safetensors"] == b"".join(stream)
        assert "optimizer.pt" not in checkpoint and "generation_config.json" in checkpoint
        assert api.get(f"/v1/jobs/{job_id}/checkpoints/3/archive").status_code == 404
        charts = members(api.get(f"/v1/jobs/{job_id}/tensorboard").content)
        assert any(name.startswith("events.out.tfevents") for name in charts)


def test_the_store_killed_during_checkpoint_uploads_then_back_the_job_finishes_with_whole_checkpoints(
        processes, submit, tiny_spec, pool, wait_for, finished, wait_worker_ready, bucket_env, tmp_path,
        s3_server, database_url, job_of):
    store = open_store(bucket_env["GRPO_STORAGE_URL"], env=bucket_env)
    job_id = submit(tiny_spec("outage", pool=pool, max_steps=6, checkpoint_every=2, checkpoint_keep_last=1))

    def events(kind: str) -> list:
        with session_scope(database_url) as session:
            return [e for e in list_events(session, job_id, limit=500) if e.type == kind]

    with start_stack(processes, pool, wait_worker_ready, bucket_env, tmp_path) as api:
        wait_for(lambda: events("started"), 120, "the job to start training", processes)
        s3_server.kill()  # moto keeps objects in memory: what was stored is gone with it
        [retry] = wait_for(lambda: events(UPLOAD_RETRY_EVENT), 120, "a checkpoint upload to fail", processes)
        assert retry.level == "warning"
        s3_server.restart()
        done = wait_for(lambda: finished(job_id), 300, "the job to end", processes)
        assert done.status == "succeeded", done.error
        assert job_of(job_id).attempt == 1  # trained on through the outage: never requeued

        recorded = recorded_steps(api, job_id)
        assert recorded == stored_checkpoint_steps(store, job_id) == [6]
        names = {info.key.rsplit("/", 1)[1] for info in store.list(checkpoint_key(job_id, 6))}
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "rng.pt"} <= names
        assert api.get(f"/v1/jobs/{job_id}/model").status_code == 200
