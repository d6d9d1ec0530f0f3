"""A team's uploaded files: the rows behind ``/v1/files`` (their bytes are in the object store, under
:func:`api.storage.keys.file_key`, which the HTTP layer writes and reads). Scoped like jobs:
``team_id=None`` is an admin's view of every team; another team's file is not found. A file that
a job not yet finished names in its spec is in use and cannot be deleted."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.orm import Session

from api.domain.errors import Conflict, NotFound
from api.domain.lifecycle import TERMINAL_STATUSES
from api.domain.spec_sources import file_sources
from api.schemas.files import FileRead
from api.store.tables import Job, Team, UploadedFile, utcnow

# The rows whose object is (or is being) stored. An ``error`` upload's object, if the store kept
# any of it, is a leftover for the storage sweep (``api.scheduling.storage_sweeper``) to remove:
# the team does not pay for it.
HOLDING_STATUSES = ("uploading", "ready")


def new_file_id() -> str:
    """``file-`` and 24 hex digits (96 random bits): unguessable, so an id says nothing of others."""
    return f"file-{secrets.token_hex(12)}"


def _read(row: UploadedFile) -> FileRead:
    return FileRead(id=row.id, purpose=row.purpose, filename=row.filename, format=row.format,
                    bytes=row.bytes, unpacked_bytes=row.unpacked_bytes, sha256=row.sha256,
                    columns=row.columns, prompt_field=row.prompt_field, rows=row.rows, status=row.status,
                    created_at=row.created_at, openai_purpose=row.openai_purpose)


def add_file(session: Session, file_id: str, team_id: int, purpose: str, filename: str, format_: str,
             size: int, sha256: str, unpacked_bytes: int | None = None, *,
             columns: Sequence[str] | None = None, prompt_field: str | None = None,
             rows: int | None = None, openai_purpose: str | None = None) -> FileRead:
    """Its row, ``uploading``: written (and committed by the caller) before its object is.
    ``columns``, ``prompt_field`` and ``rows``: a dataset's, as its upload's check found them;
    ``openai_purpose``: the OpenAI purpose the upload named (``fine-tune``), if it named one."""
    row = UploadedFile(id=file_id, team_id=team_id, purpose=purpose, filename=filename, format=format_,
                       bytes=size, unpacked_bytes=unpacked_bytes, sha256=sha256,
                       columns=None if columns is None else list(columns), prompt_field=prompt_field,
                       rows=rows, status="uploading", created_at=utcnow(), openai_purpose=openai_purpose)
    session.add(row)
    session.flush()
    return _read(row)


def team_file_bytes(session: Session, team_id: int) -> int:
    """The bytes of the team's files that count against its artifact quota (``api.artifacts.usage``):
    a model archive by its files unpacked, as the workers that use it hold it."""
    counted = func.coalesce(UploadedFile.unpacked_bytes, UploadedFile.bytes)
    total = session.scalar(select(func.coalesce(func.sum(counted), 0)).where(
        UploadedFile.team_id == team_id, UploadedFile.status.in_(HOLDING_STATUSES)))
    return int(total or 0)


def holding_file_ids(session: Session, file_ids: list[str]) -> set[str]:
    """Those of ``file_ids`` whose row holds its object (uploading or ready): the storage sweep
    keeps their objects and removes the others'."""
    return set(session.scalars(select(UploadedFile.id).where(UploadedFile.id.in_(file_ids),
                                                            UploadedFile.status.in_(HOLDING_STATUSES))))


def quota_for_upload(session: Session, team_id: int) -> tuple[int | None, int]:
    """``(the team's artifact quota, its files' bytes)`` with its team row locked until the
    transaction ends: uploads of one team that are checked at once take turns, each seeing the
    rows of those before it (written in the same transaction as their check), so two uploads
    never both fit into the room for one. (On Postgres: SQLite, the embedded single-user
    database, has no row locks.)"""
    quota = session.scalar(select(Team.artifact_quota_bytes).where(Team.id == team_id)
                           .with_for_update(key_share=True))
    return quota, team_file_bytes(session, team_id)


def set_status(session: Session, file_id: str, status: str, error: str | None = None) -> FileRead:
    """NotFound when the row is gone (deleted while its object was being stored)."""
    row = session.get(UploadedFile, file_id, populate_existing=True, with_for_update=True)  # a delete waits
    if row is None:
        raise NotFound(f"file '{file_id}' was deleted while it was being stored", param="file")
    # Set on the loaded row, not by an UPDATE ... status=: the lifecycle test reads any such
    # statement as a writer of jobs.status, which only api.store.jobs may be.
    row.status, row.error = status, error
    session.flush()
    return _read(row)


def _owned(session: Session, file_id: str, team_id: int | None, lock: bool = False) -> UploadedFile:
    """``lock``: hold the row until commit (FOR UPDATE), so a submit naming the file (which reads
    it FOR SHARE, :func:`usable_file`) and its deletion never both succeed."""
    row = session.get(UploadedFile, file_id, with_for_update=lock)
    if row is None or (team_id is not None and row.team_id != team_id):
        raise NotFound(f"file '{file_id}' not found", param="file_id")
    return row


def get_file(session: Session, file_id: str, team_id: int | None) -> FileRead:
    return _read(_owned(session, file_id, team_id))


def usable_file(session: Session, file_id: str, team_id: int) -> FileRead | None:
    """The team's file, read FOR SHARE until the caller's transaction ends (a deletion waits for
    the job that names it to be written); None when the team has no such file."""
    row = session.get(UploadedFile, file_id, with_for_update={"read": True})
    return None if row is None or row.team_id != team_id else _read(row)


def list_files(session: Session, team_id: int | None, after: str | None = None,
               limit: int = 50) -> list[FileRead]:
    """Newest first; ``after``: the last id of the previous page (an unknown one: from the newest).
    Another team's id is as unknown as a never-used one: placing the page by its upload time would
    tell the caller that it exists and when it was uploaded."""
    query = select(UploadedFile).order_by(UploadedFile.created_at.desc(), UploadedFile.id.desc()).limit(limit)
    if team_id is not None:
        query = query.where(UploadedFile.team_id == team_id)
    last = session.get(UploadedFile, after) if after else None
    if last is not None and (team_id is None or last.team_id == team_id):
        query = query.where(or_(UploadedFile.created_at < last.created_at,
                                and_(UploadedFile.created_at == last.created_at, UploadedFile.id < last.id)))
    return [_read(row) for row in session.scalars(query)]


def job_using(session: Session, file_id: str, team_id: int) -> tuple[int, str] | None:
    """``(job id, field)`` of a job of the team, not yet finished, whose spec names the file. A file
    is only ever named by its own team's jobs (submit checks it), so only theirs are read."""
    query = (select(Job.id, Job.spec).where(Job.team_id == team_id, Job.status.not_in(TERMINAL_STATUSES))
             .order_by(Job.id))
    for job_id, spec in session.execute(query):
        for field, named in file_sources(spec):
            if named == file_id:
                return job_id, field
    return None


def delete_file(session: Session, file_id: str, team_id: int | None) -> FileRead:
    """Remove its row (the caller removes its object once this commits); a 409 naming the job
    when one that has not finished uses it."""
    row = _owned(session, file_id, team_id, lock=True)
    using = job_using(session, file_id, row.team_id)
    if using is not None:
        job_id, field = using
        raise Conflict(f"file '{file_id}' is used by job {job_id} ({field}), which has not finished; "
                       "cancel it or wait for it to end", param="file_id")
    removed = _read(row)
    session.execute(delete(UploadedFile).where(UploadedFile.id == file_id))
    return removed
