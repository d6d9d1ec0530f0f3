"""Jobs as OpenAI's fine-tuning API reads them (:mod:`api.openai_compat`): what a job's OpenAI
create carried beside its spec (``jobs.openai_request``: the method as sent, metadata, suffix),
written in the submit's transaction, and each job with what its ``fine_tuning.job`` object tells:
its team's name, the few fields of its spec the object reads (not the spec itself, which may be
megabytes of inline rows), that stored request and its newest step's ``num_tokens``, for one job
or a page of them in one query. Scoped like :func:`api.store.jobs.get_job`: another team's job is
not found; ``team_id=None`` is an admin's view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, func, select, update
from sqlalchemy.orm import Session, defer

from api.domain.errors import Conflict, NotFound
from api.domain.serve_spec import TRAIN
from api.schemas.fine_tuning import FineTuningJobFacts
from api.store._rows import job_read
from api.store.tables import Job, JobMetric, Team

# The metric a step record counts the tokens trained so far in (docs/architecture.md §5).
TOKENS_METRIC = "num_tokens"


def record_request(session: Session, job_id: int, request: dict[str, Any], created: bool) -> None:
    """Keep ``request`` beside a job its create just wrote (``created``); on an Idempotency-Key's
    replay (not ``created``), a :class:`Conflict` unless the first create kept the same, as a
    replay whose spec differs is (``api.store.jobs.create_job``)."""
    if created:
        session.execute(update(Job).where(Job.id == job_id).values(openai_request=request)
                        .execution_options(synchronize_session=False))
        return
    if session.scalar(select(Job.openai_request).where(Job.id == job_id)) != request:
        raise Conflict("Idempotency-Key was already used with a different request body",
                       param="Idempotency-Key")


def _facts_query(team_id: int | None) -> Select[Any]:
    tokens = JobMetric.payload[TOKENS_METRIC].as_string()
    latest_tokens = (select(tokens).where(JobMetric.job_id == Job.id, tokens.is_not(None))
                     .order_by(JobMetric.step.desc()).limit(1).scalar_subquery())
    query = (select(Job, Team.name, Job.spec[("model", "source")].as_string(),
                    Job.spec[("dataset", "source")].as_string(),
                    Job.spec[("eval_dataset", "source")].as_string(),
                    Job.spec[("eval_dataset", "prompt_field")].as_string(), Job.spec["grpo"],
                    Job.openai_request, latest_tokens)
             .join(Team, Team.id == Job.team_id)
             .where(Job.deleted_at.is_(None))  # a tombstone (api.store.job_deletion)
             .where(Job.kind == TRAIN)  # a serving job (chat with a model) fine-tunes nothing
             .options(defer(Job.spec, raiseload=True)))
    return query if team_id is None else query.where(Job.team_id == team_id)


def _facts(row: Any) -> FineTuningJobFacts:
    job, team, model, dataset, eval_source, eval_prompt_field, grpo, request, tokens = row
    # An eval dataset always has its prompt_field in a stored spec; inline rows have no source.
    eval_dataset = None if eval_source is None and eval_prompt_field is None else {"source": eval_source}
    spec = {"model": {"source": model}, "dataset": {"source": dataset}, "eval_dataset": eval_dataset,
            "grpo": grpo if isinstance(grpo, dict) else {}}
    return FineTuningJobFacts(job=job_read(job, spec=False), organization=team, spec=spec,
                              openai_request=request, trained_tokens=_whole(tokens))


def _whole(raw: object) -> int | None:
    try:
        return None if raw is None or isinstance(raw, bool) else int(float(raw))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None


def job_facts(session: Session, job_id: int, team_id: int | None) -> FineTuningJobFacts:
    row = session.execute(_facts_query(team_id).where(Job.id == job_id)).first()
    if row is None:
        raise NotFound(f"job {job_id} not found", param="fine_tuning_job_id")
    return _facts(row)


def list_job_facts(session: Session, team_id: int | None, after: int = 0, limit: int = 20,
                   metadata: Mapping[str, str] | None = None) -> list[FineTuningJobFacts]:
    """Newest first, below ``after`` (0: from the newest); only jobs whose stored metadata holds
    every pair of ``metadata``."""
    query = _facts_query(team_id).order_by(Job.id.desc()).limit(limit)
    if after:
        query = query.where(Job.id < after)
    dialect = session.get_bind().dialect.name
    for key, value in (metadata or {}).items():
        query = query.where(_holds(dialect, key, value))
    return [_facts(row) for row in session.execute(query)]


def _holds(dialect: str, key: str, value: str) -> ColumnElement[bool]:
    """The job's stored metadata has ``key`` at ``value``. Key and value are bound parameters,
    never spliced into a JSON path: a key may hold any character (``"``, ``.``, ``$``...)."""
    if dialect == "postgresql":
        return func.json_extract_path_text(Job.openai_request, "metadata", key) == value
    pairs = func.json_each(Job.openai_request, "$.metadata").table_valued("key", "value")
    return exists().select_from(pairs).where(pairs.c.key == key, pairs.c.value == value)
