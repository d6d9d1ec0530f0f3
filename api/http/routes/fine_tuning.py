"""``/v1/fine_tuning/jobs``: OpenAI's fine-tuning API (reinforcement method), so code written
against the ``openai`` client (``base_url`` this service's ``/v1``, ``api_key`` a team's key) runs
this service's own jobs. Another door to the same jobs, not a second kind of job: a create goes
through every check and limit of ``POST /v1/jobs`` (:func:`api.http.job_creation.check_and_create`)
and a job made either way is seen both ways (``ftjob-7`` is job 7 of ``/v1/jobs``), cancel, pause
and resume are ``/v1/jobs``' own, and another team's job is a 404. What maps to what is
:mod:`api.openai_compat`'s; what a create carries beside its spec (the method as sent, metadata,
suffix) is kept with the job (:mod:`api.store.openai_jobs`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from sqlalchemy.orm import Session
from starlette.datastructures import State

from api.domain.errors import InvalidInput, NotFound
from api.http.auth import Principal
from api.http.deps import PrincipalDep, SessionDep, SettingsDep
from api.http.job_creation import check_and_create
from api.http.routes import jobs as job_routes
from api.http.spec_intake import intake
from api.http.views import events_for
from api.openai_compat.ids import parse_checkpoint_ref, parse_event_ref, parse_job_ref
from api.openai_compat.job_checkpoints import job_checkpoint
from api.openai_compat.job_events import job_event
from api.openai_compat.job_object import fine_tuning_job
from api.openai_compat.job_request import in_openai_terms, job_request
from api.schemas.fine_tuning import (
    MAX_METADATA_KEY,
    MAX_METADATA_PAIRS,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobCreate,
    FineTuningJobEvent,
    ListPage,
)
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import jobs as job_store
from api.store import openai_jobs, telemetry
from api.store.db import session_scope
from grpo_core.spec.spec_file import InvalidSpec

router = APIRouter(prefix="/fine_tuning/jobs", tags=["fine-tuning (OpenAI)"])
FineTuningJobId = Annotated[str, Path(min_length=1, max_length=64,
                                      description="`ftjob-` and the job's id at /v1/jobs (`ftjob-7`)")]
Limit = Annotated[int, Query(ge=1, le=100, description="At most this many (OpenAI's default, 20)")]
_ERRORS = {401: {"description": "Missing or wrong bearer token"},
           404: {"description": "No such job (or another team's; an id not of the form ftjob-N)"}}
_MOVES = {**_ERRORS, 409: {"description": "The job's status does not allow it (as at /v1/jobs/{id}/...)"}}
_METADATA = "metadata["


def _job_id(ref: str) -> int:
    job_id = parse_job_ref(ref)
    if job_id is None:
        raise NotFound(f"fine-tuning job '{ref}' not found (ids look like ftjob-7)",
                       param="fine_tuning_job_id")
    return job_id


def _owned(session: Session, ref: str, principal: Principal) -> int:
    """The job's id, when the caller may see it; a 404 naming the OpenAI id otherwise."""
    job_id = _job_id(ref)
    try:
        job_store.get_job(session, job_id, principal.scope)
    except NotFound:
        raise NotFound(f"fine-tuning job '{ref}' not found", param="fine_tuning_job_id") from None
    return job_id


def _answer(session: Session, job: JobRead, principal: Principal) -> FineTuningJob:
    return fine_tuning_job(openai_jobs.job_facts(session, job.id, principal.scope))


@router.post("", response_model=FineTuningJob, responses={
    401: {"description": "Missing or wrong bearer token"},
    409: {"description": "This Idempotency-Key was used with a different body; or `queue_full`"},
    422: {"description": "A refused or invalid field; `param` names it as OpenAI's create does "
                         "(`model`, `method.type`, `method.reinforcement.hyperparameters.n_epochs`, "
                         "`method.reinforcement.grader.operation`...), the message the spec's field"}})
