"""A folder as an object store: a key is a path under the root, so with the root at
``GRPO_ARTIFACTS_ROOT`` (the default) every artifact stays where earlier versions put it.

Each write goes to a temporary file beside its target (named with the reserved
:data:`~api.storage.keys.PARTIAL_MARK`, which listings skip) and is renamed into place once whole.
The SHA-256 rides along in an extended attribute, with the size and modification time it was
taken at, so a file changed in place afterwards reads as "digest unknown", never as a wrong one;
a filesystem without user attributes simply records none."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from api.storage.digests import check_digest, file_chunks, handle_chunks
from api.storage.errors import ObjectNotFound, StorageError, StorageUnavailable
from api.storage.interface import ObjectInfo, ObjectStore, ObjectStream, read_range
from api.storage.keys import PARTIAL_MARK, checked_key, checked_prefix, partial_path

_DIGEST_ATTRIBUTE = "user.grpo.sha256"
# A disk that is full, failing or (over NFS) gone is the host's fault, not the caller's.
_UNAVAILABLE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ESTALE, errno.ETIMEDOUT,
                       errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.EROFS}


class _SourceFailed(Exception):
    """What the caller's own bytes raised (a client gone mid-upload, a source file missing):
    carried past the translation below, which is for the store's failures only."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _from_source(chunks: Iterable[bytes]) -> Iterator[bytes]:
    iterator = iter(chunks)
    while True:
        try:
            chunk = next(iterator)
        except StopIteration:
            return
        except Exception as error:
            raise _SourceFailed(error) from error
        yield chunk


@contextmanager
def _translated(key: str) -> Iterator[None]:
    try:
        yield
    except _SourceFailed as failed:
        raise failed.error from None
    except FileNotFoundError as error:
        raise ObjectNotFound(key) from error
    except IsADirectoryError as error:  # a key that is a folder of others names no object
        raise ObjectNotFound(key) from error
    except OSError as error:
        kind = StorageUnavailable if error.errno in _UNAVAILABLE_ERRNOS else StorageError
        raise kind(f"local storage, '{key}': {error}") from error


class LocalStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / checked_key(key)

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        return self._write(key, file_chunks(Path(path)))

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> ObjectInfo:
        return self._write(key, chunks)

    def _write(self, key: str, chunks: Iterable[bytes]) -> ObjectInfo:
        target = self._path(key)
        with _translated(key):
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = partial_path(target)
            try:
                digest = _write_hashed(temp, _from_source(chunks))
                _record_digest(temp, digest)
                os.replace(temp, target)
            finally:
                temp.unlink(missing_ok=True)
            return self._info(key, target)

    def get_file(self, key: str, path: Path) -> ObjectInfo:
        source, path = self._path(key), Path(path)
        with _translated(key):
            info = self._info(key, source)
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = partial_path(path)
            try:
                check_digest(key, _write_hashed(temp, file_chunks(source)), info.sha256)
                os.replace(temp, path)
            finally:
                temp.unlink(missing_ok=True)
            return info

    def open_read(self, key: str, start: int = 0, length: int | None = None) -> ObjectStream:
        path = self._path(key)
        with _translated(key):
            info = self._info(key, path)
            start, length = read_range(info.size, start, length)
            handle = open(path, "rb")  # opened here: a file gone by now raises before any byte
        return ObjectStream(info, start, length, _reading(key, handle_chunks(handle, start, length)),
                            handle.close)

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with _translated(key):
            return self._info(key, path)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = checked_prefix(prefix, allow_root=True)
        folder = self.root / base
        keys = []
        with _translated(base):
            for root, _dirs, names in os.walk(folder):
                relative = Path(root).relative_to(self.root).as_posix()
                keys += [name if relative == "." else f"{relative}/{name}"
                         for name in names if PARTIAL_MARK not in name]
            for key in sorted(keys):
                stat = (self.root / key).stat()
                yield ObjectInfo(key, stat.st_size, None, stat.st_mtime)

    def folders(self, prefix: str = "") -> Iterator[str]:
        base = checked_prefix(prefix, allow_root=True)
        with _translated(base):
            try:
                entries = list(os.scandir(self.root / base))
            except FileNotFoundError:  # nothing was ever stored under it
                return
        yield from sorted(entry.name for entry in entries
                          if entry.is_dir(follow_symlinks=False) and PARTIAL_MARK not in entry.name)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _translated(key):
            path.unlink(missing_ok=True)
            self._prune(path.parent)

    def delete_prefix(self, prefix: str) -> int:
        base = checked_prefix(prefix)
        count = sum(1 for _ in self.list(base))
        folder = self.root / base
        with _translated(base):
            if folder.is_dir():
                shutil.rmtree(folder)
            self._prune(folder.parent)
        return count

    def _prune(self, folder: Path) -> None:
        """Remove the folders a deletion left empty, up to the root: a deleted job leaves nothing."""
        while folder != self.root and folder.is_relative_to(self.root):
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def _info(self, key: str, path: Path) -> ObjectInfo:
        stat = path.stat()
        if not path.is_file():
            raise ObjectNotFound(key)
        return ObjectInfo(key, stat.st_size, _recorded_digest(path, stat), stat.st_mtime)


def _reading(key: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    with _translated(key):
        yield from chunks


def _write_hashed(path: Path, chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as handle:
        for chunk in chunks:
            digest.update(chunk)
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    return digest.hexdigest()


def _stamp(stat: os.stat_result) -> str:
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _record_digest(path: Path, digest: str) -> None:
    try:
        os.setxattr(path, _DIGEST_ATTRIBUTE, f"{digest}:{_stamp(path.stat())}".encode())
    except OSError:  # no user attributes here (ENOTSUP): the digest stays unknown
        pass


def _recorded_digest(path: Path, stat: os.stat_result) -> str | None:
    try:
        digest, stamp = os.getxattr(path, _DIGEST_ATTRIBUTE).decode().split(":", 1)
    except (OSError, ValueError):
        return None
    return digest if stamp == _stamp(stat) else None
