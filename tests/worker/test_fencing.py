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
