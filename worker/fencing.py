"""A job's artifacts fenced by its lease: the attempt number is the fencing token of every write
(docs/architecture.md §6; Kleppmann, "How to do distributed locking").

A worker frozen with its processes (a paused VM, a partitioned host) may wake after its job moved to
another worker and write on as if nothing happened: its supervisor kills it only at its next lease
renewal. So nothing an attempt writes is visible until it is *published*, and a publication is
refused once a newer attempt owns the job:

* everything is written under an attempt-scoped name first (:func:`api.artifacts.paths.staging_dir`,
  outside the job's folder), then published by a rename that never replaces (a stale rename onto a
  name the owner wrote fails), or by a store upload, each checked first (:meth:`AttemptFence.hold`);
* a SQL row (a step's metrics, a checkpoint's row, an event) is written only in a transaction that
  checks the token and locks the job's row (:meth:`AttemptFence.guard`): the requeue or claim that
  takes the job over waits for its commit. Readers (resume, downloads) go by those rows.

A file-system rename is not a transaction with SQL, so :meth:`AttemptFence.hold` closes the window
between the check and the rename with the lease itself: the check answers how long the lease has
left on the database's clock, and nobody can take the job over before then (the reaper requeues
only an expired lease). An operation that finished within that time happened while the attempt
owned the job; one that took longer (the process was frozen in between) is undone when it can be
(a rename of its own, attempt-scoped folder, which no other attempt could have replaced) and the
attempt ends as stale.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.orm import Session

from api.settings import Settings
from api.store.attempts import attempt_lease_left
from api.store.db import session_scope
from grpo_core.io.disk_space import disk_full_reported
from grpo_core.run.publishing import Publisher
from worker.outcome import LEASE_LOST
from worker.retrying import retry_transient

log = logging.getLogger(__name__)
T = TypeVar("T")


class StaleAttempt(Exception):
    """A newer attempt owns the job (or it was requeued or ended): this one may publish nothing."""

    code = LEASE_LOST


class AttemptFence:
    """The fencing checks of ``attempt`` of ``job_id``, held by ``worker_id``."""

    def __init__(self, settings: Settings, job_id: int, worker_id: str, attempt: int) -> None:
        self.database_url, self.lease_seconds = settings.database_url, settings.lease_seconds
        self.retry_seconds, self.heartbeat_seconds = settings.db_retry_seconds, settings.heartbeat_seconds
        self.job_id, self.worker_id, self.attempt = job_id, worker_id, attempt

    def refused(self, what: str) -> StaleAttempt:
        return StaleAttempt(f"job {self.job_id}: attempt {self.attempt} no longer owns the job; "
                            f"{what} was not published")

    def guard(self, session: Session, what: str) -> float:
        """In the transaction that writes ``what``: raise StaleAttempt unless this attempt owns the
        job (its row locked until the commit); else the seconds its lease has left."""
        left = attempt_lease_left(session, self.job_id, self.worker_id, self.attempt, self.lease_seconds)
        if left is None:
            raise self.refused(what)
        return left

    def lease_left(self, what: str) -> float:
        """The seconds this attempt's lease has left, waiting (up to a lease) for its supervisor's
        next renewal while too little is left to publish in: a lease left to expire (the database
        was away, the supervisor is frozen) is renewed within a beat, or taken over."""
        deadline = time.monotonic() + self.lease_seconds
        while True:
            def check() -> float:
                with session_scope(self.database_url) as session:
                    return self.guard(session, what)

            left = retry_transient(check, self.retry_seconds, f"job {self.job_id}: the fence of {what}")
            if left >= self.lease_seconds / 2 or time.monotonic() >= deadline:
                if left <= 0:
                    raise self.refused(what)
                return left
            time.sleep(min(self.heartbeat_seconds, 0.5))

    def hold(self, what: str, publish: Callable[[], T], undo: Callable[[], object] | None = None) -> T:
        """``publish()`` while this attempt owns the job: checked first, and afterwards it must have
        taken less than the lease had left (else ``undo()`` and StaleAttempt)."""
        left = self.lease_left(what)
        started = time.monotonic()
        try:
            done = publish()
        except Exception:
            # Half done (an upload's transfers ending in an error after a freeze): what it did
            # write may not stay when the lease may have passed meanwhile; this attempt will not
            # be let back to clean it up.
            if undo is not None and time.monotonic() - started >= left:
                log.warning("job %s: attempt %s failed publishing %s after its lease may have passed; "
                            "undoing what it wrote", self.job_id, self.attempt, what)
                with contextlib.suppress(Exception):
                    undo()
            raise
        if time.monotonic() - started >= left:
            log.warning("job %s: attempt %s published %s after its lease may have passed; undoing it",
                        self.job_id, self.attempt, what)
            if undo is not None:
                undo()
            raise self.refused(what)
        return done

    def publish_folder(self, tmp: Path, final: Path, writing: str, aside: Path | None = None) -> None:
        """Rename ``tmp`` (this attempt's own, written whole) to ``final``, never over it: a name
        that exists is someone's published folder, which a stale attempt must not replace. With
        ``aside`` (in this attempt's staging folder), the folder published under ``final`` is set
        aside first: an artifact each attempt writes again (the final model, the trackers' files).
        ``writing`` names it where a full disk is reported."""
        source = self._beside(tmp, final, writing)

        def rename() -> None:
            if aside is not None and final.exists():
                os.rename(final, aside)
            rename_new(source, final)

        try:
            self.hold(f"{final.name} ({final.parent})", rename, undo=lambda: os.rename(final, source))
        except StaleAttempt:
            if source != tmp:
                shutil.rmtree(source, ignore_errors=True)
            raise

    def _beside(self, tmp: Path, final: Path, writing: str) -> Path:
        """``tmp``, where a rename can take it to ``final``: itself on the same file system, else
        (the job's folders on a disk of their own) a copy beside ``final`` under this attempt's
        hidden name, which no reader takes and which goes if it is not published."""
        final.parent.mkdir(parents=True, exist_ok=True)
        if os.stat(tmp).st_dev == os.stat(final.parent).st_dev:
            return tmp
        copy = final.parent / f".{final.name}.attempt-{self.attempt}.tmp"
        shutil.rmtree(copy, ignore_errors=True)
        with disk_full_reported(final, writing, undo=lambda: shutil.rmtree(copy, ignore_errors=True)):
            copy_folder(tmp, copy)
        shutil.rmtree(tmp)
        return copy


class FencedPublisher(Publisher):
    """The trainer's checkpoints written in this attempt's ``staging`` folder and renamed into the
    job's only while it owns the job; retention only then too."""

    def __init__(self, fence: AttemptFence, staging: Path) -> None:
        self.fence, self.staging = fence, staging

    def publish(self, tmp: Path, final: Path) -> None:
        self.fence.publish_folder(tmp, final, "checkpoint")

    def remove(self, what: str, remove: Callable[[], T]) -> T:
        return self.fence.hold(what, remove)


def rename_new(source: Path, target: Path) -> None:
    """``source`` renamed to ``target``, which must not exist: FileExistsError if it does. A
    folder renamed onto a folder that is not empty fails in the kernel; the check before catches
    a file or an empty folder (the rename's window there is the fence's, made harmless above)."""
    if os.path.lexists(target):
        raise FileExistsError(f"{target} exists: it is published, and is never replaced")
    os.rename(source, target)


def copy_folder(source: Path, target: Path) -> None:
    """``source``'s files into a new folder ``target``, failing at the first error as it was raised
    (``shutil.copytree`` gathers them into one ``shutil.Error``, which hides a full disk)."""
    target.mkdir()
    for path in sorted(source.rglob("*")):
        into = target / path.relative_to(source)
        if path.is_dir():
            into.mkdir(exist_ok=True)
        else:
            shutil.copy2(path, into)
