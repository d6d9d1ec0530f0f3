"""A folder's files streamed as a tar archive, never held whole in memory, with its exact length
known before the first byte (so ``Content-Length`` is right and a broken download can continue
with ``Range``).

A tar is a sequence of 512-byte blocks: per member a header, the content, zeros up to the next
block; then two zero blocks. Every member's size is fixed when the stream is built (each file is
sized then), which makes every byte's offset known and a range cheap to serve.

A file is opened for each chunk read from it and closed before the chunk is sent, so a download
holds at most one file open while it reads and none while it waits on its client, however long
that client idles (the open costs little beside the read of a MiB). The file opened must be the
one sized (same inode): one replaced meanwhile breaks the download off rather than send bytes
that do not match its header. Keeping a file alive that may be deleted meanwhile (retention) is
the caller's part (:mod:`api.http.download_pins`).

Members may also be objects of a store (``stored``): each is sized by its listing and streamed
by a ranged read of it (:meth:`~api.storage.ObjectStore.open_read`), held open only while the
member's bytes go out; an object replaced or deleted meanwhile breaks the download off, as a
replaced file does (a store has no pins: a client continues with ``Range`` or asks again).
"""

from __future__ import annotations

import os
import tarfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from api.storage import ObjectInfo, ObjectStore

BLOCK = 512
_CHUNK = 1024 * 1024
_END = b"\0" * (2 * BLOCK)


@dataclass
class _Member:
    header: bytes
    size: int
    path: Path | None  # None: ``data`` holds the content
    inode: tuple[int, int] = (0, 0)  # (device, inode) of the file that was sized
    data: bytes = b""
    stored: ObjectInfo | None = None  # an object of the stream's store

    @property
    def padding(self) -> int:
        return -self.size % BLOCK


def _header(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)  # PAX: names of any length


class TarStream:
    """``files`` (name in the archive -> path), ``stored`` (name -> an object of ``store``) and
    ``generated`` (name -> bytes) under ``prefix/``.
    ``on_close`` runs once, when the stream is read to its end, closed or dropped unread (what
    the caller holds for it: its pinned files). FileNotFoundError if a file is gone before it
    is sized."""

    def __init__(self, prefix: str, files: dict[str, Path], generated: dict[str, bytes],
                 on_close: Callable[[], None] | None = None, *, store: ObjectStore | None = None,
                 stored: dict[str, ObjectInfo] | None = None) -> None:
        self.members: list[_Member] = []
        self.store = store
        # Also run if the stream is garbage collected: a response dropped before its first byte
        # never starts ``iter_range``, whose ``finally`` would have run it.
        self._release = weakref.finalize(self, on_close or (lambda: None))
        try:
            for name, path in files.items():
                stat = path.stat()
                self.members.append(_Member(_header(f"{prefix}/{name}", stat.st_size, stat.st_mtime),
                                            stat.st_size, path, (stat.st_dev, stat.st_ino)))
        except BaseException:
            self.close()
            raise
        for name, info in (stored or {}).items():
            self.members.append(_Member(_header(f"{prefix}/{name}", info.size, info.modified), info.size,
                                        None, stored=info))
        now = time.time()
        for name, data in generated.items():
            header = _header(f"{prefix}/{name}", len(data), now)
            self.members.append(_Member(header, len(data), None, data=data))
        self.length = sum(len(m.header) + m.size + m.padding for m in self.members) + len(_END)

    def close(self) -> None:
        """Run ``on_close`` now, if it has not run."""
        self._release()

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
            if member.stored is not None:
                yield member.size, _object_reader(self.store, member.stored)
            elif member.path is None:
                yield member.size, _bytes_reader(member.data)
            else:
                yield member.size, _file_reader(member)
            if member.padding:
                yield member.padding, _bytes_reader(b"\0" * member.padding)
        yield len(_END), _bytes_reader(_END)


def _bytes_reader(data: bytes):
    def read(skip: int, upto: int) -> Iterator[bytes]:
        yield data[skip:upto]

    return read


def _file_reader(member: _Member):
    def read(skip: int, upto: int) -> Iterator[bytes]:
        offset = skip
        while offset < upto:
            chunk = _read_chunk(member, offset, min(_CHUNK, upto - offset))
            offset += len(chunk)
            yield chunk

    return read


def _object_reader(store: ObjectStore, info: ObjectInfo):
    def read(skip: int, upto: int) -> Iterator[bytes]:
        with store.open_read(info.key, skip, upto - skip) as stream:
            if stream.info.size != info.size:  # its header holds another object's size
                raise OSError(f"'{info.key}' was replaced while the archive streamed")
            sent = 0
            for chunk in stream:
                sent += len(chunk)
                yield chunk
        if sent != upto - skip:
            raise OSError(f"'{info.key}' ended {upto - skip - sent} bytes early")

    return read


def _read_chunk(member: _Member, offset: int, size: int) -> bytes:
    with member.path.open("rb") as handle:
        stat = os.fstat(handle.fileno())
        if (stat.st_dev, stat.st_ino) != member.inode:  # its header holds another file's size
            raise OSError(f"{member.path} was replaced while the archive streamed")
        handle.seek(offset)
        chunk = handle.read(size)
    if not chunk:  # the file shrank under us: the archive cannot be completed honestly
        raise OSError(f"{member.path} ended {member.size - offset} bytes early")
    return chunk


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
