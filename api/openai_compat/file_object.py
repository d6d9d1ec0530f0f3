"""An upload made with OpenAI's ``purpose=fine-tune`` as OpenAI's file object. Such a file is a
dataset like any other (its ``purpose`` is ``dataset`` to the submit's checks, the worker and
``GET /v1/files``), its rows checked at upload with ``messages`` as their prompt column, as
OpenAI's reinforcement fine-tuning JSONL has it; only the answers about it (``POST /v1/files``,
``GET`` and ``DELETE /v1/files/{id}``) take OpenAI's shapes, with this service's fields that do not
clash beside them. Our own purposes answer as they always did."""

from __future__ import annotations

from typing import Literal

from api.openai_compat.job_object import unix
from api.schemas.files import FileRead
from api.schemas.fine_tuning import OpenAIFile, OpenAIFileDeleted

FINE_TUNE = "fine-tune"
# An OpenAI purpose -> what this service stores the file as, and the prompt column its rows hold.
OPENAI_PURPOSES = {FINE_TUNE: ("dataset", "messages")}
STATUSES: dict[str, Literal["uploaded", "processed", "error"]] = {
    "uploading": "uploaded", "ready": "processed", "error": "error"}


def file_object(found: FileRead) -> OpenAIFile:
    assert found.openai_purpose == FINE_TUNE
    return OpenAIFile(id=found.id, bytes=found.bytes, created_at=unix(found.created_at),
                      filename=found.filename, status=STATUSES[found.status], format=found.format,
                      sha256=found.sha256, columns=found.columns, prompt_field=found.prompt_field,
                      rows=found.rows)


def file_answer(found: FileRead) -> FileRead | OpenAIFile:
    """What a read of the file answers: OpenAI's file object for an OpenAI upload, else ours."""
    return file_object(found) if found.openai_purpose == FINE_TUNE else found


def deleted_answer(removed: FileRead) -> FileRead | OpenAIFileDeleted:
    """What a deletion answers: OpenAI's ``{id, object, deleted}`` for an OpenAI upload (its
    client reads that), else the file as it was, as ours always did."""
    return OpenAIFileDeleted(id=removed.id) if removed.openai_purpose == FINE_TUNE else removed
