"""A worker's artifacts through a store apart from its artifacts folder, piece by piece (the whole
stack against a real S3 server is tests/worker/test_object_store_jobs.py): a checkpoint's row only
once the store holds it whole, its upload retried after later steps while the store is down and
superseded by a newer one, retention kept back until the newer one is stored, older checkpoints'
optimizer state dropped as the trainer's retention drops it locally, and a resume that
takes exactly the store's newest whole checkpoint.

The store is a real local one in a folder of its own; :class:`Outage` makes it refuse as an
unreachable server does (StorageUnavailable), which is what the code under test reacts to."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from api.artifacts.paths import checkpoint_dir, checkpoint_key, remote_store
from api.settings import Settings
from api.storage import StorageUnavailable
from api.storage.local import LocalStore
from grpo_core.run.callbacks import TrainerCallback
from tests.stored_artifacts import stored_checkpoints, stored_steps
from worker.checkpoint_uploads import UPLOAD_RETRY_EVENT, StoredCheckpoints
from worker.job_storage import fetch_resume_checkpoint, retry_storage


class Outage(LocalStore):
    """A local store that can be taken down: every call refuses while ``down``."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise StorageUnavailable("connection refused (the test took the store down)")

    def _put_files(self, pairs: list[tuple[str, Path]]) -> None:
        for key, path in pairs:
            self._check()
            self.put_file(key, path)

    def list(self, prefix: str = ""):
        self._check()
        return super().list(prefix)

    def delete(self, key: str) -> None:
        self._check()
        super().delete(key)

    def get_file(self, key: str, path: Path):
        self._check()
        return super().get_file(key, path)


class Recorder(TrainerCallback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.calls.append(("checkpoint", step))

    def on_checkpoints_removed(self, steps: list[int]) -> None:
        self.calls.append(("removed", steps))

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        self.calls.append((type, data["step"]))

    def on_step(self, record: dict[str, Any]) -> None:
        self.calls.append(("step", record["step"]))


def write_checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    folder = root / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * (1000 + step))
    (folder / "optimizer.pt").write_bytes(b"o" * step)
    if complete:
        (folder / "trainer_state.json").write_text(f'{{"step": {step}}}')
    return folder


def stored_names(store, step: int) -> list[str]:
    return sorted(info.key.rsplit("/", 1)[1] for info in store.list(checkpoint_key(7, step, ATTEMPT)))


ATTEMPT = 3  # the attempt storing, in the tests of StoredCheckpoints


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts(tmp_path: Path):
    store, reporter, clock = Outage(tmp_path / "bucket"), Recorder(), Clock()
    uploads = StoredCheckpoints(reporter, store, 7, ATTEMPT, budget_seconds=0, clock=clock)
    return store, reporter, clock, uploads


def test_a_checkpoint_is_recorded_once_stored_whole(parts, tmp_path: Path) -> None:
    store, reporter, _, uploads = parts
    uploads.on_checkpoint(2, write_checkpoint(tmp_path / "local", 2))
    assert reporter.calls == [("checkpoint", 2)]
    assert stored_steps(store, 7) == [2]
    assert stored_names(store, 2) == ["model.safetensors", "optimizer.pt", "trainer_state.json"]


def test_a_store_down_at_a_checkpoint_retries_after_later_steps_and_records_only_then(parts, tmp_path):
    store, reporter, clock, uploads = parts
    store.down = True
    uploads.on_checkpoint(2, write_checkpoint(tmp_path / "local", 2))
    assert reporter.calls == [(UPLOAD_RETRY_EVENT, 2)]  # training goes on; no row
    clock.now = 0.1
    uploads.on_step({"step": 3})  # before its backoff: not tried
    store.down = False
    uploads.on_step({"step": 3})
    assert reporter.calls[-1] == ("step", 3) and ("checkpoint", 2) not in reporter.calls
    clock.now = 5.0
    uploads.on_step({"step": 4})
    assert reporter.calls[-2:] == [("step", 4), ("checkpoint", 2)]
    assert stored_steps(store, 7) == [2]


