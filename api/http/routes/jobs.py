"""``/v1/jobs``: submit, list, read, cancel, pause, resume, retry and clone jobs. Thin: parse,
check, call the store.

Every way a job enters the queue (submit, clone, retry, resume) or changes class (PATCH) is
admitted against its team's limits in the transaction that makes the change
(:mod:`api.store.team_admission`): its members' highest priority class, the team's queue cap and
its GPU-hour budget; a retry or resume, against the job's own budget too (``max_gpu_hours``,
which PATCH raises).
Spec bodies are parsed and checked off the event loop (:mod:`api.http.spec_intake`), and so are
the responses that carry specs (:func:`_json_off_loop`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, NamedTuple

from fastapi import APIRouter, Header, Query, Request, status
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State
from starlette.responses import Response as PlainResponse

from api.artifacts.paths import job_prefix
from api.domain.errors import NotFound, Unavailable
from api.domain.job_labels import MAX_SEARCH_CHARS, MAX_TAGS, Tag
from api.domain.job_spec import JobSpec
from api.domain.lifecycle import JOB_STATUSES, WAITING_STATUSES
from api.domain.serve_spec import refuse_for_serving
from api.http.auth import Principal
from api.http.deps import PrincipalDep, RedisDep, SessionDep, SettingsDep
from api.http.error_responses import RETRY_AFTER_SECONDS
from api.http.job_creation import check_and_create, rehearse
from api.http.job_json import job_json, page_json
from api.http.params import JobId, id_cursor
from api.http.rate_limit import charge_answer
from api.http.spec_intake import intake, parse_changes, parse_spec
from api.http.submission import check_file_sources
from api.http.views import job_for
from api.limits.team_limits import check_priority
from api.scheduling import liveness
from api.schemas.estimates import JobDryRun
from api.schemas.jobs import CloneDraft, JobRead, JobUpdate, Page
from api.settings import Settings
from api.storage import StorageError, open_store
from api.store import job_deletion
from api.store import jobs as job_store
from api.store.budgets import check_job_budget_left
from api.store.db import session_scope
from api.store.job_labels import set_labels
from api.store.metric_series import with_eval_rewards
from api.store.spec_pages import StoredSpecs, job_with_spec, with_specs
from api.store.team_admission import admit, team_limits
from grpo_core.spec.spec_file import with_changes

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jobs", tags=["jobs"])

JobStatus = Literal[JOB_STATUSES]  # type: ignore[valid-type]
_ERRORS = {401: {"description": "Missing or wrong bearer token"}, 404: {"description": "No such job"}}
_QUEUE_FULL = {409: {"description": "`queue_full`: the team has `max_queued_jobs` jobs waiting already"}}
_PRIORITY = "; a member's priority above the team's `max_priority` is a 422 naming `priority`"
_BUDGET = ("; a team that used its period's GPU-hours is a 422 `budget_exhausted` naming "
           "`team.gpu_hours_budget`")
_SPEC = {"$ref": "#/components/schemas/JobSpec"}  # api.http.openapi_bodies adds it to the components


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobRead,
    responses={
        200: {"model": JobRead | JobDryRun, "description": "Replay: this Idempotency-Key was used with this "
              "same body (the job); or the answer of `dry_run=true` (`dry_run: true`, nothing created)"},
        409: {"description": "This Idempotency-Key was used with a different body; or `queue_full`: the "
                             "team has `max_queued_jobs` jobs waiting already"},
        413: {"description": "Body over the configured limit"},
        422: {"description": "Invalid spec; `param` names the first bad field, `errors` lists all"
                             + _PRIORITY + _BUDGET},
    },
    # The body is read raw and parsed off the event loop (JSON, or YAML by its Content-Type).
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": _SPEC}, "application/yaml": {"schema": _SPEC}}}},
)
async def submit_job(
    principal: PrincipalDep,
    settings: SettingsDep,
    request: Request,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
    dry_run: Annotated[bool, Query(description=(
        "Check everything a submit checks, team limits and budget included, and create nothing: the "
        "answer (200) is the spec as it would be stored and the job's GPU-hours estimated from its shape "
        "and its pool's measured throughput"))] = False,
) -> Any:
    """Queue a job. Retrying with the same ``Idempotency-Key`` and body returns the first job (200).
    A spec without ``priority`` gets ``normal``, or the team's ``max_priority`` if that is lower.
    With ``dry_run=true`` nothing is queued (the key is not looked at)."""
    raw = await request.body()
    if dry_run:
        rehearsed = await intake(request.app.state).run(_parse_and_rehearse, settings, request.app.state,
                                                        principal, raw, request.headers.get("content-type"))
        return PlainResponse(await run_in_threadpool(rehearsed.model_dump_json),
                             media_type="application/json")
    job, created = await intake(request.app.state).run(
        _parse_check_and_create, settings, request.app.state, principal, raw,
        request.headers.get("content-type"), idempotency_key)
    return await _echo(job, status.HTTP_201_CREATED if created else status.HTTP_200_OK)


async def _echo(job: JobRead, code: int) -> PlainResponse:
    """A new job with the spec it was sent, written in the threadpool (its JSON is megabytes for a
    large spec); the request paid for those bytes as it came in."""
    return PlainResponse(await run_in_threadpool(job.model_dump_json), code, media_type="application/json")


def _parse_check_and_create(settings: Settings, app_state: State, principal: Principal, raw: bytes,
                            content_type: str | None, idempotency_key: str | None) -> tuple[JobRead, bool]:
    return check_and_create(settings, app_state, principal, parse_spec(raw, content_type), idempotency_key)


def _parse_and_rehearse(settings: Settings, app_state: State, principal: Principal, raw: bytes,
                        content_type: str | None) -> JobDryRun:
    return rehearse(settings, app_state, principal, parse_spec(raw, content_type))


@router.get("", response_model=Page[JobRead], responses=_ERRORS)
async def list_jobs(
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    redis: RedisDep,
    status_in: Annotated[list[JobStatus] | None, Query(alias="status")] = None,
    after: Annotated[int, *id_cursor("Cursor: `next_after` of the previous page")] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    order: Annotated[Literal["asc", "desc"], Query(description="`desc`: newest first")] = "asc",
    include: Annotated[Literal["spec"] | None, Query(description=(
        "`spec`: each job's spec too; the page then ends early once its specs add up to "
        "`GRPO_LIST_SPEC_BYTES` (2 MiB by default, at least one job a page): follow `next_after`"))] = None,
    tag: Annotated[list[Tag] | None, Query(max_length=MAX_TAGS, description=(
        "Only jobs with this tag; repeated, only jobs with all of them"))] = None,
    q: Annotated[str | None, Query(min_length=1, max_length=MAX_SEARCH_CHARS, description=(
        "Only jobs whose name or description holds this text, ignoring case"))] = None,
) -> Any:
    """Jobs in id order (``order=desc``: newest first), optionally only those in the given
    statuses (repeat ``status=``), with all the given tags (repeat ``tag=``) and holding ``q`` in
    their name or description; ``after`` continues in that order. A waiting job carries its
    ``pending_reason`` and ``queue_position``. Summaries: ``spec`` is null unless ``include=spec``
    (``GET /v1/jobs/{id}`` always has it). A page may hold fewer than ``limit`` jobs while
    ``next_after`` is set (with ``include=spec``, when the specs reached the page's byte budget);
    ``next_after`` null is the only end."""
    filters = JobFilters(status_in, tag or (), q)
    items, specs, more = await run_in_threadpool(_page, session, principal, settings, filters, after,
                                                 limit, order == "desc", include == "spec")
    page = [job_for(principal, job) for job in await with_queue_positions(redis, settings, items)]
    next_after = page[-1].id if more else None
    if include != "spec":
        return Page[JobRead](items=page, next_after=next_after)
    return await _with_specs_answer(request, page_json, page, specs, next_after)


class JobFilters(NamedTuple):
    """What a list asks of its jobs: statuses (any of them), tags (all of them), a text."""

    statuses: list[str] | None
    tags: Sequence[str]
    search: str | None


def _page(session: SessionDep, principal: Principal, settings: Settings, filters: JobFilters,
          after: int, limit: int, newest_first: bool, with_spec: bool
          ) -> tuple[list[JobRead], StoredSpecs, bool]:
    """Up to ``limit`` jobs, their specs' JSON if asked (as many as the byte budget allows), and
    whether more jobs follow."""
    items = job_store.list_jobs(session, principal.scope, filters.statuses, after, limit + 1, newest_first,
                                principal.is_admin, tags=filters.tags, search=filters.search)
    more, items = len(items) > limit, items[:limit]
    items = with_eval_rewards(session, items)
    specs: StoredSpecs = {}
    if with_spec:
        chosen, specs = with_specs(session, items, settings.list_spec_bytes)
        more, items = more or len(chosen) < len(items), chosen
    return items, specs, more


async def _with_specs_answer(request: Request, build: Callable[..., str], *args: Any) -> PlainResponse:
    """An answer carrying specs: written in the threadpool (:mod:`api.http.job_json`; megabytes of
    text to join), and charged by its size to the caller's rate limit."""
    content = await run_in_threadpool(build, *args)
    await charge_answer(request, len(content))
    return PlainResponse(content, media_type="application/json")


@router.get("/{job_id}", response_model=JobRead, responses=_ERRORS)
async def get_job(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep,
                  redis: RedisDep, request: Request) -> Any:
    """The job, with its spec; a failure's ``error.traceback`` only for an admin."""
    job, spec = await run_in_threadpool(_job_with_spec, session, job_id, principal)
    [placed] = await with_queue_positions(redis, settings, [job])
    return await _with_specs_answer(request, job_json, job_for(principal, placed), spec)


def _job_with_spec(session: SessionDep, job_id: int, principal: Principal) -> tuple[JobRead, str]:
    """The job with its latest eval reward, and its spec's JSON; a traceback for an admin only."""
    job, spec = job_with_spec(session, job_id, principal.scope, traceback=principal.is_admin)
    [job] = with_eval_rewards(session, [job])
    return job, spec


@router.patch("/{job_id}", response_model=JobRead,
              responses={**_ERRORS, 409: {"description": "A priority or a budget for a job that already "
                                                        "finished"},
                         422: {"description": "Not a priority class, a bad budget, or a bad tag (`param` "
                                              "`tags.N`) or description; none of them given" + _PRIORITY}})
def update_job(job_id: JobId, update: JobUpdate, session: SessionDep, principal: PrincipalDep,
               settings: SettingsDep) -> JobRead:
    """Change a job's ``priority`` while it waits (its place in the queue moves at the
    scheduler's next pass) or runs (which decides whether it may be preempted), and its own
    GPU-hour budget (``max_gpu_hours``, null: none) until it finishes (a job its budget paused
    resumes once it is raised); its ``tags`` (all of them, replaced) and ``description`` in any
    status. A member may choose a priority up to the team's ``max_priority``; an admin any class.
    Each change is made to the job's stored spec too (a clone carries it). One transaction: a
    refused part changes nothing."""
    job = job_store.get_job(session, job_id, principal.scope)  # another team's job is a 404 first
    if update.priority is not None:
        job = job_store.set_priority(session, job_id, update.priority, principal.scope)
        if not principal.is_admin:  # after the write; a refusal rolls back
            check_priority(update.priority, str(team_limits(session, job.team_id, settings).max_priority))
    if "max_gpu_hours" in update.model_fields_set:
        job = job_store.set_max_gpu_hours(session, job_id, update.max_gpu_hours, principal.scope)
    if changes := update.label_changes():
        set_labels(session, job_id, changes)
        job = job_store.get_job(session, job_id)
    return job_for(principal, job)


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


@router.delete("/{job_id}", status_code=status.HTTP_204_NO_CONTENT, responses={
    **_ERRORS,
    409: {"description": "The job has not finished (the message names its status), or an unfinished "
                         "job continues from its model (`job:ID` source; the message names it)"},
    503: {"description": "The job is deleted but its artifacts could not all be removed from storage "
                         "(they still count against the team's quota): DELETE it again, or the "
                         "scheduler's storage sweep removes them"}})
def delete_job(job_id: JobId, principal: PrincipalDep, settings: SettingsDep) -> PlainResponse:
    """Delete a succeeded, failed or cancelled job: its events, metrics, samples and checkpoints,
    then its artifacts in storage (checkpoints, final model, tracker files), which frees its
    team's artifact quota. Every read of it is a 404 afterwards, a second DELETE too. Its GPU
    time stays in the team's usage and its webhook deliveries stay listed."""
    with session_scope(settings.database_url) as session:
        fresh = job_deletion.deletion_target(session, job_id, principal.scope)
        if fresh:
            job_deletion.tombstone(session, job_id)
    # Only now that no row points at them: a failure from here on leaves files, never a dangling row.
    try:
        removed = open_store(settings.storage_location).delete_prefix(job_prefix(job_id))
    except StorageError as exc:
        raise Unavailable(f"job {job_id} is deleted, but its artifacts could not all be removed from storage "
                          f"({exc}); they count against your team's quota until a DELETE of it succeeds or "
                          "the service's storage sweep removes them",
                          retry_after=RETRY_AFTER_SECONDS, param="job_id") from exc
    if not fresh and not removed:  # deleted before, and nothing was left to remove
        raise NotFound(f"job {job_id} not found", param="job_id")
    return PlainResponse(status_code=status.HTTP_204_NO_CONTENT)


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
             responses={**_ERRORS, 409: {"description": "The job is not paused; or `queue_full`"},
                        422: {"description": "The job's priority is above the team's `max_priority`; or "
                                             "`budget_exhausted`: the job used its `max_gpu_hours` (param "
                                             "`resources.max_gpu_hours`: PATCH a higher one first)"
                                             + _BUDGET}})
