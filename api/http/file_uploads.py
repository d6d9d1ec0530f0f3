"""What ``POST /v1/files`` does with a spooled upload (:mod:`api.http.upload_body`), from the
threadpool since every step blocks: check its fields and its content (:mod:`api.uploads`), write
its row (``uploading``) once it fits in the team's artifact quota, store its bytes under
``files/{id}``, then mark it ``ready``. The row comes first so that no object is ever in the store
without one; an upload the store refused stays as ``error`` (503 to the client, who may delete it
and retry). Before the body is read, an upload whose Content-Length alone would pass the quota is
refused, and one that declares no length (chunked) is stopped as its spooled bytes pass it
(:func:`refuse_hopeless`), so a hopeless upload never takes the spool disk."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from api.artifacts.usage import ArtifactUsage, job_artifact_bytes
from api.domain.errors import InvalidInput, NotFound, QuotaExceeded, TooLarge, Unavailable
from api.http.upload_body import MULTIPART_SLACK_BYTES, SpooledUpload
from api.openai_compat.file_object import OPENAI_PURPOSES
from api.schemas.files import FileRead
from api.settings import Settings
from api.storage import ObjectNotFound, ObjectStore, StorageError, StorageUnavailable
from api.storage.keys import file_key
from api.store import files, teams
from api.store.db import session_scope
from api.uploads.datasets import check_dataset, dataset_format
from api.uploads.model_archives import check_model_archive

PURPOSES = ("dataset", "model")
MAX_PROMPT_FIELD_LENGTH = 128  # as DatasetSpec.prompt_field
STORE_RETRY_SECONDS = 10
log = logging.getLogger(__name__)


class Checked(NamedTuple):
    """What an upload's checks found: its format; a model's unpacked size; a dataset's columns
    (None: too many to record), the prompt field its rows were checked with and their count."""

    format: str
    unpacked_bytes: int | None = None
    columns: tuple[str, ...] | None = None
    prompt_field: str | None = None
    rows: int | None = None


def _checked(upload: SpooledUpload, purpose: str, settings: Settings, quota_room: int | None,
             default_prompt_field: str = "prompt") -> Checked:
    """The upload's format, and what its purpose records, once its content passed its checks."""
    assert upload.path is not None and upload.filename is not None  # receive_upload saw a file part
    limit = settings.max_upload_bytes(purpose)
    if upload.size > limit:  # the purpose came after the file, so the larger limit applied meanwhile
        raise TooLarge(f"the file is larger than this service accepts ({limit} bytes for {purpose})",
                       param="file")
    prompt_field = upload.fields.get("prompt_field")
    if purpose == "model":
        if prompt_field is not None:
            raise InvalidInput("'prompt_field' belongs to a dataset upload", param="prompt_field")
        archive = check_model_archive(upload.path, settings.upload_max_unpacked_bytes, quota_room)
        return Checked("tar", unpacked_bytes=archive.unpacked_bytes)
    if prompt_field is not None and not 1 <= len(prompt_field) <= MAX_PROMPT_FIELD_LENGTH:
        raise InvalidInput(f"'prompt_field' is 1-{MAX_PROMPT_FIELD_LENGTH} characters", param="prompt_field")
    file_format = dataset_format(upload.filename)
    # The field the rows were checked with is recorded, the default too: a spec naming the file
    # without its own prompt_field gets it (api.http.submission.with_dataset_files).
    prompt_field = prompt_field or default_prompt_field
    rows = check_dataset(upload.path, file_format, prompt_field)
    return Checked(file_format, columns=rows.columns, prompt_field=prompt_field, rows=rows.count)


