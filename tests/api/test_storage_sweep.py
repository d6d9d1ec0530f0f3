"""The scheduler process's storage sweep (``api.scheduling.storage_sweeper``) on the local folder
store and an S3 bucket (moto's server process), against the module's database: it removes what
no live row names (a deleted job's prefix, a job folder with no row, a deleted file's object, an
``error`` upload's object, an object with no row), keeps everything a live row holds, removes at
most its batch a pass, and a pass that fails is retried by the next."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from waiting import wait_until

from api.scheduling.storage_sweeper import StorageSweeper
from api.storage import ObjectStore, StorageUnavailable, open_store
from api.storage.keys import file_key
from api.store import files
from api.store.db import session_scope


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    server = request.getfixturevalue("s3_server")
    return open_store(server.url(f"sweep-{uuid.uuid4().hex}"), env=server.env)


def put(store: ObjectStore, *keys: str) -> None:
    for key in keys:
        store.put_stream(key, [key.encode()])


def file_row(database_url: str, team_id: int, status: str) -> str:
    file_id = files.new_file_id()
    with session_scope(database_url) as session:
        files.add_file(session, file_id, team_id, "dataset", "rows.jsonl", "jsonl", 10, "0" * 64)
        if status != "uploading":
            files.set_status(session, file_id, status)
    return file_id


def test_the_sweep_removes_what_no_live_row_names_a_batch_a_pass(
        store, api_server, alpha, team_keys, job_spec, worker) -> None:
    database_url = api_server.settings.database_url
    live = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    deleted = alpha.post("/v1/jobs", json=job_spec()).json()["id"]
    worker.start(deleted)
    worker.finish(deleted)
    assert alpha.delete(f"/v1/jobs/{deleted}").status_code == 204
    ready, uploading, failed, removed = (file_row(database_url, team_keys.alpha_id, status)
                                         for status in ("ready", "uploading", "error", "ready"))
    assert alpha.delete(f"/v1/files/{removed}").status_code == 200
    put(store, f"jobs/{live}/checkpoints/step-1/trainer_state.json", f"jobs/{live}/model/config.json",
        "jobs/notes/readme",  # not a job's folder: not the sweep's to judge
        *(file_key(file_id) for file_id in (ready, uploading)))
    leftovers = [f"jobs/{deleted}/model/model.safetensors", f"jobs/{deleted}/tensorboard/events",
                 "jobs/999999/model/config.json", file_key(failed), file_key(removed),
                 file_key("file-" + "0" * 24)]
    put(store, *leftovers)
    kept = sorted(info.key for info in store.list() if info.key not in leftovers)

    sweeper = StorageSweeper(api_server.settings, store, batch=2)
    assert sweeper.sweep() == 2  # the two job prefixes first, each whole
    assert not list(store.list(f"jobs/{deleted}")) and not list(store.list("jobs/999999"))
    assert store.exists(file_key(failed)) and store.exists(file_key(removed))
    assert [sweeper.sweep(), sweeper.sweep(), sweeper.sweep()] == [2, 1, 0]
    assert sorted(info.key for info in store.list()) == kept
    assert sorted(store.folders("jobs")) == sorted([str(live), "notes"])


def test_a_failed_pass_is_retried_by_the_next(store, api_server, monkeypatch) -> None:
    settings = api_server.settings.model_copy(update={"storage_sweep_seconds": 0.05})
    sweeper = StorageSweeper(settings, store)
    put(store, "jobs/888888/model/config.json")
    calls = []
    listing = type(store).folders

    def away_once(self, prefix=""):
        calls.append(prefix)
        if len(calls) == 1:
            raise StorageUnavailable("the store is away (test)")
        return listing(self, prefix)

    monkeypatch.setattr(type(store), "folders", away_once)
    stop = threading.Event()
    thread = threading.Thread(target=sweeper.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: not list(store.list("jobs/888888")), 10, "the second pass to sweep")
    finally:
        stop.set()
        thread.join(5)
    assert len(calls) >= 2 and not thread.is_alive()
