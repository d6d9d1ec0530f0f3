"""An upload's body (``POST /v1/files``, ``multipart/form-data``) read as it streams in: the
``file`` part goes to a spool file on local disk, hashed and counted on the way, and is refused
(413) the moment it passes its purpose's limit; the small text fields (``purpose``,
``prompt_field``) are kept. Nothing holds the body in memory: python-multipart's push parser sees
one network chunk at a time, and file bytes are hashed and written from the threadpool about a
MiB at a time. An upload costs one write of the team's rate limit whatever its size: its size is
bounded by the purpose's limit instead. The spool file is the upload's one local copy, read by
the checks and then stored; the caller removes it (:meth:`SpooledUpload.discard`) whatever
happens. The body must keep a minimum pace (:class:`~api.http.upload_admission.UploadPace`: a
408 past it); a client that goes away mid-body is one log line, not a traceback. A spool disk
that fills up (ENOSPC, or a quota's EDQUOT) is a 503 ``spool_full``, its
spool file removed: the service's condition, which clears as the uploads in flight end."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from api.domain.errors import ClientGone, InvalidInput, SpoolFull, TooLarge
from api.http.input_guard import text_problem
from api.http.upload_admission import UploadPace
from api.settings import Settings

# The routes whose bodies stream here, past the general body-size guard (api.http.error_responses).
UPLOAD_ROUTES = frozenset({("POST", "/v1/files")})
TEXT_FIELDS = ("purpose", "prompt_field")
MAX_TEXT_FIELD_BYTES = 256
MAX_FILENAME_BYTES = 255
_FLUSH_BYTES = 1024 * 1024
# Room for what a multipart body carries besides its file: boundaries, part headers, text fields.
MULTIPART_SLACK_BYTES = 64 * 1024
SPOOL_RETRY_SECONDS = 30
log = logging.getLogger(__name__)


@dataclass
class SpooledUpload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    path: Path | None = None  # the spool file, once the file part began
    size: int = 0
    sha256: str = ""

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class _Reader:
    """The parser's callbacks: which part is open, and where its bytes go."""

    def __init__(self, settings: Settings, upload: SpooledUpload,
                 check_size: Callable[[int], None] | None) -> None:
        self.settings, self.upload, self.check_size = settings, upload, check_size
        self.headers: dict[bytes, bytes] = {}
        self.header_field = self.header_value = b""
        self.part: str | None = None
        self.text = bytearray()
        self.spool: IO[bytes] | None = None
        self.digest = hashlib.sha256()
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def on_part_begin(self) -> None:
        self.headers, self.text, self.part = {}, bytearray(), None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self.header_field.lower()] = self.header_value
        self.header_field = self.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == "file":
            self._open_file(options.get(b"filename"))
        elif name not in TEXT_FIELDS:
            raise InvalidInput(f"unknown form field '{name[:40]}'; an upload has 'file', 'purpose' and "
                               "optionally 'prompt_field'", param=name[:40] or "body")
        elif name in self.upload.fields:
            raise InvalidInput(f"'{name}' is given twice", param=name)
        self.part = name

    def _open_file(self, raw_name: bytes | None) -> None:
        if self.upload.path is not None:
            raise InvalidInput("one file per upload", param="file")
        filename = (raw_name or b"").decode("utf-8", "replace").replace("\\", "/").rsplit("/", 1)[-1]
        if not filename or len(filename.encode()) > MAX_FILENAME_BYTES or not filename.isprintable():
            raise InvalidInput(f"the file part needs a file name of 1-{MAX_FILENAME_BYTES} printable bytes",
                               param="file")
        self.upload.filename = filename
        with _spool_errors():
            handle, name = tempfile.mkstemp(prefix="grpo-upload-", dir=self.settings.upload_spool_dir)
        self.upload.path = Path(name)
        self.spool = os.fdopen(handle, "wb")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.part != "file":
            self.text += chunk
            if len(self.text) > MAX_TEXT_FIELD_BYTES:
                raise InvalidInput(f"'{self.part}' is longer than {MAX_TEXT_FIELD_BYTES} bytes",
                                   param=self.part)
            return
        self.upload.size += len(chunk)
        limit = self.settings.max_upload_bytes(self.upload.fields.get("purpose"))
        if self.upload.size > limit:
            raise TooLarge(f"the file is larger than this service accepts ({limit} bytes for "
                           f"{self.upload.fields.get('purpose') or 'any purpose'})", param="file")
        if self.check_size is not None:
            self.check_size(self.upload.size)
        self.pending.append(bytes(chunk))
        self.pending_bytes += len(chunk)

    def on_part_end(self) -> None:
        if self.part in TEXT_FIELDS:
            try:
                text = self.text.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise InvalidInput(f"'{self.part}' is not UTF-8 text", param=self.part) from None
            if reason := text_problem(text):  # the input guard's rule; this body streams past it
                raise InvalidInput(f"{self.part}: {reason}", param=self.part)
            self.upload.fields[self.part] = text

    def write_pending(self) -> None:
        """Hash and write what the parser gave so far (from the threadpool, in order: one call at
        a time), so neither the digest nor the disk holds up the event loop."""
        chunks, self.pending, self.pending_bytes = self.pending, [], 0
        if self.spool is not None:
            for chunk in chunks:
                self.digest.update(chunk)
            with _spool_errors():
                self.spool.writelines(chunks)

    def close(self) -> None:
        """Flush and close the spool file (SpoolFull when the disk is full); once only."""
        spool, self.spool = self.spool, None
        if spool is not None:
            with _spool_errors():
                spool.close()  # the file is closed even when its flush fails

    def abandon(self) -> None:
        """Close the spool file of an upload that failed, whatever its flush says: it is removed."""
        try:
            self.close()
        except SpoolFull:
            pass

    def callbacks(self) -> dict:
        return {name: getattr(self, name) for name in (
            "on_part_begin", "on_part_data", "on_part_end", "on_header_field", "on_header_value",
            "on_header_end", "on_headers_finished")}


