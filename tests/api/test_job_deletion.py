"""``DELETE /v1/jobs/{id}`` over real HTTP (Postgres and SQLite), the worker's part played by its
own store code (``worker`` fixture): only a finished job, not one another job continues from;
its rows go and a tombstone stays (its GPU time and webhook deliveries kept), its artifacts leave
storage after the commit, every read of it is a 404 after, and the team's artifact bytes in
``GET /v1/me`` drop. A store that fails after the commit leaves files, never a row pointing at
them, and a second DELETE finishes the job."""

from __future__ import annotations

from sqlalchemy import func, select

from api.artifacts.paths import checkpoint_dir, job_dir, model_dir, tensorboard_dir
from api.storage import StorageUnavailable
from api.storage.local import LocalStore
from api.store.db import session_scope
from api.store.tables import Allocation, Checkpoint, Job, JobEvent, JobMetric, JobSample, JobTag


def submitted(client, spec) -> int:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def conflict(response) -> str:
    assert response.status_code == 409, response.text
    return response.json()["error"]["message"]


def write_artifacts(settings, job_id: int) -> None:
    """What a worker leaves: a kept checkpoint (and its row), a final model, TensorBoard files."""
    step_1 = checkpoint_dir(settings, job_id) / "step-1"
    for folder, names in ((step_1, ("config.json", "trainer_state.json")),
                          (model_dir(settings, job_id), ("config.json", "model.safetensors")),
                          (tensorboard_dir(settings, job_id), ("events.out.tfevents.1.host",))):
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_text("x" * 1000)
    with session_scope(settings.database_url) as session:
        session.add(Checkpoint(job_id=job_id, step=1, path=str(step_1)))


def rows_of(database_url: str, job_id: int) -> dict[str, int]:
    with session_scope(database_url) as session:
        return {table.__tablename__: session.scalar(select(func.count()).select_from(table)
                                                    .where(table.job_id == job_id))
                for table in (JobEvent, JobMetric, JobSample, Checkpoint, JobTag, Allocation)}


def artifact_bytes(client) -> int:
    me = client.get("/v1/me")
    assert me.status_code == 200, me.text
    return me.json()["artifact_bytes"]


def test_a_finished_job_is_deleted_with_its_rows_and_artifacts(alpha, beta, job_spec, api_server,
                                                               worker) -> None:
    settings = api_server.settings
    job_id = submitted(alpha, job_spec(name="to-delete", tags=["gone"], description="secret notes"))
    assert conflict(alpha.delete(f"/v1/jobs/{job_id}")) == (
        f"job {job_id} is queued: only a succeeded, failed or cancelled job can be deleted (cancel it first)")
    worker.start(job_id)
    worker.step(job_id, 1)
    worker.samples(job_id, 1, [{"prompt": "p", "completion": "c", "reward": 1.0}])
    write_artifacts(settings, job_id)
    assert f"job {job_id} is running" in conflict(alpha.delete(f"/v1/jobs/{job_id}"))
    worker.finish(job_id)
    assert "delete" in alpha.get(f"/v1/jobs/{job_id}").json()["actions"]
    before = artifact_bytes(alpha)
    assert before >= 5_000  # the five files above

    # A job that may still load its model holds it.
    follower = submitted(alpha, job_spec(model={"source": f"job:{job_id}@1"}))
    assert conflict(alpha.delete(f"/v1/jobs/{job_id}")) == (
        f"job {follower} (queued) continues from job {job_id}'s model (model.source job:{job_id}); "
        "cancel it or let it finish first")
    assert alpha.post(f"/v1/jobs/{follower}/cancel").status_code == 200
    assert beta.delete(f"/v1/jobs/{job_id}").status_code == 404  # another team's job

    deleted = alpha.delete(f"/v1/jobs/{job_id}")
    assert deleted.status_code == 204, deleted.text
    assert not job_dir(settings, job_id).exists()
    assert artifact_bytes(alpha) == before - 5_000
    # The team's data is gone; its GPU time stays in its usage.
    assert rows_of(settings.database_url, job_id) == {"job_events": 0, "job_metrics": 0, "job_samples": 0,
                                                      "checkpoints": 0, "job_tags": 0, "allocations": 1}
    with session_scope(settings.database_url) as session:
        tombstone = session.get(Job, job_id)
        assert tombstone.deleted_at is not None
        assert (tombstone.spec, tombstone.description, tombstone.tags) == ({}, None, None)

    for path in ("", "/events", "/metrics", "/samples", "/checkpoints", "/model"):
        assert alpha.get(f"/v1/jobs/{job_id}{path}").status_code == 404, path
    assert alpha.post(f"/v1/jobs/{job_id}/retry").status_code == 404
    assert alpha.post(f"/v1/jobs/{job_id}/clone").status_code == 404
    listed = [job["id"] for job in alpha.get("/v1/jobs", params={"limit": 100}).json()["items"]]
    assert job_id not in listed and follower in listed
    assert job_id not in [job["id"] for job in alpha.get("/v1/jobs", params={"tag": "gone"}).json()["items"]]
    source = alpha.post("/v1/jobs", json=job_spec(model={"source": f"job:{job_id}"}))
    assert source.status_code == 422 and f"your team has no job {job_id}" in source.text
    assert alpha.delete(f"/v1/jobs/{job_id}").status_code == 404  # a second DELETE
    assert alpha.delete(f"/v1/jobs/{follower}").status_code == 204  # cancelled: finished too


def test_artifacts_the_store_could_not_remove_stay_counted_until_a_second_delete(
        alpha, job_spec, api_server, worker, monkeypatch) -> None:
    settings = api_server.settings
    job_id = submitted(alpha, job_spec())
    worker.start(job_id)
    write_artifacts(settings, job_id)
    worker.finish(job_id, "failed")
    before = artifact_bytes(alpha)

    def store_down(self, prefix: str) -> int:
        raise StorageUnavailable(f"local storage, '{prefix}': disk I/O error")

    with monkeypatch.context() as patched:
        patched.setattr(LocalStore, "delete_prefix", store_down)
        failed = alpha.delete(f"/v1/jobs/{job_id}")
    assert failed.status_code == 503, failed.text
    assert "DELETE of it succeeds" in failed.json()["error"]["message"]
    # Deleted in SQL (no row points at the files), the files left, and counted.
    assert alpha.get(f"/v1/jobs/{job_id}").status_code == 404
    assert rows_of(settings.database_url, job_id)["checkpoints"] == 0
    assert job_dir(settings, job_id).is_dir() and artifact_bytes(alpha) == before

    assert alpha.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert not job_dir(settings, job_id).exists() and artifact_bytes(alpha) == before - 5_000
    assert alpha.delete(f"/v1/jobs/{job_id}").status_code == 404
