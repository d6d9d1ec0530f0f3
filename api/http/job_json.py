"""Answers that carry specs, written as JSON text around each spec's stored text
(:mod:`api.store.spec_pages`): a spec is never parsed or encoded again on its way out, so
reading one costs a copy of its bytes, not tens of milliseconds holding the interpreter. The
rest of each job is the schema's own JSON, so the answer is what ``JobRead`` would give."""

from __future__ import annotations

import json

from api.schemas.jobs import JobRead

# ``spec`` is JobRead's last field: a job dumped without it ends so.
_NO_SPEC = ',"spec":null}'


def job_json(job: JobRead, spec: str | None) -> str:
    """``job``'s JSON with ``spec`` (JSON text; None: null) as its spec."""
    text = job.model_copy(update={"spec": None}).model_dump_json()
    if not text.endswith(_NO_SPEC):
        raise RuntimeError("JobRead.spec must stay the schema's last field")
    return text if spec is None else f'{text[: -len(_NO_SPEC)]},"spec":{spec}}}'


def page_json(jobs: list[JobRead], specs: dict[int, str], next_after: int | None) -> str:
    """A :class:`~api.schemas.jobs.Page` (``items``, ``next_after``) of jobs, each with its spec
    from ``specs``."""
    items = ",".join(job_json(job, specs.get(job.id)) for job in jobs)
    return f'{{"items":[{items}],"next_after":{json.dumps(next_after)}}}'