def accept_upload(upload: SpooledUpload, team_id: int, settings: Settings, store: ObjectStore) -> FileRead:
    """Check, record and store the upload; its row as stored (``ready``)."""
    purpose = upload.fields.get("purpose")
    # OpenAI's purpose (its client's files.create): a dataset whose rows hold their prompt as
    # `messages`, answered in OpenAI's shape (api.openai_compat.file_object).
    openai_purpose = purpose if purpose in OPENAI_PURPOSES else None
    purpose, default_prompt_field = OPENAI_PURPOSES.get(purpose or "", (purpose, "prompt"))
    if purpose not in PURPOSES:
        raise InvalidInput("'purpose' is 'dataset' or 'model' (or OpenAI's 'fine-tune', a dataset)",
                           param="purpose")
    job_bytes = _job_bytes_if_limited(team_id, settings)
    # A first look at the room left (unlocked), so that a model's check stops at the header that
    # passes it; the exact check below, under the quota's lock, counts uploads finished meanwhile.
    room = None if job_bytes is None else _usage_now(team_id, settings, job_bytes).room
    checked = _checked(upload, purpose, settings, room, default_prompt_field)
    assert upload.path is not None and upload.filename is not None
    unpacked = checked.unpacked_bytes
    charged = upload.size if unpacked is None else unpacked  # a model counts unpacked
    file_id = files.new_file_id()
    with session_scope(settings.database_url) as session:
        quota, file_bytes = files.quota_for_upload(session, team_id)
        usage = ArtifactUsage(job_bytes or 0, file_bytes, quota if job_bytes is not None else None)
        if usage.over_quota(charged):
            what = f"this upload ({upload.size} bytes)" if unpacked is None else \
                f"this model ({unpacked} bytes unpacked)"
            raise _refusal(usage, charged, what)
        files.add_file(session, file_id, team_id, purpose, upload.filename, checked.format, upload.size,
                       upload.sha256, unpacked, columns=checked.columns, prompt_field=checked.prompt_field,
                       rows=checked.rows, openai_purpose=openai_purpose)
    try:
        stored = store.put_file(file_key(file_id), upload.path)
        if stored.sha256 != upload.sha256 or stored.size != upload.size:
            raise StorageError(f"the stored copy of {file_id} differs from the upload")
    except StorageError as error:
        log.warning("file %s was checked but could not be stored: %s", file_id, error)
        with session_scope(settings.database_url) as session:
            files.set_status(session, file_id, "error", str(error))
        why = "could not be reached" if isinstance(error, StorageUnavailable) else "refused it"
        raise Unavailable(f"the upload was checked but the object store {why}; {file_id} is left as "
                          "'error': delete it and upload again", retry_after=STORE_RETRY_SECONDS,
                          param="file") from error
    try:
        with session_scope(settings.database_url) as session:
            return files.set_status(session, file_id, "ready")
    except NotFound:  # deleted meanwhile: its object must not outlive its row
        remove_object(store, file_id)
        raise


def refuse_hopeless(team_id: int, settings: Settings, declared: int | None) -> Callable[[int], None] | None:
    """Before the body is read: 413 when the file it declares (its Content-Length less what a
    multipart body carries besides the file) alone would pass the team's quota. For a body that
    declares no length (chunked), the same check of the file's bytes as they are spooled (None:
    no such check is needed; a declared length bounds the file within the multipart slack). The
    exact check after spooling stays: others may upload meanwhile."""
    job_bytes = _job_bytes_if_limited(team_id, settings)
    if job_bytes is None:
        return None
    usage = _usage_now(team_id, settings, job_bytes)
    at_least = (declared or 0) - MULTIPART_SLACK_BYTES
    if at_least > 0 and usage.over_quota(at_least):
        raise _refusal(usage, at_least, f"this upload (at least {at_least} bytes, by its Content-Length)")
    if declared is not None:
        return None

    def check_spooled(size: int) -> None:
        if usage.over_quota(size):
            raise _refusal(usage, size, f"this upload (already {size} bytes as it arrived)")

    return check_spooled


def _usage_now(team_id: int, settings: Settings, job_bytes: int) -> ArtifactUsage:
    """The team's usage as of now (a look: its lock ends with this short transaction)."""
    with session_scope(settings.database_url) as session:
        quota, file_bytes = files.quota_for_upload(session, team_id)
    return ArtifactUsage(job_bytes, file_bytes, quota)


def _refusal(usage: ArtifactUsage, size: int, what: str) -> QuotaExceeded:
    return QuotaExceeded(
        f"{what} would take the team's artifacts to {usage.total + size} bytes, over its quota of "
        f"{usage.quota} bytes ({usage.parts()} in use); nothing was stored. Delete files (grpo files rm ID) "
        "or finished jobs (grpo rm ID), or ask an admin to raise the quota",
        param="file")


def _job_bytes_if_limited(team_id: int, settings: Settings) -> int | None:
    """The team's job artifact bytes when it has a quota (None when it has none: nothing to
    count). Counted before the quota's lock is taken, since a remote store is listed for it; a
    quota an admin sets meanwhile applies from the next upload."""
    with session_scope(settings.database_url) as session:
        quota, job_ids = teams.artifact_quota(session, team_id)
    if quota is None:
        return None
    try:
        return job_artifact_bytes(settings, job_ids)
    except StorageError as error:
        raise Unavailable(f"the object store could not be listed to check the team's quota ({error}); "
                          "nothing was stored", retry_after=STORE_RETRY_SECONDS) from error


@contextmanager
def storage_errors(file_id: str) -> Iterator[None]:
    """A store that is down is a 503 to retry; a ready file whose object is missing, a 404."""
    try:
        yield
    except ObjectNotFound:
        raise NotFound(f"file '{file_id}' has no stored content", param="file_id") from None
    except StorageError as error:
        raise Unavailable(f"the object store failed ({error})", retry_after=STORE_RETRY_SECONDS) from error


def remove_object(store: ObjectStore, file_id: str) -> None:
    """Its bytes, once its row's deletion committed. A store that fails now leaves them
    unreachable (no row names them), which is logged rather than undoing the deletion."""
    try:
        store.delete(file_key(file_id))
    except StorageError as error:
        log.warning("file %s was deleted but its object could not be: %s", file_id, error)
