"""``/v1/jobs``: submit, list, read, cancel, pause, resume, retry and clone jobs. Thin: parse,
check, call the store."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Request, Response, status
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from api.http.deps import PrincipalDep, RedisDep, SessionDep, SettingsDep
from api.http.errors import spec_body
from api.http.params import JobId, id_cursor
from api.http.submission import (
    check_capabilities,
    check_job_source,
    check_placement,
    check_submission,
    check_verifiers,
)
from api.http.views import job_for
from api.lifecycle import JOB_STATUSES, WAITING_STATUSES
from api.scheduling import liveness
from api.schemas.jobs import JobRead, JobUpdate, Page
from api.settings import Settings
from api.store import bus
from api.store import jobs as job_store
from api.store.db import session_scope
from grpo_core.spec import JobSpec
from grpo_core.specfile import with_changes

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jobs", tags=["jobs"])

JobStatus = Literal[JOB_STATUSES]  # type: ignore[valid-type]
_ERRORS = {401: {"description": "Missing or wrong bearer token"}, 404: {"description": "No such job"}}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobRead,
    responses={
        200: {"model": JobRead, "description": "Replay: this Idempotency-Key was used with this same body"},
        409: {"description": "This Idempotency-Key was used with a different body"},
        413: {"description": "Body over the configured limit"},
        422: {"description": "Invalid spec; `param` names the first bad field, `errors` lists all"},
    },
    # The same spec may come as YAML (api/http/yaml_body.py turns it into this JSON body first).
    openapi_extra={"requestBody": {"content": {"application/yaml": {
        "schema": {"$ref": "#/components/schemas/JobSpec"}}}}},
)
@spec_body
async def submit_job(
    spec: JobSpec,
    principal: PrincipalDep,
    settings: SettingsDep,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
) -> JobRead:
    """Queue a job. Retrying with the same ``Idempotency-Key`` and body returns the first job (200)."""
    job, created = await run_in_threadpool(
        _check_and_create, settings, request.app.state, principal.team_id, spec, idempotency_key
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return job


def _check_and_create(
    settings: Settings,
    app_state: State,
    team_id: int,
    spec: JobSpec,
    idempotency_key: str | None,
) -> tuple[JobRead, bool]:
    # One threadpool hop for everything that blocks: the filesystem and Redis checks, then one
    # transaction. A Redis outage while reading live workers is a 503, like any backend's.
    check_submission(spec, settings)
    check_capabilities(spec, lambda: bus.live_workers(app_state.sync_redis, settings.redis_keys))
    with session_scope(settings.database_url, publish=app_state.publish) as session:
        check_placement(session, spec, settings)
        check_job_source(session, spec, team_id, settings)
        check_verifiers(session, spec, team_id)
        return job_store.create_job(session, team_id, spec, idempotency_key)


@router.get("", response_model=Page[JobRead], responses=_ERRORS)
async def list_jobs(
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    redis: RedisDep,
    status_in: Annotated[list[JobStatus] | None, Query(alias="status")] = None,
    after: Annotated[int, id_cursor("Cursor: `next_after` of the previous page")] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    order: Annotated[Literal["asc", "desc"], Query(description="`desc`: newest first")] = "asc",
    include: Annotated[Literal["spec"] | None, Query(description="`spec`: each job's spec too")] = None,
) -> Page[JobRead]:
    """Jobs in id order (``order=desc``: newest first), optionally only those in the given
    statuses (repeat ``status=``); ``after`` continues in that order. A waiting job carries its
    ``pending_reason`` and ``queue_position``. Summaries: ``spec`` is null unless ``include=spec``
    (``GET /v1/jobs/{id}`` always has it)."""
    items = await run_in_threadpool(job_store.list_jobs, session, principal.scope, status_in, after,
                                    limit + 1, order == "desc", principal.is_admin, include == "spec")
    page = [job_for(principal, job) for job in await with_queue_positions(redis, settings, items[:limit])]
    return Page[JobRead](items=page, next_after=items[limit - 1].id if len(items) > limit else None)


@router.get("/{job_id}", response_model=JobRead, responses=_ERRORS)
async def get_job(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep,
                  redis: RedisDep) -> JobRead:
    """The job; a failure's ``error.traceback`` only for an admin."""
    job = await run_in_threadpool(job_store.get_job, session, job_id, principal.scope,
                                  traceback=principal.is_admin)
    return job_for(principal, (await with_queue_positions(redis, settings, [job]))[0])


