"""The fence itself (:mod:`worker.fencing`) on a real Postgres, apart from the watchdog that
usually ends a stale job's process first (``tests/chaos/test_stale_attempts.py``): once a newer
attempt owns the job, the older one's rows and folders are refused, and a published folder is
never replaced, not even by its owner's next attempt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from api.artifacts.paths import checkpoint_dir, staging_dir
from api.domain.lifecycle import Transition
from api.storage import StorageUnavailable
from api.store.attempts import claim, requeue_after_fault
from api.store.db import session_scope
from api.store.jobs import transition
from api.store.tables import utcnow
from api.store.telemetry import list_checkpoints, list_metrics
from worker.fencing import AttemptFence, FencedPublisher, StaleAttempt
from worker.reporting import JobReporter


def dispatch_and_claim(database_url: str, job_id: int, worker_id: str) -> int:
    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH,
                          values={"dispatched_at": utcnow(), "worker_id": worker_id})
        return claim(session, job_id, worker_id).attempt


def written_folder(staging: Path, name: str, content: str) -> Path:
    folder = staging / name
    folder.mkdir(parents=True)
    (folder / "weights").write_text(content)
    return folder


def test_a_superseded_attempt_publishes_no_row_and_no_folder(settings, database_url, submit, tiny_spec):
    job_id = submit(tiny_spec("fenced"))
    first = dispatch_and_claim(database_url, job_id, "w1")
    old = AttemptFence(settings, job_id, "w1", first)
    old_staging, root = staging_dir(settings, job_id, first), checkpoint_dir(settings, job_id)
    reporter = JobReporter(settings.database_url, job_id, None, first, fence=old)
    FencedPublisher(old, old_staging).publish(written_folder(old_staging, "a", "first"), root / "step-1")
    reporter.on_checkpoint(1, root / "step-1")

    with session_scope(database_url) as session:  # the worker went silent: the job moves on
        assert requeue_after_fault(session, job_id, worker_id="w1", message="lost", data={}, max_attempts=5)
    second = dispatch_and_claim(database_url, job_id, "w2")
    new = AttemptFence(settings, job_id, "w2", second)
    new_staging = staging_dir(settings, job_id, second)

    late = written_folder(old_staging, "b", "stale")
    with pytest.raises(StaleAttempt):
        FencedPublisher(old, old_staging).publish(late, root / "step-2")
    for write in (lambda: reporter.on_checkpoint(2, root / "step-2"),
                  lambda: reporter.on_step({"step": 2, "reward": 1.0}),
                  lambda: reporter.on_event("checkpoint", "late", {})):
        with pytest.raises(StaleAttempt):
            write()
    assert sorted(p.name for p in root.iterdir()) == ["step-1"] and late.is_dir()
    with session_scope(database_url) as session:
        assert [c.step for c in list_checkpoints(session, job_id)] == [1]
        assert list_metrics(session, job_id) == []

    # The owner publishes; nobody, the owner included, renames over a published folder.
    FencedPublisher(new, new_staging).publish(written_folder(new_staging, "c", "owner"), root / "step-2")
    with pytest.raises(FileExistsError):
        new.publish_folder(written_folder(new_staging, "d", "again"), root / "step-2", "checkpoint")
    assert (root / "step-2" / "weights").read_text() == "owner"
    with pytest.raises(StaleAttempt):  # retention too
        FencedPublisher(old, old_staging).remove("older checkpoints", lambda: pytest.fail("removed"))


class _FreezingStore:
    """A store whose uploads take ``frozen`` seconds of the fence's clock: the process was
    stopped (a paused VM) while its upload ran."""

    def __init__(self, store, clock: list[float], frozen: float) -> None:
        self.store, self.clock, self.frozen = store, clock, frozen

    def put_folder(self, *args, **kwargs):
        self.clock[0] += self.frozen
        return self.store.put_folder(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def fence_clock(monkeypatch) -> list[float]:
    """The fence's monotonic clock, in a list the test moves (a freeze is a jump)."""
    import types

    import worker.fencing as fencing

    clock = [1000.0]
    monkeypatch.setattr(fencing, "time", types.SimpleNamespace(monotonic=lambda: clock[0],
                                                               sleep=lambda seconds: None))
    return clock


def claimed_with_store(settings, database_url, job_id: int, tmp_path: Path):
    """``job_id`` claimed by worker w1: its attempt, that attempt's fence and a local store."""
    from api.storage import open_store

    attempt = dispatch_and_claim(database_url, job_id, "w1")
    fence = AttemptFence(settings, job_id, "w1", attempt)
    return job_id, attempt, fence, open_store(str(tmp_path / "bucket"))


