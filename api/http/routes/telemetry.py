"""A job's training signals from SQL, the system of record: events, per-step metrics, sample
completions and checkpoints. (The live view of the same is ``WS /v1/jobs/{id}/stream``.)"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.http.deps import PrincipalDep, SessionDep
from api.http.params import MAX_METRIC_NAMES, JobId, id_cursor, step_cursor
from api.http.views import checkpoints_for, events_for
from api.schemas.jobs import CheckpointRead, EventRead, MetricRead, Page, SamplesRead
from api.store import jobs as job_store
from api.store import telemetry
from api.vocabulary import BEFORE_FIRST_STEP

router = APIRouter(prefix="/jobs/{job_id}", tags=["telemetry"])
_NAMES_HELP = "Only these metrics (repeat, or comma-separated); `step` is always kept"
_SAMPLE_STEP_HELP = "Only this step's samples (0: the evaluation before training)"
_ERRORS = {401: {"description": "Missing or wrong bearer token"}, 404: {"description": "No such job"}}


@router.get("/events", response_model=Page[EventRead], responses=_ERRORS)
def list_events(job_id: JobId, session: SessionDep, principal: PrincipalDep,
                after: Annotated[int, *id_cursor("Cursor: an event id")] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Page[EventRead]:
    """Lifecycle events in order; pass ``next_after`` back as ``after`` for the next page."""
    job_store.get_job(session, job_id, principal.scope)
    items = telemetry.list_events(session, job_id, after, limit + 1)
    return Page[EventRead](items=events_for(principal, items[:limit]),
                           next_after=items[limit - 1].id if len(items) > limit else None)


@router.get("/metrics", response_model=Page[MetricRead], responses=_ERRORS)
def list_metrics(job_id: JobId, session: SessionDep, principal: PrincipalDep,
                 after_step: Annotated[int, *step_cursor("Only steps after this one")] = BEFORE_FIRST_STEP,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
                 names: Annotated[list[str] | None,
                                  Query(description=_NAMES_HELP, max_length=MAX_METRIC_NAMES)] = None,
                 ) -> Page[MetricRead]:
    """One record per optimizer step (steps count from 1; step 0, when present, is the
    evaluation before training), in step order; ``next_after`` is the ``after_step`` of the
    next page."""
    job_store.get_job(session, job_id, principal.scope)
    wanted = {name.strip() for value in names or [] for name in value.split(",") if name.strip()} or None
    items = telemetry.list_metrics(session, job_id, after_step, limit + 1, wanted)
    return Page[MetricRead](items=items[:limit],
                            next_after=items[limit - 1].step if len(items) > limit else None)


@router.get("/samples", response_model=Page[SamplesRead], responses=_ERRORS)
def list_samples(job_id: JobId, session: SessionDep, principal: PrincipalDep,
                 step: Annotated[int | None, *step_cursor(_SAMPLE_STEP_HELP, ge=0)] = None,
                 limit: Annotated[int, Query(ge=1, le=100)] = 20) -> Page[SamplesRead]:
    """Sample completions (kept every ``log_completions_every`` steps), newest step first."""
    job_store.get_job(session, job_id, principal.scope)
    return Page[SamplesRead](items=telemetry.list_samples(session, job_id, step, limit), next_after=None)


@router.get("/checkpoints", response_model=Page[CheckpointRead], responses=_ERRORS)
def list_checkpoints(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> Page[CheckpointRead]:
    """Every checkpoint the job saved, by step."""
    job_store.get_job(session, job_id, principal.scope)
    items = checkpoints_for(principal, telemetry.list_checkpoints(session, job_id))
    return Page[CheckpointRead](items=items, next_after=None)
