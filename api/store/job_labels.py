"""A job's tags and description (:mod:`api.domain.job_labels`): written at submit and by ``PATCH``, and
the list's filters on them (``GET /v1/jobs?tag=&q=``).

A job's tags live in three places, written together in one transaction: ``jobs.tags`` (their
order, for reads), ``job_tags`` (one row each, indexed, for the filter) and the stored spec (so a
clone carries what the job shows). The description lives in ``jobs.description`` and the spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, delete, exists, insert, or_, select, update
from sqlalchemy.orm import Session

from api.domain.job_labels import unset
from api.store.tables import Job, JobTag


def add_tags(session: Session, job_id: int, tags: Sequence[str]) -> None:
    """The ``job_tags`` rows of a new job (``tags`` distinct, as the spec keeps them)."""
    if tags:
        session.execute(insert(JobTag), [{"job_id": job_id, "tag": tag} for tag in tags])


def set_labels(session: Session, job_id: int, changes: dict[str, Any]) -> None:
    """Change a job's ``tags`` and/or ``description`` (the keys of ``changes``; a description of
    None clears it) in its columns, its ``job_tags`` rows and its stored spec alike. Any status:
    finding a finished job again is what they are for. The caller has checked the job is the
    caller's to change."""
    if not changes:
        return
    spec = session.scalar(select(Job.spec).where(Job.id == job_id))
    columns = {name: changes[name] for name in ("tags", "description") if name in changes}
    # The stored spec as JobSpec would dump it: no tags or no description is no field.
    merged = {**spec, **changes}
    spec = {name: value for name, value in merged.items() if name not in changes or not unset(value)}
    session.execute(update(Job).where(Job.id == job_id).values(**columns, spec=spec)
                    .execution_options(synchronize_session=False))
    if "tags" in changes:
        session.execute(delete(JobTag).where(JobTag.job_id == job_id))
        add_tags(session, job_id, changes["tags"])


def matching(query: Select[Any], tags: Sequence[str] = (), search: str | None = None) -> Select[Any]:
    """``query`` (over ``jobs``) narrowed to the jobs that carry every tag of ``tags`` and, with
    ``search``, whose name or description holds it, ignoring case (ASCII case only on SQLite,
    whose ``lower`` knows no other). ``%`` and ``_`` in ``search`` are plain characters."""
    for tag in dict.fromkeys(tags):
        query = query.where(exists().where(JobTag.job_id == Job.id, JobTag.tag == tag))
    if search:
        query = query.where(or_(Job.name.icontains(search, autoescape=True),
                                Job.description.icontains(search, autoescape=True)))
    return query
