"""Answers that carry specs, written as JSON text around each spec's stored text
(:mod:`api.store.spec_pages`): a spec is never parsed or encoded again on its way out, so
reading one costs a copy of its bytes, not tens of milliseconds holding the interpreter. The
rest of each job is the schema's own JSON, so the answer is what ``JobRead`` would give."""

from __future__ import annotations

import json
import secrets

from api.schemas.jobs import JobRead

# Dumped in the spec's place, then replaced by the spec's text. Its quotes would be escaped
# inside any string of the job, and the token is this process's own, so it matches only there.
_MARK = {"grpo-spec-placeholder": secrets.token_hex(16)}
_MARK_TEXT = json.dumps(_MARK, separators=(",", ":"))


def job_json(job: JobRead, spec: str | None) -> str:
    """``job``'s JSON with ``spec`` (JSON text; None: null) as its spec."""
    if spec is None:
        return job.model_copy(update={"spec": None}).model_dump_json()
    text = job.model_copy(update={"spec": _MARK}).model_dump_json()
    return text.replace(f'"spec":{_MARK_TEXT}', f'"spec":{spec}', 1)


def page_json(jobs: list[JobRead], specs: dict[int, str], next_after: int | None) -> str:
    """A :class:`~api.schemas.jobs.Page` (``items``, ``next_after``) of jobs, each with its spec
    from ``specs``."""
    items = ",".join(job_json(job, specs.get(job.id)) for job in jobs)
    return f'{{"items":[{items}],"next_after":{json.dumps(next_after)}}}'
