"""Keeping a download's files alive without holding them open.

A download opens one file at a time (:mod:`api.http.tar_stream`), yet retention may delete a
checkpoint while it streams. So a download first hard-links its files into a folder of its own
under ``<artifacts>/.downloads/``: a deleted file's data lives on through the link, at no cost
in open files, until the download ends and removes its folder.

Each API process keeps its downloads' folders in one folder of its own, beside a lock file it
holds (``flock``) for as long as it lives. A process that starts pinning removes every folder
whose lock nobody holds, so a killed process's links do not keep deleted data on disk for ever.

Where files cannot be linked (another filesystem, no permission) they stream from their own
paths: such a download breaks off if its file is deleted before its turn.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PINS_DIR = ".downloads"  # under the artifacts root; no job folder is named so
_LOCK = ".lock"


@dataclass(frozen=True)
class Pinned:
    """A download's files (name -> path to stream from) and the folder to remove after it."""

    files: dict[str, Path]
    folder: Path | None = None  # None: not linked, the files stream from their own paths

    def release(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


class DownloadPins:
    """One process's pinned downloads under ``root``; safe to use from the threadpool."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._own: Path | None = None
        self._lock_fd: int | None = None  # held open (and locked) for the life of the process
        self._lock = threading.Lock()
        self._numbers = itertools.count()

    def pin(self, files: dict[str, Path]) -> Pinned:
        """``files`` linked into a new folder; as given where linking fails. FileNotFoundError
        if one is gone already."""
        try:
            folder = self._own_folder() / str(next(self._numbers))
            folder.mkdir()
        except OSError as exc:
            return _unpinned(files, exc)
        linked = {}
        try:
            for index, (name, path) in enumerate(files.items()):
                linked[name] = folder / str(index)
                os.link(path, linked[name])  # follows a symlink: the file, not the link, is kept
        except OSError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            if not path.exists():  # deleted since it was listed: there is nothing to stream
                raise
            return _unpinned(files, exc)
        return Pinned(linked, folder)

    def _own_folder(self) -> Path:
        with self._lock:
            if self._own is None:
                self.root.mkdir(parents=True, exist_ok=True)
                _remove_abandoned(self.root)
                self._lock_fd, self._own = _locked_folder(self.root)
            return self._own


def _locked_folder(root: Path) -> tuple[int, Path]:
    """A new folder under ``root`` and the descriptor of its lock file, locked."""
    name = uuid.uuid4().hex
    lock = root / f"{name}{_LOCK}"
    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != lock.stat().st_ino:  # a sweep took it before it was locked
            raise FileNotFoundError(f"{lock} was swept before it was locked")
        (root / name).mkdir()
    except BaseException:
        os.close(fd)
        raise
    return fd, root / name


def _unpinned(files: dict[str, Path], error: OSError) -> Pinned:
    log.warning("a download streams unpinned (a file deleted meanwhile breaks it off): %s", error)
    return Pinned(files)


def _remove_abandoned(root: Path) -> None:
    """Remove the folders under ``root`` of processes that are gone (their lock is not held),
    with their locks."""
    for lock in root.glob(f"*{_LOCK}"):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # another process's sweep got there first
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process lives
            os.close(fd)
            continue
        try:
            folder = root / lock.name.removesuffix(_LOCK)
            shutil.rmtree(folder, ignore_errors=True)
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
