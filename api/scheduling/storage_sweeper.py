"""The storage sweep: a thread of the scheduler process (``grpo scheduler``, hence ``grpo dev``)
that removes from the object store what no live row names, the leftovers of a storage call that
failed after its row's commit (rows always change first, so a failure leaves objects, never a row
naming a missing one):
  * a deleted job's prefix ``jobs/ID/`` (``DELETE /v1/jobs`` whose store step failed; a job
    folder with no row at all goes too);
  * a deleted file's object ``files/ID`` (``DELETE /v1/files`` whose store step failed);
  * an ``error`` upload's object (the store failed part-way, or kept a copy that did not match).

Chosen over retrying at each delete: a failure whose client never retries is still cleaned, and
one loop covers jobs and files alike. Safe against what is being written: a job's folder and a
file's object are only ever written after their row is committed, and a row that holds its
object (a job not deleted, a file uploading or ready) keeps it.

Bounded: each pass removes at most ``batch`` prefixes or objects; the job folders are named by one
delimiter listing (``ObjectStore.folders``, not every object in them) and the ``files/`` objects
listed, both checked against SQL a chunk at a time. A full pass is followed at once by the next,
else the next waits ``GRPO_STORAGE_SWEEP_SECONDS``. Every scheduler process sweeps, leader or not:
removing what is gone already is no error, so more sweepers only share the work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from api.artifacts.paths import JOBS_DIR, job_prefix
from api.settings import Settings
from api.storage import ObjectStore, StorageError, open_store
from api.storage.keys import FILES_DIR, file_key
from api.store import files
from api.store.db import session_scope
from api.store.job_deletion import undeleted_jobs

log = logging.getLogger(__name__)

BATCH = 100  # removals per pass
CHUNK = 500  # names checked against SQL per query


def _chunks(names: Iterable[str]) -> Iterator[list[str]]:
    iterator = iter(names)
    while chunk := list(islice(iterator, CHUNK)):
        yield chunk


class StorageSweeper:
    def __init__(self, settings: Settings, store: ObjectStore | None = None, batch: int = BATCH) -> None:
        self.settings, self.batch = settings, batch
        self.store = store if store is not None else open_store(settings.storage_location)

    def sweep(self) -> int:
        """One pass: remove up to ``batch`` leftovers, jobs' first; how many were removed."""
        store = self.store
        removed = self._remove(self._job_leftovers(), lambda job_id: store.delete_prefix(job_prefix(job_id)),
                               self.batch)
        return removed + self._remove(self._file_leftovers(), lambda file_id: store.delete(file_key(file_id)),
                                      self.batch - removed)

    def _job_leftovers(self) -> Iterator[int]:
        # Only the folders a job's id names: anything else under jobs/ is not the sweep's to judge.
        names = (name for name in self.store.folders(JOBS_DIR) if name.isdigit())
        for chunk in _chunks(names):
            ids = [int(name) for name in chunk]
            with session_scope(self.settings.database_url) as session:
                live = undeleted_jobs(session, ids)
            yield from (job_id for job_id in ids if job_id not in live)

    def _file_leftovers(self) -> Iterator[str]:
        ids = (info.key.removeprefix(f"{FILES_DIR}/") for info in self.store.list(FILES_DIR))
        for chunk in _chunks(ids):
            with session_scope(self.settings.database_url) as session:
                holding = files.holding_file_ids(session, chunk)
            yield from (file_id for file_id in chunk if file_id not in holding)

    @staticmethod
    def _remove(leftovers: Iterator[Any], remove: Callable[[Any], object], budget: int) -> int:
        removed = 0
        for leftover in islice(leftovers, max(budget, 0)):  # nothing more is listed once it is spent
            remove(leftover)
            log.info("storage sweep: removed %s, which no live row names", leftover)
            removed += 1
        return removed

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop``; a failed pass (the store or the database away) is
        logged and retried at the next, never fatal."""
        while not stop.is_set():
            removed = 0
            try:
                removed = self.sweep()
            except (StorageError, SQLAlchemyError) as exc:
                log.warning("storage sweep failed: %s", exc)
            except Exception:  # noqa: BLE001 - a bug in one pass must not stop the next
                log.exception("storage sweep failed")
            if removed < self.batch:
                stop.wait(self.settings.storage_sweep_seconds)


def start(settings: Settings, stop: threading.Event) -> threading.Thread:
    """The sweep, running in a daemon thread until ``stop``."""
    thread = threading.Thread(target=StorageSweeper(settings).run, args=(stop,), name="storage-sweeper",
                              daemon=True)
    thread.start()
    return thread