def test_a_newer_checkpoint_replaces_one_waiting_and_its_partial_objects_go(parts, tmp_path: Path) -> None:
    store, reporter, clock, uploads = parts
    local = tmp_path / "local"
    weights = write_checkpoint(local, 2) / "model.safetensors"
    store.put_file(f"{checkpoint_key(7, 2, ATTEMPT)}/model.safetensors", weights)
    store.down = True  # the upload of step 2 broke off after its first file
    uploads.on_checkpoint(2, local / "step-2")
    uploads.on_checkpoint(4, write_checkpoint(local, 4))
    store.down, clock.now = False, 100.0
    uploads.on_step({"step": 5})
    assert [c for c in reporter.calls if c[0] == "checkpoint"] == [("checkpoint", 4)]
    assert {info.key.split("/")[3] for info in store.list("jobs/7")} == {f"step-4.attempt-{ATTEMPT}"}
    assert ("removed", [2]) in reporter.calls  # never recorded; nothing stays behind


def test_retention_waits_until_the_newer_checkpoint_is_stored(parts, tmp_path: Path) -> None:
    store, reporter, clock, uploads = parts
    local = tmp_path / "local"
    uploads.on_checkpoint(2, write_checkpoint(local, 2))
    store.down = True
    uploads.on_checkpoint(4, write_checkpoint(local, 4))
    shutil.rmtree(local / "step-2")  # the trainer's retention, keep_last 1
    uploads.on_checkpoints_removed([2])
    store.down = False
    assert stored_steps(store, 7) == [2]  # still what a resume would take
    assert ("removed", [2]) not in reporter.calls
    clock.now = 100.0
    uploads.on_step({"step": 5})
    assert stored_steps(store, 7) == [4]
    assert reporter.calls[-2:] == [("checkpoint", 4), ("removed", [2])]


def test_an_older_stored_checkpoint_loses_its_optimizer_state_as_locally(parts, tmp_path: Path) -> None:
    """grpo_core's retention keeps optimizer.pt only in the newest checkpoint; so does the store,
    once a newer one is whole there (a store away then: asked again after the next upload)."""
    store, _, clock, uploads = parts
    local = tmp_path / "local"
    uploads.on_checkpoint(2, write_checkpoint(local, 2))
    uploads.on_checkpoint(4, write_checkpoint(local, 4))
    assert stored_names(store, 2) == ["model.safetensors", "trainer_state.json"]
    assert stored_names(store, 4) == ["model.safetensors", "optimizer.pt", "trainer_state.json"]

    original_delete = Outage.delete

    def optimizer_delete_fails(self, key: str) -> None:
        if key.endswith("/optimizer.pt") and not clock.now:
            raise StorageUnavailable("connection refused (the test)")
        original_delete(self, key)

    store.delete = optimizer_delete_fails.__get__(store)
    uploads.on_checkpoint(6, write_checkpoint(local, 6))
    assert "optimizer.pt" in stored_names(store, 4)  # kept for now, its deletion owed
    clock.now = 1.0
    uploads.on_checkpoint(8, write_checkpoint(local, 8))
    assert [stored_names(store, step) for step in (4, 6, 8)] == [
        ["model.safetensors", "trainer_state.json"], ["model.safetensors", "trainer_state.json"],
        ["model.safetensors", "optimizer.pt", "trainer_state.json"]]
    assert stored_steps(store, 7) == [2, 4, 6, 8]  # each still whole


def test_a_store_down_at_the_end_raises_storage_unavailable(parts, tmp_path: Path) -> None:
    store, reporter, _, uploads = parts
    store.down = True
    uploads.on_checkpoint(3, write_checkpoint(tmp_path / "local", 3))
    with pytest.raises(StorageUnavailable, match="unreachable for 0 s"):
        uploads.flush()
    store.down = False
    uploads.flush()
    assert reporter.calls[-1] == ("checkpoint", 3)


def test_retry_storage_backs_off_then_succeeds_or_gives_up() -> None:
    outcomes: list[Any] = [StorageUnavailable("down"), StorageUnavailable("down"), "stored"]
    slept: list[float] = []

    def attempt() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert retry_storage(attempt, 60, "a test", sleep=slept.append) == "stored"
    assert len(slept) == 2 and 0.25 <= slept[0] <= 0.5 and 0.5 <= slept[1] <= 1.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(artifacts_root=tmp_path / "worker", storage_url=str(tmp_path / "bucket"),
                    storage_retry_seconds=0)