@router.patch("/{job_id}", response_model=JobRead,
              responses={**_ERRORS, 409: {"description": "The job already finished"}})
def update_job(job_id: JobId, update: JobUpdate, session: SessionDep, principal: PrincipalDep) -> JobRead:
    """Change a job's ``priority`` while it waits (its place in the queue moves at the
    scheduler's next pass) or runs (which decides whether it may be preempted)."""
    return job_for(principal, job_store.set_priority(session, job_id, update.priority, principal.scope))


async def with_queue_positions(redis: RedisDep, settings: Settings, jobs: list[JobRead]) -> list[JobRead]:
    """Fill ``queue_position`` of waiting jobs from the scheduler's last published order, and say
    ``no_scheduler`` as their pending reason when no scheduler has passed lately; a Redis outage
    leaves them as SQL has them rather than failing the read."""
    waiting = [job for job in jobs if job.status in WAITING_STATUSES]
    if not waiting:
        return jobs
    keys = settings.redis_keys
    try:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.queue_positions, [job.id for job in waiting])
            pipe.get(keys.scheduler_pass)
            positions, passed = await pipe.execute()
    except (RedisError, OSError) as exc:
        log.warning("could not read queue positions: %s", exc)
        return jobs
    found = {job.id: {"queue_position": int(value)}
             for job, value in zip(waiting, positions, strict=True) if value is not None}
    if not liveness.scheduler_alive(liveness.pass_age_seconds(passed), settings):
        for job in waiting:
            found.setdefault(job.id, {})["pending_reason"] = liveness.NO_SCHEDULER
    return [job.model_copy(update=found[job.id]) if job.id in found else job for job in jobs]


@router.post(
    "/{job_id}/cancel",
    response_model=JobRead,
    responses={**_ERRORS, 409: {"description": "The job already finished"}},
)
def cancel_job(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> JobRead:
    """A queued job ends ``cancelled`` at once; a running one becomes ``cancelling`` and stops at
    its next step, after a checkpoint. A finished job is a 409. Stream readers learn the change
    when the request's transaction commits (the session publishes what the transition staged)."""
    return job_for(principal, job_store.request_cancel(session, job_id, principal.scope))


@router.post("/{job_id}/pause", response_model=JobRead,
             responses={**_ERRORS, 409: {"description": "The job has ended: nothing to pause"}})
def pause_job(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> JobRead:
    """A waiting job is ``paused`` at once; a running one checkpoints at its next step, frees its
    GPUs and is ``paused`` (``pausing`` meanwhile). Resume it to continue from that checkpoint."""
    return job_for(principal, job_store.request_pause(session, job_id, principal.scope))


@router.post("/{job_id}/resume", response_model=JobRead,
             responses={**_ERRORS, 409: {"description": "The job is not paused"}})
def resume_job(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> JobRead:
    """A paused job goes back to the queue; it continues from its checkpoint, each step once."""
    return job_for(principal, job_store.resume(session, job_id, principal.scope))


@router.post("/{job_id}/retry", response_model=JobRead,
             responses={**_ERRORS, 409: {"description": "The job has not failed nor been cancelled"}})
def retry_job(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> JobRead:
    """A failed or cancelled job goes back to the queue and continues from its last checkpoint
    (from the start without one), its error cleared, with a fresh attempt budget."""
    return job_for(principal, job_store.retry(session, job_id, principal.scope))


@router.post(
    "/{job_id}/clone",
    status_code=status.HTTP_201_CREATED,
    response_model=JobRead,
    responses={**_ERRORS, 422: {"description": "The changed spec is invalid; `param` names the field"}},
)
def clone_job(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep,
              request: Request,
              changes: Annotated[dict[str, Any] | None, Body(
                  description="Fields to change, nested as in a spec ({\"grpo\": {\"max_steps\": 10}} "
                              "changes one field); none: the same spec")] = None) -> JobRead:
    """Queue a new job with this job's spec, changed by the body if given; checked like a
    submission (its own ``model.source``, pool and limits). To continue from this job's weights,
    change ``model.source`` to ``job:ID`` or ``job:ID@STEP``."""
    original = job_store.get_job(session, job_id, principal.scope)
    spec = with_changes(JobSpec.model_validate(original.spec), changes or {})
    job, _ = _check_and_create(settings, request.app.state, principal.team_id, spec, None)
    return job_for(principal, job)