def resume_job(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep) -> JobRead:
    """A paused job goes back to the queue; it continues from its checkpoint, each step once. A
    job its own GPU-hour budget paused resumes only once that budget is raised."""
    return _admitted(session, principal, settings, job_store.resume(session, job_id, principal.scope))


@router.post("/{job_id}/retry", response_model=JobRead,
             responses={**_ERRORS, 409: {"description": "The job has not failed nor been cancelled; or "
                                                        "`queue_full`"},
                        422: {"description": "The job's priority is above the team's `max_priority`, "
                                             "a file it names was deleted, or `budget_exhausted`: it used "
                                             "its `max_gpu_hours`" + _BUDGET}})
def retry_job(job_id: JobId, session: SessionDep, principal: PrincipalDep, settings: SettingsDep) -> JobRead:
    """A failed or cancelled job goes back to the queue and continues from its last checkpoint
    (from the start without one), its error cleared, with a fresh attempt budget."""
    refuse_for_serving(job_store.get_job(session, job_id, principal.scope).kind, job_id, "retry")
    requeued = job_store.retry(session, job_id, principal.scope)
    # Its uploads were free to delete once it ended: without them the retry could only fail.
    check_file_sources(session, JobSpec.model_validate(requeued.spec), requeued.team_id)
    return _admitted(session, principal, settings, requeued)


