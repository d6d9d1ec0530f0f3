"""Uploaded files (``file:ID`` sources) on a worker host: read from the store (``files/ID``) into a
cache bounded in bytes (``GRPO_WORKER_CACHE_DIR``, ``GRPO_WORKER_CACHE_BYTES``), keyed by the
object's SHA-256, so a model that ten jobs use downloads once per host, and two uploads of the
same bytes share one entry.

An entry is ``SHA/data`` (a dataset, one file) or ``SHA/model/`` (a model archive, unpacked once:
regular files and folders only, no absolute path, ``..``, link or device). It is made beside its
place and renamed into it, so a reader never sees half of one; its bytes are checked against the
digest the store recorded, and a mismatch (a corrupt object) keeps nothing. A process using an
entry holds it (``SHA/users/PID``) while its job runs; the least recently used entries not held
by a live process are evicted to make room: for a model, room for its files unpacked (told by the
archive's headers, read through the API's bounded reader, before its data is written), so an
archive that unpacks a thousandfold is budgeted as the thousandfold it takes. A process may also
keep links to its entries under new names in a folder of its own (``.links/PID``,
:meth:`FileCache.links`), gone on release.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from api.settings import Settings
from api.storage import ChecksumMismatch, ObjectStore
from api.storage.digests import file_sha256
from api.storage.keys import file_key, partial_path
from api.uploads.model_archives import UnsafeHeader, open_bounded
from grpo_core.io.paths import folder_bytes
from grpo_core.run.processes import process_alive

FILE_SCHEME = "file:"
DATA, MODEL, USERS = "data", "model", "users"
LINKS = ".links"  # a dot-name: never taken for an entry, so never counted or evicted as one


def uploaded_file_id(source: str) -> str | None:
    """The ID of a ``file:ID`` source, None for any other."""
    return source.removeprefix(FILE_SCHEME) if source.startswith(FILE_SCHEME) else None


class UnsafeArchive(ValueError):
    """A model archive member that would land outside its folder or is not a plain file."""


class FileCache:
    def __init__(self, store: ObjectStore, root: Path, max_bytes: int) -> None:
        self.store, self.root, self.max_bytes = store, Path(root), max_bytes

    @classmethod
    def of(cls, settings: Settings, store: ObjectStore) -> FileCache:
        return cls(store, settings.worker_cache_dir, settings.worker_cache_bytes)

    def dataset(self, file_id: str) -> Path:
        """The uploaded dataset's file, held by this process."""
        return self._entry(file_id, DATA) / DATA

    def model(self, file_id: str) -> Path:
        """The uploaded model archive's unpacked folder, held by this process."""
        return self._entry(file_id, MODEL) / MODEL

    def _entry(self, file_id: str, kind: str) -> Path:
        key = file_key(file_id)
        info = self.store.stat(key)
        if info.sha256 is None:
            raise ChecksumMismatch(f"'{key}' has no recorded SHA-256 to check a copy against")
        entry = self.root / info.sha256
        if not (entry / kind).exists():
            self._make_room(info.size)
            self._fill(key, info.sha256, info.size, entry, kind)
        self._hold(entry)
        return entry

    def _fill(self, key: str, digest: str, size: int, entry: Path, kind: str) -> None:
        filling = partial_path(entry)
        filling.mkdir(parents=True)
        try:
            download = filling / DATA
            self.store.get_file(key, download)  # checked against the recorded digest on the way
            if file_sha256(download) != digest:
                raise ChecksumMismatch(f"'{key}' read back with another SHA-256 than the {digest} recorded")
            if kind == MODEL:  # the download stays until unpacked: room for both meanwhile
                unpack_safely(download, filling / MODEL, lambda unpacked: self._make_room(size + unpacked))
                download.unlink()
            (filling / USERS).mkdir()
            try:
                os.rename(filling, entry)
            except OSError:
                if not (entry / kind).exists():  # not another process's copy of the same bytes
                    raise
        finally:
            shutil.rmtree(filling, ignore_errors=True)

    def _hold(self, entry: Path) -> None:
        (entry / USERS).mkdir(exist_ok=True)
        (entry / USERS / str(os.getpid())).touch()
        now = time.time()
        os.utime(entry, (now, now))  # its last use, for eviction

    def links(self) -> Path:
        """This process's own folder beside the entries (same filesystem: an entry's file can be
        hard-linked into it under another name), emptied by :meth:`release`. Those of processes
        that died without releasing are removed first."""
        folder = self.root / LINKS
        if folder.is_dir():
            for other in folder.iterdir():
                if other.name.isdigit() and not process_alive(int(other.name)):
                    shutil.rmtree(other, ignore_errors=True)
        mine = folder / str(os.getpid())
        mine.mkdir(parents=True, exist_ok=True)
        return mine

    def release(self) -> None:
        """This process uses none of its entries any more (its job ended)."""
        for mark in self.root.glob(f"*/{USERS}/{os.getpid()}"):
            mark.unlink(missing_ok=True)
        shutil.rmtree(self.root / LINKS / str(os.getpid()), ignore_errors=True)

    def _make_room(self, incoming: int) -> None:
        entries = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")] \
            if self.root.is_dir() else []
        used = sum(folder_bytes(p) for p in entries)
        for entry in sorted(entries, key=lambda p: p.stat().st_mtime):
            if used + incoming <= self.max_bytes:
                return
            if not _in_use(entry):
                used -= folder_bytes(entry)
                shutil.rmtree(entry, ignore_errors=True)


def _in_use(entry: Path) -> bool:
    users = entry / USERS
    return users.is_dir() and any(process_alive(int(mark.name)) for mark in users.iterdir()
                                  if mark.name.isdigit())


def unpack_safely(archive: Path, folder: Path, make_room: Callable[[int], None] | None = None) -> None:
    """A tar or tar.gz of a model folder into ``folder``: UnsafeArchive for any member that is not
    a regular file or folder, or whose path is absolute or climbs out with ``..``, or for an
    extended header past its bound. ``make_room`` is told what the files add up to before any is
    written."""
    folder.mkdir(parents=True)
    try:
        with open_bounded(archive) as tar:
            members = tar.getmembers()
            _check_members(members)
            if make_room is not None:
                make_room(sum(member.size for member in members if member.isfile()))
            tar.extractall(folder, members=members, filter="data")
    except UnsafeHeader as error:
        raise UnsafeArchive(f"archive header refused: {error}") from None


def _check_members(members: list[tarfile.TarInfo]) -> None:
    for member in members:
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts:
            raise UnsafeArchive(f"archive member '{member.name}' would be written outside its folder")
        if not (member.isfile() or member.isdir()):
            raise UnsafeArchive(f"archive member '{member.name}' is a link or a device, not a file")