async def create_job(body: FineTuningJobCreate, principal: PrincipalDep, settings: SettingsDep,
                     request: Request,
                     idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
                     ) -> FineTuningJob:
    """OpenAI's ``fine_tuning.jobs.create`` with ``method.type: reinforcement``: a job of the
    caller's team, checked and queued as ``POST /v1/jobs`` would its spec (docs/user_guide.md,
    "Coming from OpenAI's fine-tuning"). The same ``Idempotency-Key`` and body return the first job."""
    return await intake(request.app.state).run(_create, settings, request.app.state, principal, body,
                                               idempotency_key)


def _create(settings: Settings, app_state: State, principal: Principal, body: FineTuningJobCreate,
            idempotency_key: str | None) -> FineTuningJob:
    asked = job_request(body)

    def recorded(session: Session, job: JobRead, created: bool) -> None:
        openai_jobs.record_request(session, job.id, asked.stored, created)

    try:
        job, _ = check_and_create(settings, app_state, principal, asked.spec, idempotency_key, recorded)
    except InvalidSpec as exc:
        raise in_openai_terms(exc) from None
    with session_scope(settings.database_url) as session:
        return _answer(session, job, principal)


@router.get("", response_model=ListPage[FineTuningJob], responses={401: _ERRORS[401]})
def list_jobs(session: SessionDep, principal: PrincipalDep, request: Request,
              after: Annotated[str | None, Query(max_length=64, description="The last id of the previous "
                                                                            "page (ftjob-N)")] = None,
              limit: Limit = 20) -> ListPage[FineTuningJob]:
    """The team's jobs, newest first, whichever door they came in by. ``metadata[KEY]=VALUE``
    (repeatable) keeps the jobs whose create's metadata holds each pair."""
    cursor = 0
    if after is not None and (cursor := parse_job_ref(after) or 0) == 0:
        raise InvalidInput(f"'{after}' is not a fine-tuning job id (ftjob-N)", param="after")
    found = openai_jobs.list_job_facts(session, principal.scope, cursor, limit + 1, _metadata_filter(request))
    return ListPage[FineTuningJob](data=[fine_tuning_job(facts) for facts in found[:limit]],
                                   has_more=len(found) > limit)


def _metadata_filter(request: Request) -> dict[str, str]:
    """``metadata[KEY]=VALUE`` pairs of the query, as OpenAI's list takes them."""
    pairs: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name == "metadata":
            raise InvalidInput("filter by metadata as metadata[KEY]=VALUE (jobs without metadata cannot be "
                               "selected here)", param="metadata")
        if not name.startswith(_METADATA):
            continue
        key = name[len(_METADATA):]
        if not key.endswith("]") or not 1 <= len(key) - 1 <= MAX_METADATA_KEY:
            raise InvalidInput(f"'{name[:80]}': metadata keys are 1-{MAX_METADATA_KEY} characters, as "
                               "metadata[KEY]=VALUE", param="metadata")
        pairs[key[:-1]] = value
    if len(pairs) > MAX_METADATA_PAIRS:
        raise InvalidInput(f"at most {MAX_METADATA_PAIRS} metadata pairs", param="metadata")
    return pairs


@router.get("/{fine_tuning_job_id}", response_model=FineTuningJob, responses=_ERRORS)
def retrieve_job(fine_tuning_job_id: FineTuningJobId, session: SessionDep,
                 principal: PrincipalDep) -> FineTuningJob:
    return fine_tuning_job(openai_jobs.job_facts(session, _job_id(fine_tuning_job_id), principal.scope))


@router.post("/{fine_tuning_job_id}/cancel", response_model=FineTuningJob, responses=_MOVES)
def cancel_job(fine_tuning_job_id: FineTuningJobId, session: SessionDep,
               principal: PrincipalDep) -> FineTuningJob:
    """``POST /v1/jobs/{id}/cancel``: a waiting job is cancelled at once, a running one stops at
    its next step (``cancelled`` already, ``finished_at`` null until it has stopped)."""
    job_id = _owned(session, fine_tuning_job_id, principal)
    return _answer(session, job_routes.cancel_job(job_id, session, principal), principal)


