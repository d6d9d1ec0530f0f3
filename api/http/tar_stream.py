"""A folder's files streamed as a tar archive, never held whole in memory, with its exact length
known before the first byte (so ``Content-Length`` is right and a broken download can continue
with ``Range``).

A tar is a sequence of 512-byte blocks: per member a header, the content, zeros up to the next
block; then two zero blocks. Every member's size is fixed when the stream is built (files are
opened then, so a checkpoint deleted by retention during a download still streams whole: an
open file outlives its name), which makes every byte's offset known and a range cheap to serve.
"""

from __future__ import annotations

import os
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

BLOCK = 512
_CHUNK = 1024 * 1024
_END = b"\0" * (2 * BLOCK)


@dataclass
class _Member:
    header: bytes
    size: int
    file: BinaryIO | None  # None: ``data`` holds the content
    data: bytes = b""

    @property
    def padding(self) -> int:
        return -self.size % BLOCK


def _header(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)  # PAX: names of any length


class TarStream:
    """``files`` (name in the archive -> path) and ``generated`` (name -> bytes) under ``prefix/``.
    Close it (or read it to the end) to release the open files."""

    def __init__(self, prefix: str, files: dict[str, Path], generated: dict[str, bytes]) -> None:
        self.members: list[_Member] = []
        try:
            for name, path in files.items():
                handle = path.open("rb")
                stat = os.fstat(handle.fileno())
                self.members.append(_Member(_header(f"{prefix}/{name}", stat.st_size, stat.st_mtime),
                                            stat.st_size, handle))
            now = time.time()
            for name, data in generated.items():
                header = _header(f"{prefix}/{name}", len(data), now)
                self.members.append(_Member(header, len(data), None, data))
        except BaseException:
            self.close()
            raise
        self.length = sum(len(m.header) + m.size + m.padding for m in self.members) + len(_END)

    def close(self) -> None:
        for member in self.members:
            if member.file is not None:
                member.file.close()

    def iter_range(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Bytes ``start`` to ``end`` inclusive (None: to the end) of the archive."""
        stop = self.length if end is None else end + 1
        offset = 0
        try:
            for piece_length, read in self._pieces():
                if offset + piece_length > start and offset < stop:
                    skip, take = max(0, start - offset), min(piece_length, stop - offset)
                    yield from read(skip, take)
                offset += piece_length
                if offset >= stop:
                    break
        finally:
            self.close()

    def _pieces(self) -> Iterator[tuple[int, object]]:
        """``(length, read(skip, upto))`` for each consecutive piece of the archive."""
        for member in self.members:
            yield len(member.header), _bytes_reader(member.header)
            if member.file is None:
                yield member.size, _bytes_reader(member.data)
            else:
                yield member.size, _file_reader(member.file)
            if member.padding:
                yield member.padding, _bytes_reader(b"\0" * member.padding)
        yield len(_END), _bytes_reader(_END)


def _bytes_reader(data: bytes):
    def read(skip: int, upto: int) -> Iterator[bytes]:
        yield data[skip:upto]

    return read


def _file_reader(handle: BinaryIO):
    def read(skip: int, upto: int) -> Iterator[bytes]:
        handle.seek(skip)
        left = upto - skip
        while left > 0:
            chunk = handle.read(min(_CHUNK, left))
            if not chunk:  # the file shrank under us: the archive cannot be completed honestly
                raise OSError(f"{handle.name} ended {left} bytes early")
            left -= len(chunk)
            yield chunk

    return read


def parse_range(header: str | None, length: int) -> tuple[int, int] | None:
    """``Range: bytes=a-b`` (one range; ``a-`` and ``-n`` too) as inclusive ``(start, end)``;
    None for no header or one we do not serve (the whole archive goes out then, as RFC 9110
    allows); ValueError for a range outside the archive (416)."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header.removeprefix("bytes=").strip().partition("-")
    try:
        if first == "":
            start, end = max(0, length - int(last)), length - 1
        else:
            start = int(first)
            end = min(int(last), length - 1) if last else length - 1
    except ValueError:
        return None
    if start >= length or start > end or start < 0:
        raise ValueError(f"bytes {header.removeprefix('bytes=')} are outside the {length} of the archive")
    return start, end