def _admitted(session: SessionDep, principal: Principal, settings: Settings, requeued: JobRead) -> JobRead:
    """A job just put back in the queue, if its team's limits and its own GPU-hour budget allow it
    (else the request's transaction rolls the move back): a member may not requeue a job of a
    class above the team's highest (one an admin raised, or from before the limit)."""
    check_job_budget_left(session, requeued)
    admit(session, requeued.team_id, requeued.priority, settings, member=not principal.is_admin)
    return job_for(principal, requeued)


@router.get("/{job_id}/clone", response_model=CloneDraft, responses=_ERRORS)
def clone_draft(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> CloneDraft:
    """The spec a clone of this job would get, to edit before it is queued (the dashboard's Clone
    fills its submit form with it): the job's spec named ``NAME-2``, ``NAME-3``... as ``POST
    .../clone`` names it. Nothing is queued."""
    original = job_store.get_job(session, job_id, principal.scope)
    refuse_for_serving(original.kind, job_id, "clone")
    name = job_store.clone_name(session, principal.team_id, original.name)
    return CloneDraft(spec={**original.spec, "name": name})


@router.post(
    "/{job_id}/clone",
    status_code=status.HTTP_201_CREATED,
    response_model=JobRead,
    responses={**_ERRORS, **_QUEUE_FULL,
               422: {"description": "The changed spec is invalid; `param` names the field" + _PRIORITY}},
    openapi_extra={"requestBody": {"required": False, "content": {"application/json": {"schema": {
        "anyOf": [{"type": "object", "additionalProperties": True}, {"type": "null"}], "title": "Changes",
        "description": "Fields to change, nested as in a spec ({\"grpo\": {\"max_steps\": 10}} changes "
                       "one field); none: the same spec"}}}}},
)
async def clone_job(job_id: JobId, principal: PrincipalDep, settings: SettingsDep,
                    request: Request) -> Any:
    """Queue a new job with this job's spec, changed by the body if given, and named ``NAME-2``,
    ``NAME-3``... (the next number free among the team's jobs) unless the body names it; checked like a
    submission (its own ``model.source``, pool and limits; the priority it carries, too). To
    continue from this job's weights, change ``model.source`` to ``job:ID`` or ``job:ID@STEP``."""
    raw = await request.body()
    job, _ = await intake(request.app.state).run(_clone, settings, request.app.state, principal, job_id, raw)
    return await _echo(job_for(principal, job), status.HTTP_201_CREATED)


def _clone(settings: Settings, app_state: State, principal: Principal, job_id: int,
           raw: bytes) -> tuple[JobRead, bool]:
    changes = parse_changes(raw)
    with session_scope(settings.database_url) as session:
        original = job_store.get_job(session, job_id, principal.scope)
        refuse_for_serving(original.kind, job_id, "clone")
        if "name" not in changes:  # NAME-2, NAME-3...: clones are told apart in every list
            changes["name"] = job_store.clone_name(session, principal.team_id, original.name)
    spec = with_changes(JobSpec.model_validate(original.spec), changes)
    return check_and_create(settings, app_state, principal, spec, None)