def test_the_default_store_is_the_artifacts_folder_and_nothing_is_copied(tmp_path: Path) -> None:
    assert remote_store(Settings(artifacts_root=tmp_path)) is None
    assert remote_store(Settings(artifacts_root=tmp_path, storage_url=f"file://{tmp_path}")) is None
    assert remote_store(Settings(artifacts_root=tmp_path, storage_url=str(tmp_path / "other"))) is not None


def test_a_resume_takes_the_newest_published_checkpoint_by_its_key_and_drops_local_ones(settings,
                                                                                       tmp_path) -> None:
    store = LocalStore(tmp_path / "bucket")
    elsewhere = tmp_path / "other-worker"
    store.put_folder(checkpoint_key(7, 2, None), write_checkpoint(elsewhere / "old", 2))  # before attempts
    store.put_folder(checkpoint_key(7, 4, 2), write_checkpoint(elsewhere / "a2", 4))
    stale = write_checkpoint(elsewhere / "a1", 4)
    (stale / "model.safetensors").write_bytes(b"stale")
    store.put_folder(checkpoint_key(7, 4, 1), stale)  # a stale attempt's, beside the owner's: no row
    store.put_folder(checkpoint_key(7, 6, 1), write_checkpoint(elsewhere / "a1", 6))  # no row either
    local = checkpoint_dir(settings, 7)
    write_checkpoint(local, 8)  # trained here, its upload never finished: no row names it
    write_checkpoint(local, 2)

    path = fetch_resume_checkpoint(store, settings, 7, {2: None, 4: 2})
    assert path == local / "step-4" and sorted(p.name for p in local.iterdir()) == ["step-4"]
    assert (path / "model.safetensors").read_bytes() == b"w" * 1004  # the owner's, not the stale one
    assert fetch_resume_checkpoint(store, settings, 8, {}) is None
    # A row written before attempts were recorded names the plain key.
    assert fetch_resume_checkpoint(store, settings, 7, {2: None}) == local / "step-2"
    assert (local / "step-2" / "model.safetensors").read_bytes() == b"w" * 1002


def test_a_resume_also_keeps_the_best_checkpoint(settings, tmp_path) -> None:
    """grpo.metric_for_best_model: the job's best eval point's checkpoint is fetched beside the
    newest (its final model may be that one's); a best step with no row is not."""
    store = LocalStore(tmp_path / "bucket")
    elsewhere = tmp_path / "other-worker"
    store.put_folder(checkpoint_key(7, 2, 1), write_checkpoint(elsewhere / "a1", 2))
    store.put_folder(checkpoint_key(7, 6, 2), write_checkpoint(elsewhere / "a2", 6))
    local = checkpoint_dir(settings, 7)
    assert fetch_resume_checkpoint(store, settings, 7, {2: 1, 6: 2}, best_step=2) == local / "step-6"
    assert sorted(p.name for p in local.iterdir()) == ["step-2", "step-6"]
    assert (local / "step-2" / "model.safetensors").read_bytes() == b"w" * 1002
    assert fetch_resume_checkpoint(store, settings, 7, {6: 2}, best_step=2) == local / "step-6"
    assert sorted(p.name for p in local.iterdir()) == ["step-6"]


def test_retention_deletes_an_earlier_attempts_checkpoint_under_its_key(tmp_path: Path) -> None:
    store, reporter = LocalStore(tmp_path / "bucket"), Recorder()
    # attempt 1's, which attempt 2 resumed from
    store.put_folder(checkpoint_key(7, 2, 1), write_checkpoint(tmp_path / "a1", 2))
    uploads = StoredCheckpoints(reporter, store, 7, 2, budget_seconds=0, published={2: 1})
    uploads.on_checkpoint(4, write_checkpoint(tmp_path / "a2", 4))
    uploads.on_checkpoints_removed([2])
    assert stored_checkpoints(store, 7) == {4: [2]}
    assert reporter.calls == [("checkpoint", 4), ("removed", [2])]


def test_a_store_down_at_resume_raises_storage_unavailable(settings, tmp_path: Path) -> None:
    store = Outage(tmp_path / "bucket")
    store.down = True
    with pytest.raises(StorageUnavailable):
        fetch_resume_checkpoint(store, settings, 7, {2: 1})
