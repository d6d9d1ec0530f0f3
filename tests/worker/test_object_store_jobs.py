"""Jobs through the real stack (``grpo api``, the scheduler and a Celery worker, each its own
process) with ``GRPO_STORAGE_URL`` at an S3 server process (moto's server mode,
tests/storage_server.py), the API and the worker each given an artifacts folder of its own, so
they share no folder: the job succeeds, its checkpoints are whole in the bucket, and its final
model, a checkpoint and its TensorBoard files download through the API from the bucket. Then the
S3 server killed while the job trains and checkpoints, and started again: the job keeps training,
retries, finishes in its first attempt, and every checkpoint SQL records is whole in the bucket.
Then the store away when a paused job is resumed (issue 26): that attempt is requeued as the
infrastructure's fault, and once the store is back the job resumes from its stored checkpoint.
Last, several jobs in a row leave the worker's artifacts folder holding none of their files (issue 33):
once stored, its copies go at each attempt's end, so a long-lived worker's disk does not grow."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from api.artifacts.paths import MODEL_MARK, checkpoint_key, model_key
from api.storage import open_store
from api.store.db import session_scope
from api.store.tables import JobMetric
from api.store.telemetry import list_events
from tests.stored_artifacts import stored_checkpoints, stored_steps
from worker.checkpoint_uploads import UPLOAD_RETRY_EVENT
from worker.job_storage import STORAGE_UNAVAILABLE

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


def job_events(database_url: str, job_id: int, kind: str) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=500) if e.type == kind]


def test_a_job_stores_its_artifacts_in_the_bucket_and_the_api_serves_them_from_there(
        processes, submit, tiny_spec, pool, wait_for, finished, wait_worker_ready, bucket_env, tmp_path):
    store = open_store(bucket_env["GRPO_STORAGE_URL"], env=bucket_env)
    job_id = submit(tiny_spec("stored", pool=pool, max_steps=4, checkpoint_every=2, checkpoint_keep_last=2,
                              report_to=["tensorboard"]))
    with start_stack(processes, pool, wait_worker_ready, bucket_env, tmp_path) as api:
        done = wait_for(lambda: finished(job_id), 180, "the job to end", processes)
        assert done.status == "succeeded", done.error

        assert stored_checkpoints(store, job_id) == {2: [1], 4: [1]}  # each under its attempt's key
        assert recorded_steps(api, job_id) == [2, 4]
        assert not (tmp_path / "api-artifacts" / "jobs").exists()  # nothing came through a folder
        model = api.get(f"/v1/jobs/{job_id}/model")
        assert model.status_code == 200 and int(model.headers["content-length"]) == len(model.content)
        files = members(model.content)
        with store.open_read(f"{model_key(job_id, done.attempt)}/model.safetensors") as stream:
            assert files["model.safetensors"] == b"".join(stream)
        assert MODEL_MARK in files and "config.json" in files
        part = api.get(f"/v1/jobs/{job_id}/model", headers={"Range": "bytes=700-1799"})
        assert part.status_code == 206 and part.content == model.content[700:1800]

        checkpoint = members(api.get(f"/v1/jobs/{job_id}/checkpoints/2/archive").content)
        with store.open_read(f"{checkpoint_key(job_id, 2, 1)}/model.safetensors") as stream:
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
        return job_events(database_url, job_id, kind)

    with start_stack(processes, pool, wait_worker_ready, bucket_env, tmp_path) as api:
        wait_for(lambda: events("started"), 120, "the job to start training", processes)
        s3_server.kill()  # moto keeps objects in memory: what was stored is gone with it
        try:
            # One event per checkpoint that could not be stored: on a loaded machine a second
            # checkpoint may fail before this poll sees the first.
            retries = wait_for(lambda: events(UPLOAD_RETRY_EVENT), 120, "a checkpoint upload to fail",
                               processes)
        finally:
            s3_server.restart()  # the session's server: the tests after this one need it back
        assert [retry.level for retry in retries] == ["warning"] * len(retries)
        done = wait_for(lambda: finished(job_id), 300, "the job to end", processes)
        assert done.status == "succeeded", done.error
        assert job_of(job_id).attempt == 1  # trained on through the outage: never requeued

        recorded = recorded_steps(api, job_id)
        assert recorded == stored_steps(store, job_id) == [6]
        names = {info.key.rsplit("/", 1)[1] for info in store.list(checkpoint_key(job_id, 6, 1))}
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "rng.pt"} <= names
        assert api.get(f"/v1/jobs/{job_id}/model").status_code == 200


def test_the_store_away_when_a_paused_job_resumes_requeues_it_and_it_resumes_from_the_stored_checkpoint(
        processes, submit, tiny_spec, pool, wait_for, finished, wait_worker_ready, bucket_env, tmp_path,
        s3_server, database_url, job_of):
    store = open_store(bucket_env["GRPO_STORAGE_URL"], env=bucket_env)
    steps = 10
    job_id = submit(tiny_spec("resume-outage", pool=pool, max_steps=steps, checkpoint_every=2))
    # The resumed attempt retries the store for a second, then ends; requeued, the job waits 10 s
    # (5 s, doubled after its second attempt) before its next dispatch, by when the store is back
    # even on a loaded machine: one requeue, three attempts in all, GRPO_MAX_ATTEMPTS' 3 not used up.
    env = {**bucket_env, "GRPO_STORAGE_RETRY_SECONDS": "1", "GRPO_REQUEUE_BACKOFF_SECONDS": "5",
           "GRPO_MAX_ATTEMPTS": "3"}
    with start_stack(processes, pool, wait_worker_ready, env, tmp_path) as api:
        wait_for(lambda: recorded_steps(api, job_id), 180, "a checkpoint to be stored", processes)
        assert api.post(f"/v1/jobs/{job_id}/pause").json()["status"] == "pausing"
        paused = wait_for(lambda: (job := job_of(job_id)).status == "paused" and job, 60, "the pause",
                          processes)
        paused_at = paused.last_step
        assert 2 <= paused_at < steps
        assert stored_steps(store, job_id)[-1] == paused_at
        # As on any host: the paused attempt left no local copy, only the store holds it (issue 33).
        assert not (tmp_path / "worker-artifacts" / checkpoint_key(job_id, paused_at, 1)).parent.exists()

        s3_server.stop_listening()  # unlike a kill, what it stored is there when it listens again
        try:
            assert api.post(f"/v1/jobs/{job_id}/resume").json()["status"] == "queued"
            ended = wait_for(lambda: job_events(database_url, job_id, "requeued") or finished(job_id), 120,
                             "the resumed attempt to end", processes)
        finally:
            s3_server.listen_again()
        assert isinstance(ended, list), f"the outage ended the job {ended.status}: {ended.error}"
        [requeued] = ended
        assert requeued.data["error_code"] == STORAGE_UNAVAILABLE, requeued

        done = wait_for(lambda: finished(job_id), 300, "the job to end", processes)
        assert done.status == "succeeded", done.error
        assert not job_events(database_url, job_id, "failed")
        assert len(job_events(database_url, job_id, "requeued")) == 1
        # The outage's attempt counts against GRPO_MAX_ATTEMPTS, as every machine fault's does.
        assert [e.data["attempt"] for e in job_events(database_url, job_id, "running")] == [1, 2, 3]
        assert done.attempt == 3

        # Every step once: up to the pause by the first attempt, after it by the third, which
        # resumed from the stored checkpoint (from the start, it would have recorded them all).
        with session_scope(database_url) as session:
            rows = session.execute(select(JobMetric.step, JobMetric.attempt)
                                   .where(JobMetric.job_id == job_id).order_by(JobMetric.step)).all()
        assert [tuple(row) for row in rows] == [
            (step, 1 if step <= paused_at else 3) for step in range(1, steps + 1)]
        assert recorded_steps(api, job_id)[-1] == stored_steps(store, job_id)[-1] == steps


def test_jobs_on_a_bucket_leave_the_workers_artifacts_folder_holding_none_of_their_files(
        processes, submit, tiny_spec, pool, wait_for, finished, wait_worker_ready, bucket_env, tmp_path):
    store = open_store(bucket_env["GRPO_STORAGE_URL"], env=bucket_env)
    job_ids = [submit(tiny_spec(f"tidy-{n}", pool=pool, max_steps=2, checkpoint_every=2,
                                report_to=["tensorboard"])) for n in range(5)]
    with start_stack(processes, pool, wait_worker_ready, bucket_env, tmp_path) as api:
        for job_id in job_ids:
            done = wait_for(lambda j=job_id: finished(j), 300, f"job {job_id} to end", processes)
            assert done.status == "succeeded", done.error
        worker_root = tmp_path / "worker-artifacts"
        assert worker_root.is_dir()  # the worker did write there while training
        left = sorted(p.relative_to(worker_root).as_posix() for folder in ("jobs", ".attempts")
                      for p in (worker_root / folder).rglob("*") if p.is_file())
        assert left == []
        for job_id in job_ids:  # all of it in the store, served from there
            assert stored_steps(store, job_id) == recorded_steps(api, job_id) == [2]
            assert store.exists(f"{model_key(job_id, 1)}/{MODEL_MARK}")  # one attempt each
            model = api.get(f"/v1/jobs/{job_id}/model")
            assert model.status_code == 200 and "model.safetensors" in members(model.content)
            assert api.get(f"/v1/jobs/{job_id}/tensorboard").status_code == 200
