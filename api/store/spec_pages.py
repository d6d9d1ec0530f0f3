"""Specs for a page of job summaries, within a byte budget. A spec may be a megabyte of inline
rows, and a page of a hundred of them took a hundred megabytes to read and several times that as
Python objects: the sizes are asked of the database first (as stored JSON, without loading any
spec), and only the specs of the page's first jobs that fit the budget are read."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement

from api.schemas.jobs import JobRead
from api.store.models import Job


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


def with_specs(session: Session, jobs: list[JobRead], budget: int) -> list[JobRead]:
    """The longest head of ``jobs`` whose specs add up to at most ``budget`` bytes (always the
    first job, so a reader paging on ``next_after`` gets past a spec larger than the budget),
    each with its spec."""
    if not jobs:
        return []
    ids = [job.id for job in jobs]
    sizes = dict(session.execute(select(Job.id, _stored_bytes(Job.spec)).where(Job.id.in_(ids))).all())
    total, kept = 0, []
    for job in jobs:
        total += sizes.get(job.id) or 0
        if kept and total > budget:
            break
        kept.append(job.id)
    specs = dict(session.execute(select(Job.id, Job.spec).where(Job.id.in_(kept))).all())
    return [job.model_copy(update={"spec": specs.get(job.id)}) for job in jobs[: len(kept)]]
