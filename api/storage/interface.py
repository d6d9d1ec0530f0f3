"""The one interface every object store offers (:class:`ObjectStore`), and what its reads and
stats answer with. The operations are those the service needs: files put from the worker's disk
(checkpoints, final models) and from a request body (uploads), read back whole to a local path or
streamed in ranges (downloads), listed and deleted by prefix (a job's artifacts), and whole
folders (a checkpoint) both ways.

A store writes each object whole or not at all: a failed put leaves the previous object (or none),
a failed get leaves no file at the destination. Every object a store writes records its SHA-256,
which ``stat`` reports and every get checks."""

from __future__ import annotations

import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from api.storage.errors import InvalidRange, ObjectNotFound
from api.storage.keys import checked_key, checked_prefix, partial_path


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str | None  # None: written by something else than an ObjectStore, or in a listing
    modified: float  # seconds since the epoch, as the store records it


class ObjectStream:
    """An open ranged read: ``info`` describes the whole object, iterating yields the bytes of
    ``start`` .. ``start + length`` a chunk at a time. Close it (or use ``with``) when done early."""

    def __init__(self, info: ObjectInfo, start: int, length: int, chunks: Iterator[bytes],
                 close: Callable[[], None]) -> None:
        self.info, self.start, self.length = info, start, length
        self._chunks, self._close = chunks, close

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        self._close()

    def __enter__(self) -> ObjectStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_range(size: int, start: int, length: int | None) -> tuple[int, int]:
    """``(start, length)`` of a read of an object of ``size`` bytes, checked the same way by every
    store: a whole read is always valid; a ranged one must start inside the object."""
    if start < 0 or (length is not None and length < 1):
        raise InvalidRange(f"a read needs start ≥ 0 and length ≥ 1, not start={start}, length={length}")
    if start == 0 and length is None:
        return 0, size
    if start >= size:
        raise InvalidRange(f"a read from byte {start} of an object of {size} bytes")
    return start, min(size - start, size if length is None else length)


class ObjectStore(ABC):
    """Objects under ``/``-separated keys (:mod:`api.storage.keys`). Every method raises
    :class:`~api.storage.errors.StorageUnavailable` when the store cannot be reached, and
    :class:`~api.storage.errors.ObjectNotFound` when what it reads is absent."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> ObjectInfo:
        """Store the local file ``path`` under ``key`` (a large one in parallel parts)."""

    @abstractmethod
    def put_stream(self, key: str, chunks: Iterable[bytes]) -> ObjectInfo:
        """Store the bytes ``chunks`` yields, holding at most a few parts of them at once."""

    @abstractmethod
    def get_file(self, key: str, path: Path) -> ObjectInfo:
        """Write the object to ``path`` (through a temporary file beside it, renamed into place
        once its SHA-256 matched the recorded one)."""

    @abstractmethod
    def open_read(self, key: str, start: int = 0, length: int | None = None) -> ObjectStream:
        """Open the bytes ``start`` .. ``start + length`` (None: to the end) for streaming; a
        missing object raises here, before anything is streamed."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo: ...

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under the folder ``prefix`` (``""``: all), by key; ``sha256`` is None here
        (ask ``stat``)."""

    @abstractmethod
    def folders(self, prefix: str = "") -> Iterator[str]:
        """The names of the folders directly under ``prefix`` that hold objects (in no promised
        order), without listing what is in them (S3's delimiter listing): the names under
        ``jobs/`` cost one request per thousand jobs, however many objects each holds."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; an absent one is no error, so a retried deletion succeeds."""

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under the folder ``prefix`` (never the whole store); how many."""
        keys = [info.key for info in self.list(checked_prefix(prefix))]
        for key in keys:
            self.delete(key)
        return len(keys)

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ObjectNotFound:
            return False
        return True

    def put_folder(self, prefix: str, folder: Path, last: Iterable[str] = ()) -> int:
        """Store every file under ``folder`` as ``prefix/<relative path>``; the files named in
        ``last`` (relative paths, e.g. a checkpoint's completion mark) only once all others are
        stored, so a reader that sees them sees the whole folder. Returns the bytes stored.
        Symbolic links are refused: a job's folder must not carry files from outside it."""
        base, folder = checked_prefix(prefix), Path(folder)
        files = sorted(_folder_files(folder))
        final = set(last)
        pairs = [(base + relative, folder / relative) for relative in files if relative not in final]
        closing = [(base + relative, folder / relative) for relative in files if relative in final]
        self._put_files(pairs)
        self._put_files(closing)
        return sum(path.stat().st_size for _, path in pairs + closing)

    def get_folder(self, prefix: str, folder: Path) -> int:
        """Write every object under ``prefix`` into the new folder ``folder`` (filled beside it,
        then renamed into place: a reader never sees half of it; FileExistsError if it exists by
        then). Returns the bytes written; ObjectNotFound when nothing is under ``prefix``."""
        base, folder = checked_prefix(prefix), Path(folder)
        objects = list(self.list(base))
        if not objects:
            raise ObjectNotFound(base)
        folder.parent.mkdir(parents=True, exist_ok=True)
        filling = partial_path(folder)
        try:
            self._get_files([(info.key, filling / info.key.removeprefix(base)) for info in objects])
            try:
                os.rename(filling, folder)
            except OSError as error:
                raise FileExistsError(f"{folder} already exists") from error
        finally:
            shutil.rmtree(filling, ignore_errors=True)
        return sum(info.size for info in objects)

    # Folder transfers go through these, so a store can move many files at once.
    def _put_files(self, pairs: list[tuple[str, Path]]) -> None:
        for key, path in pairs:
            self.put_file(key, path)

    def _get_files(self, pairs: list[tuple[str, Path]]) -> None:
        for key, path in pairs:
            self.get_file(key, path)


def _folder_files(folder: Path) -> Iterator[str]:
    """Relative ``/``-paths of the regular files under ``folder``, checked as keys."""
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root, name)
            if path.is_symlink():
                raise ValueError(f"{path} is a symbolic link; a stored folder holds only its own files")
        for name in names:
            yield checked_key(Path(root, name).relative_to(folder).as_posix())