@contextmanager
def _spool_errors() -> Iterator[None]:
    """A full spool disk as SpoolFull; any other OSError as it is (a fault, not a condition)."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise SpoolFull("the API host's disk for uploads in flight is full; nothing was kept. "
                        f"Retry in {SPOOL_RETRY_SECONDS} s, once other uploads have ended",
                        retry_after=SPOOL_RETRY_SECONDS, param="file") from error


def _boundary(request: Request) -> bytes:
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidInput("an upload is a multipart/form-data body with 'file' and 'purpose'", param="body")
    return boundary


def declared_bytes(request: Request) -> int | None:
    """The body's size by its Content-Length (None: chunked, or not a number)."""
    declared = request.headers.get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else None


async def receive_upload(request: Request, settings: Settings,
                         check_size: Callable[[int], None] | None = None) -> SpooledUpload:
    """The upload spooled and its fields read; the caller discards it once done with it.
    ``check_size`` sees the file's size as each chunk arrives, and may refuse it (a quota)."""
    declared = declared_bytes(request)
    most = settings.max_upload_bytes(None)
    if declared is not None and declared > most + MULTIPART_SLACK_BYTES:
        raise TooLarge(f"the body is larger than this service accepts ({most} bytes)", param="file")
    upload = SpooledUpload()
    reader = _Reader(settings, upload, check_size)
    parser = MultipartParser(_boundary(request), reader.callbacks())
    pace = UploadPace(settings.upload_min_bytes_per_second, settings.upload_grace_seconds)
    try:
        async for chunk in _paced(request, pace):
            parser.write(chunk)
            if reader.pending_bytes >= _FLUSH_BYTES:
                await run_in_threadpool(reader.write_pending)
        parser.finalize()
        await run_in_threadpool(reader.write_pending)
        await run_in_threadpool(reader.close)  # its last flush may find the disk full too
    except MultipartParseError as error:
        await run_in_threadpool(_abandon, reader, upload)
        raise InvalidInput(f"the multipart body is malformed: {error}", param="body") from None
    except ClientDisconnect:  # the client's doing, not a fault: one line, no traceback
        await run_in_threadpool(_abandon, reader, upload)
        log.warning("an upload's client went away after %d bytes; nothing was kept", pace.received)
        raise ClientGone("the client closed its connection mid-upload", param="file") from None
    except BaseException:
        await run_in_threadpool(_abandon, reader, upload)
        raise
    if upload.path is None:
        raise InvalidInput("the upload has no 'file' part", param="file")
    upload.sha256 = reader.digest.hexdigest()
    return upload


async def _paced(request: Request, pace: UploadPace) -> AsyncIterator[bytes]:
    """The body's chunks, each awaited no longer than ``pace`` allows; TooSlow past it."""
    chunks = request.stream().__aiter__()
    while True:
        try:
            async with asyncio.timeout(max(pace.seconds_left(), 0)):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise pace.too_slow() from None
        pace.received += len(chunk)
        yield chunk


def _abandon(reader: _Reader, upload: SpooledUpload) -> None:
    reader.abandon()
    upload.discard()
