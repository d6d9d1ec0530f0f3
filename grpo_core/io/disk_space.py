"""A full disk under any writer of a run's files (checkpoints, the exported model, tracker files,
JSONL records), told apart from other write failures and reported the same way: a ``disk_full``
error naming the path and the bytes still free, raised after the writer has removed what it half
wrote (those are the very bytes a retry needs, and a torn record would break the next reader).

The disk's own error may arrive wrapped: torch's zip writer reports a short write as a
RuntimeError without the errno, and client libraries (MLflow over SQLAlchemy over sqlite3, W&B's
log handlers) raise their own exception from the operating system's, so the exceptions an error
was raised from are looked through too.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from grpo_core.errors import GRPOError

DISK_FULL = "disk_full"
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What torch's PytorchStreamWriter says when the disk fills under it (the errno is lost).
_TORCH_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed")
_CHAIN_LIMIT = 16  # causes looked through; chains are short, a cycle must not loop forever


def disk_full_error(exc: BaseException, path: Path, writing: str = "checkpoint") -> GRPOError | None:
    """``exc`` as a ``disk_full`` error saying it was ``writing`` ``path`` and the space left
    there, or None when neither it nor what it was raised from is a full disk."""
    if not any(_is_full(cause) for cause in _chain(exc)):
        return None
    return _disk_full(path, writing, f": {exc}")


def check_free_space(path: Path, writing: str) -> None:
    """For a writer that does not report its own failures: ``disk_full`` when the filesystem of
    ``path`` has no byte left, which is where such a writer has lost (or will lose) a write."""
    if free_bytes(path) == 0:
        raise _disk_full(path, writing, "")


def _disk_full(path: Path, writing: str, cause: str) -> GRPOError:
    free = free_bytes(path)
    left = f"{free} bytes free" if free is not None else "free space unknown"
    return GRPOError(f"no space left writing {writing} {path} ({left}){cause}", code=DISK_FULL)


@contextmanager
def disk_full_reported(path: Path, writing: str, undo: Callable[[], object] | None = None) -> Iterator[None]:
    """Run the block; when it fails, ``undo`` first removes what it half wrote, then a full disk
    is raised as :func:`disk_full_error` and anything else as it was."""
    try:
        yield
    except BaseException as exc:
        if undo is not None:
            undo()
        full = disk_full_error(exc, path, writing)
        if full is not None:
            raise full from exc
        raise


@contextmanager
def appended_whole(path: Path, writing: str) -> Iterator[None]:
    """:func:`disk_full_reported` for a block that appends to ``path``: a failed append is cut
    off again (the file as long as before, or gone if the block made it), since a torn record
    at a file's end is what its readers choke on."""
    size = path.stat().st_size if path.exists() else None
    with disk_full_reported(path, writing, undo=lambda: _cut_back(path, size)):
        yield


def _cut_back(path: Path, size: int | None) -> None:
    if size is None:
        path.unlink(missing_ok=True)
    elif path.exists():
        os.truncate(path, size)  # shortening a file needs no free space


def free_bytes(path: Path) -> int | None:
    """Bytes free on the filesystem of ``path`` (or of its nearest folder that exists)."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _CHAIN_LIMIT:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _is_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in _DISK_FULL_ERRNOS
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _TORCH_SHORT_WRITE)
