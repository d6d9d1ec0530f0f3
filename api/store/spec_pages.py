"""Jobs with their specs as stored: the JSON text, never parsed. A spec may be a megabyte of
inline rows; parsing it into Python objects and encoding it again for the answer took tens of
milliseconds holding the interpreter (every other request waited) and several times its size in
memory. :mod:`api.http.job_json` splices the text into the answer instead.

A page of a hundred such specs took a hundred megabytes: the sizes are asked of the database
first (without reading any spec), and only the specs of the page's first jobs that fit the
budget are read."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, Text, cast, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, defer
from sqlalchemy.sql.functions import FunctionElement

from api.domain.errors import NotFound
from api.schemas.jobs import JobRead
from api.store._rows import job_read
from api.store.tables import Job

StoredSpecs = dict[int, str]  # job id -> its spec's JSON text as stored


class _stored_bytes(FunctionElement[int]):  # noqa: N801 - a SQL function, named like one
    """Bytes of a JSON column's stored text (a cheap length, not a re-serialisation)."""

    type = Integer()
    inherit_cache = True


@compiles(_stored_bytes)
def _default_bytes(element: Any, compiler: Any, **kw: Any) -> str:
    return f"length(CAST({compiler.process(element.clauses, **kw)} AS TEXT))"


@compiles(_stored_bytes, "postgresql")
def _postgres_bytes(element: Any, compiler: Any, **kw: Any) -> str:
    return f"octet_length(CAST({compiler.process(element.clauses, **kw)} AS TEXT))"


@compiles(_stored_bytes, "sqlite")
def _sqlite_bytes(element: Any, compiler: Any, **kw: Any) -> str:
    return f"length(CAST({compiler.process(element.clauses, **kw)} AS BLOB))"


def _stored(session: Session, ids: list[int]) -> StoredSpecs:
    return dict(session.execute(select(Job.id, cast(Job.spec, Text)).where(Job.id.in_(ids))).all())


def with_specs(session: Session, jobs: list[JobRead], budget: int) -> tuple[list[JobRead], StoredSpecs]:
    """The longest head of ``jobs`` whose specs add up to at most ``budget`` bytes (always the
    first job, so a reader paging on ``next_after`` gets past a spec larger than the budget),
    and those jobs' specs."""
    if not jobs:
        return [], {}
    ids = [job.id for job in jobs]
    sizes = dict(session.execute(select(Job.id, _stored_bytes(Job.spec)).where(Job.id.in_(ids))).all())
    total, kept = 0, 0
    for job in jobs:
        total += sizes.get(job.id) or 0
        if kept and total > budget:
            break
        kept += 1
    return jobs[:kept], _stored(session, ids[:kept])


def job_with_spec(session: Session, job_id: int, team_id: int | None, *,
                  traceback: bool = False) -> tuple[JobRead, str]:
    """The job (``spec`` left null) and its spec's stored JSON; scoped as
    :func:`api.store.jobs.get_job`."""
    query = select(Job).where(Job.id == job_id).options(defer(Job.spec, raiseload=True))
    job = session.scalars(query).first()
    if job is None or job.deleted_at is not None or (team_id is not None and job.team_id != team_id):
        raise NotFound(f"job {job_id} not found", param="job_id")
    return job_read(job, traceback=traceback, spec=False), _stored(session, [job_id])[job_id]