def test_a_checkpoint_upload_that_outlived_the_lease_is_taken_out_of_the_store(
        settings, database_url, submit, tiny_spec, tmp_path, monkeypatch):
    # The fence is checked before the upload; a process frozen during it may wake after another
    # attempt took the job over, so an upload that took longer than the lease had left is undone.
    from api.artifacts.paths import checkpoint_key
    from grpo_core.run.callbacks import TrainerCallback
    from worker.checkpoint_uploads import StoredCheckpoints

    clock = fence_clock(monkeypatch)
    job_id, attempt, fence, store = claimed_with_store(
        settings, database_url, submit(tiny_spec("frozen-upload")), tmp_path)

    def checkpoint(name: str, text: str):
        folder = written_folder(tmp_path / name, "step-2", text)
        (folder / "trainer_state.json").write_text("{}")  # the completion mark, stored last
        return folder

    # The owner (the next attempt, here) stored step 2 within its lease. The stale attempt's
    # process froze during its own upload of step 2 and woke after the lease had passed: its
    # objects are taken out of the store, and only its own (the owner's are under another key).
    owner = StoredCheckpoints(TrainerCallback(), _FreezingStore(store, clock, 0.0), job_id, attempt + 1, 5.0,
                              fenced=fence.hold)
    owner.on_checkpoint(2, checkpoint("owner", "owner"))
    stale = StoredCheckpoints(TrainerCallback(), _FreezingStore(store, clock, settings.lease_seconds * 2),
                              job_id, attempt, 5.0, fenced=fence.hold)
    with pytest.raises(StaleAttempt):
        stale.on_checkpoint(2, checkpoint("stale", "stale"))
    assert list(store.list(checkpoint_key(job_id, 2, attempt))) == []
    with store.open_read(f"{checkpoint_key(job_id, 2, attempt + 1)}/weights") as stream:
        assert b"".join(stream) == b"owner"  # whole, and never written over
    assert len(list(store.list(checkpoint_key(job_id, 2, attempt + 1)))) == 2


class _FreezingThenFailingStore(_FreezingStore):
    """Frozen during the upload, which then ends in an error after some files landed (a transfer
    the server dropped while the process was stopped)."""

    def put_folder(self, *args, **kwargs):
        super().put_folder(*args, **kwargs)
        raise StorageUnavailable("connection reset by peer")


def test_an_upload_that_outlived_the_lease_and_then_failed_is_taken_out_of_the_store(
        settings, database_url, submit, tiny_spec, tmp_path, monkeypatch):
    from api.artifacts.paths import checkpoint_key
    from grpo_core.run.callbacks import TrainerCallback
    from worker.checkpoint_uploads import StoredCheckpoints

    clock = fence_clock(monkeypatch)
    job_id, attempt, fence, store = claimed_with_store(
        settings, database_url, submit(tiny_spec("frozen-failed-upload")), tmp_path)
    folder = written_folder(tmp_path / "stale", "step-2", "stale")
    stale = StoredCheckpoints(TrainerCallback(),
                              _FreezingThenFailingStore(store, clock, settings.lease_seconds * 2),
                              job_id, attempt, 5.0, fenced=fence.hold)
    stale.on_checkpoint(2, folder)  # the failure is the store's: retried later, if the fence lets it
    assert list(store.list(checkpoint_key(job_id, 2, attempt))) == []


def test_a_fenced_write_frozen_before_its_commit_holds_the_job_no_longer_than_the_lease(
        database_url, submit, tiny_spec):
    # The fence locks the job's row until the write commits. A process frozen in between (the
    # chaos test's paused worker) would keep the reaper from requeueing the job for as long as it
    # stays frozen; Postgres ends that idle transaction after the lease instead.
    import time

    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from api.store.attempts import attempt_lease_left
    from worker.retrying import is_transient

    job_id = submit(tiny_spec("frozen-commit"))
    attempt = dispatch_and_claim(database_url, job_id, "w1")
    started = time.monotonic()
    with pytest.raises(DBAPIError) as woke:  # the frozen writer's commit, once it wakes
        with session_scope(database_url) as frozen:
            assert attempt_lease_left(frozen, job_id, "w1", attempt, 1.0) is not None
            with session_scope(database_url) as reaper:
                reaper.execute(text("SET LOCAL lock_timeout = 10000"))  # fails, not hangs, without the fix
                assert requeue_after_fault(reaper, job_id, worker_id="w1", message="lease expired", data={},
                                           max_attempts=5)
    assert time.monotonic() - started < 8
    assert is_transient(woke.value)  # retried by the writer, whose next check finds the attempt stale


def test_a_lease_renewal_frozen_before_its_commit_holds_the_job_no_longer_than_the_lease(
        database_url, submit, tiny_spec):
    # The chaos test's stopped supervisor, caught between its renewal's update and its commit: the
    # row lock it holds would stall the reaper's requeue, and the scheduler's tick with it, for as
    # long as it stays stopped.
    import time

    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from api.store.attempts import renew_lease

    job_id = submit(tiny_spec("frozen-renewal"))
    dispatch_and_claim(database_url, job_id, "w1")
    started = time.monotonic()
    with pytest.raises(DBAPIError):  # the frozen renewal's commit, once it wakes
        with session_scope(database_url) as frozen:
            assert renew_lease(frozen, job_id, "w1", 1.0)[0]
            with session_scope(database_url) as reaper:
                reaper.execute(text("SET LOCAL lock_timeout = 10000"))  # fails, not hangs, without the fix
                assert requeue_after_fault(reaper, job_id, worker_id="w1", message="lease expired", data={},
                                           max_attempts=5)
    assert time.monotonic() - started < 8
