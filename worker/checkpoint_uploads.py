"""A job's checkpoints into the object store it shares with the API, before SQL names them.

The trainer writes each checkpoint into the worker's own folder; :class:`StoredCheckpoints` then
stores it (its completion mark last) and only then passes it on to the reporter, which writes its
row: a row always names a checkpoint whole in the store, the one any worker resumes from.

A store that cannot be reached does not stop the training: the upload is retried after later
steps, backing off (a ``checkpoint_upload_retry`` warning event says so once per checkpoint), and
a newer checkpoint replaces one still waiting (retention may delete the older folder, and a
resume needs only the newest). As the trainer's retention does locally, a checkpoint no longer the
newest stored loses its ``optimizer.pt`` in the store too (the bulk of an older checkpoint, which
only a resume reads, and a resume takes the newest): the team's quota counts what the store holds.
At the run's end :meth:`StoredCheckpoints.flush` waits for the last
one for ``GRPO_STORAGE_RETRY_SECONDS``, then raises StorageUnavailable: the attempt is requeued.
Every upload and deletion is made under the attempt's fence (:mod:`worker.fencing`): none once a
newer attempt owns the job. The attempt stores under keys of its own
(:func:`api.artifacts.paths.checkpoint_key`), and its row names the attempt: an upload a frozen
process finishes after the job moved lands beside the owner's objects, never over them, and is
undone by deleting only its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from api.artifacts.paths import COMPLETE_MARK, checkpoint_key
from api.storage import ObjectStore, StorageUnavailable
from grpo_core.run.callbacks import CallbackList, TrainerCallback
from grpo_core.run.checkpoint import OPTIMIZER_FILE
from worker.job_storage import FIRST_DELAY_SECONDS, MOST_DELAY_SECONDS, retry_storage

log = logging.getLogger(__name__)
UPLOAD_RETRY_EVENT = "checkpoint_upload_retry"
T = TypeVar("T")


def unfenced(what: str, change: Callable[[], T], undo: Callable[[], object] | None = None) -> T:
    return change()


class StoredCheckpoints(CallbackList):
    """``reporter`` (and only it) behind the store: every hook reaches it as it is, but a
    checkpoint only once stored, and a checkpoint retention removed once it left the store.
    ``fenced(what, change, undo)``: each change to the store made only while the attempt owns the
    job (:meth:`worker.fencing.AttemptFence.hold`), an upload undone when it ended after the
    lease may have passed (the process was frozen while it ran)."""

    def __init__(self, reporter: TrainerCallback, store: ObjectStore, job_id: int, attempt: int | None,
                 budget_seconds: float, published: dict[int, int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 fenced: Callable[..., T] = unfenced) -> None:
        super().__init__([reporter])
        self.store, self.job_id, self.budget_seconds, self.clock = store, job_id, budget_seconds, clock
        self.attempt, self.fenced = attempt, fenced
        # Each kept checkpoint's step -> the attempt whose key holds it: earlier attempts' (their
        # rows, ``published``), which retention here deletes too, and this one's.
        self.stored_by: dict[int, int | None] = dict(published or {})
        self.pending: tuple[int, Path] | None = None
        self.doomed: set[int] = set()  # steps whose stored objects (whole or partial) must go
        self.newest: int | None = None  # the newest checkpoint this attempt stored: keeps its optimizer
        self.stale: set[int] = set()  # older ones whose stored optimizer.pt is to go
        self.retry_at, self.delay = 0.0, FIRST_DELAY_SECONDS

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self.pending is not None:  # superseded before it was stored: its partial objects go
            self.doomed.add(self.pending[0])
        self.pending, self.delay = (step, path), FIRST_DELAY_SECONDS
        self._upload()

    def on_step(self, record: dict[str, Any]) -> None:
        super().on_step(record)
        if self.pending is not None and self.clock() >= self.retry_at:
            self._upload()

    def on_checkpoints_removed(self, steps: list[int]) -> None:
        self.doomed.update(steps)
        self._delete_doomed()

    def flush(self) -> None:
        """Wait until the newest checkpoint is stored (and recorded), or raise StorageUnavailable."""
        if self.pending is not None:
            what = f"job {self.job_id}: the checkpoint of step {self.pending[0]}"
            retry_storage(self._store_pending, self.budget_seconds, what)

    def _upload(self) -> None:
        step = self.pending[0]
        try:
            self._store_pending()
        except StorageUnavailable as error:
            first = self.delay == FIRST_DELAY_SECONDS
            self.retry_at, self.delay = self.clock() + self.delay, min(MOST_DELAY_SECONDS, self.delay * 2)
            log.warning("job %s: the checkpoint of step %s is not stored yet: %s", self.job_id, step, error)
            if first:
                super().on_event(UPLOAD_RETRY_EVENT,
                                 f"the checkpoint of step {step} could not be stored yet; training goes on "
                                 "and its upload is retried", {"step": step, "error": str(error)[:500]})

    def _store_pending(self) -> None:
        step, path = self.pending
        key = checkpoint_key(self.job_id, step, self.attempt)
        # Undone (its objects deleted) when it finished after the lease may have passed: a stale
        # attempt's checkpoint must not stay in the store beside the owner's.
        self.fenced(f"the checkpoint of step {step}",
                    lambda: self.store.put_folder(key, path, last=[COMPLETE_MARK]),
                    lambda: self.store.delete_prefix(key))
        self.pending = None
        self.doomed.discard(step)
        self.stored_by[step] = self.attempt
        if self.newest is not None:
            self.stale.add(self.newest)
        self.newest = step
        super().on_checkpoint(step, path)  # the row, now that the store holds it whole
        self._delete_doomed()

    def _delete_doomed(self) -> None:
        """Retention in the store, and the rows with it, then the older checkpoints' optimizer
        state. Not while a newer checkpoint waits: the store keeps what a resume needs until its
        successor is whole there. Best effort: a store away now is asked again after the next
        upload."""
        if self.pending is not None:
            return
        store = self.store
        gone = self._removed(self.doomed, lambda step: store.delete_prefix(self._key(step)),
                             "the stored checkpoint")
        self.doomed.difference_update(gone)
        for step in gone:
            self.stored_by.pop(step, None)
        if gone:  # the job no longer keeps them: their rows go too
            super().on_checkpoints_removed(gone)
        self.stale -= self.doomed | set(gone)  # gone, or going, whole: nothing to strip
        self.stale.difference_update(self._removed(
            self.stale, lambda step: store.delete(f"{self._key(step)}/{OPTIMIZER_FILE}"),
            "the stored optimizer state"))

    def _key(self, step: int) -> str:
        """Where ``step``'s checkpoint is stored: by the attempt that stored it (this one's for a
        step it was storing when superseded)."""
        return checkpoint_key(self.job_id, step, self.stored_by.get(step, self.attempt))

    def _removed(self, steps: set[int], remove: Callable[[int], object], what: str) -> list[int]:
        """The steps, oldest first, that ``remove`` removed before the store went away (if it did)."""
        done = []
        for step in sorted(steps):
            try:
                self.fenced(f"{what} of step {step}", lambda s=step: remove(s))
            except StorageUnavailable as error:
                log.warning("job %s: %s of step %s is not deleted yet: %s", self.job_id, what, step, error)
                break
            done.append(step)
        return done
