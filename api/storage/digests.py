"""SHA-256 over files and byte streams, read in bounded chunks, so a digest of a many-gigabyte
checkpoint or upload never holds more than one chunk."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from api.storage.errors import ChecksumMismatch

CHUNK_BYTES = 1024 * 1024


def file_chunks(path: Path) -> Iterator[bytes]:
    """The bytes of ``path``, a chunk at a time."""
    with open(path, "rb") as handle:
        yield from handle_chunks(handle)


def handle_chunks(handle: BinaryIO, start: int = 0, length: int | None = None) -> Iterator[bytes]:
    """The bytes of an open file from ``start``, ``length`` of them (None: to the end)."""
    handle.seek(start)
    left = length
    while left is None or left > 0:
        chunk = handle.read(CHUNK_BYTES if left is None else min(CHUNK_BYTES, left))
        if not chunk:
            return
        if left is not None:
            left -= len(chunk)
        yield chunk


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in file_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def check_digest(key: str, digest: str, recorded: str | None) -> None:
    """A copy read back must hash to what was recorded when it was written (None: unknown)."""
    if recorded is not None and digest != recorded:
        raise ChecksumMismatch(f"'{key}' read back with SHA-256 {digest}, recorded {recorded}")


class HashingReader:
    """A read-only file object over an iterator of byte chunks that hashes and counts what it
    hands out: what a client library that reads parts from a file can take as a streamed body.
    It buffers at most one ``read`` size beyond one chunk."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = bytearray()
        self._digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        with memoryview(self._buffer) as view:  # one copy out of the buffer, not two
            taken = bytes(view if size < 0 else view[:size])
        del self._buffer[:len(taken)]
        self._digest.update(taken)
        self.size += len(taken)
        return taken

    def readable(self) -> bool:
        return True

    def sha256(self) -> str:
        return self._digest.hexdigest()