@router.post("/{fine_tuning_job_id}/pause", response_model=FineTuningJob, responses=_MOVES)
def pause_job(fine_tuning_job_id: FineTuningJobId, session: SessionDep,
              principal: PrincipalDep) -> FineTuningJob:
    """``POST /v1/jobs/{id}/pause``: a running job checkpoints at its next step and frees its GPUs."""
    job_id = _owned(session, fine_tuning_job_id, principal)
    return _answer(session, job_routes.pause_job(job_id, session, principal), principal)


@router.post("/{fine_tuning_job_id}/resume", response_model=FineTuningJob,
             responses={**_MOVES,
                        422: {"description": "The job's priority is above the team's `max_priority`"}})
def resume_job(fine_tuning_job_id: FineTuningJobId, session: SessionDep, principal: PrincipalDep,
               settings: SettingsDep) -> FineTuningJob:
    """``POST /v1/jobs/{id}/resume``: a paused job goes back to the queue, to continue from its
    checkpoint."""
    job_id = _owned(session, fine_tuning_job_id, principal)
    return _answer(session, job_routes.resume_job(job_id, session, principal, settings), principal)


@router.get("/{fine_tuning_job_id}/events", response_model=ListPage[FineTuningJobEvent], responses=_ERRORS)
def list_events(fine_tuning_job_id: FineTuningJobId, session: SessionDep, principal: PrincipalDep,
                after: Annotated[str | None, Query(max_length=64, description="The last id of the previous "
                                                                              "page (ftevent-N)")] = None,
                limit: Limit = 20) -> ListPage[FineTuningJobEvent]:
    """The job's lifecycle events, newest first (``GET /v1/jobs/{id}/events``'s, oldest first)."""
    job_id = _owned(session, fine_tuning_job_id, principal)
    before = 0
    if after is not None and (before := parse_event_ref(after) or 0) == 0:
        raise InvalidInput(f"'{after}' is not an event id (ftevent-N)", param="after")
    found = telemetry.list_events_newest_first(session, job_id, before, limit + 1)
    # A member sees a checkpoint's name in an event's data, never its server path.
    shown = events_for(principal, found[:limit])
    return ListPage[FineTuningJobEvent](data=[job_event(event) for event in shown],
                                        has_more=len(found) > limit)


@router.get("/{fine_tuning_job_id}/checkpoints", response_model=ListPage[FineTuningJobCheckpoint],
            responses=_ERRORS)
def list_checkpoints(fine_tuning_job_id: FineTuningJobId, session: SessionDep, principal: PrincipalDep,
                     after: Annotated[str | None, Query(max_length=64, description="The last id of the "
                                                        "previous page (ftckpt-JOB-STEP)")] = None,
                     limit: Limit = 10) -> ListPage[FineTuningJobCheckpoint]:
    """The checkpoints the job keeps, newest first, each a model source (``job:ID@STEP``)."""
    job_id = _owned(session, fine_tuning_job_id, principal)
    below = None
    if after is not None:
        cursor = parse_checkpoint_ref(after)
        if cursor is None or cursor[0] != job_id:
            raise InvalidInput(f"'{after}' is not a checkpoint id of this job (ftckpt-{job_id}-STEP)",
                               param="after")
        below = cursor[1]
    kept = [checkpoint for checkpoint in reversed(telemetry.list_checkpoints(session, job_id))
            if below is None or checkpoint.step < below]
    page = kept[:limit]
    records = telemetry.metrics_at(session, job_id, [checkpoint.step for checkpoint in page])
    return ListPage[FineTuningJobCheckpoint](
        data=[job_checkpoint(job_id, checkpoint, records.get(checkpoint.step)) for checkpoint in page],
        has_more=len(kept) > limit)
