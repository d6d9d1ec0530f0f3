"""Every check a submit makes, then the job written and admitted against its team's limits in one
transaction (:func:`check_and_create`): the one way in for each door to jobs (``POST /v1/jobs``
and its clone, OpenAI's create in :mod:`api.http.routes.fine_tuning`). And the same path as a
dry run (:func:`rehearse`, ``POST /v1/jobs?dry_run=true``): every check, the write and the
admission too, then rolled back, answered with the spec as it would be stored and the job's
GPU-hours estimated (:mod:`api.limits.gpu_estimate`). Run in a worker thread: it blocks on the
filesystem, Redis and SQL."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session
from starlette.datastructures import State

from api.domain.job_spec import JobSpec
from api.http.auth import Principal
from api.http.submission import (
    check_capabilities,
    check_file_sources,
    check_job_sources,
    check_model_positions,
    check_placement,
    check_submission,
    check_verifiers,
    dataset_file_warnings,
    with_dataset_files,
)
from api.limits.gpu_estimate import Throughput, estimate, measured
from api.schemas.estimates import JobDryRun
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import bus
from api.store import jobs as job_store
from api.store.budgets import budget_read, team_budgets
from api.store.clock import db_now
from api.store.db import discard, session_scope
from api.store.team_admission import admit, with_team_priority
from api.store.usage import pool_history
from api.vocabulary import Heartbeat

Recorded = Callable[[Session, JobRead, bool], None]


def check_and_create(settings: Settings, app_state: State, principal: Principal, spec: JobSpec,
                     idempotency_key: str | None, recorded: Recorded | None = None) -> tuple[JobRead, bool]:
    """Every check a submit makes, then the job written and admitted: ``(job, created)``;
    ``recorded(session, job, created)``: what a door keeps beside the job, in the same transaction
    (also called on a replay, to check it)."""
    with session_scope(settings.database_url, publish=app_state.publish) as session:
        return _create(session, settings, app_state, principal, spec, idempotency_key, recorded)


def rehearse(settings: Settings, app_state: State, principal: Principal, spec: JobSpec) -> JobDryRun:
    """:func:`check_and_create` with nothing kept: a refusal is the submit's own, else the spec as
    it would be stored, its warnings, its GPU-hour estimate on its pool's measured throughput
    (the deployment's default rate and no start-up for a pool with no succeeded job) and the
    team's budget left."""
    with session_scope(settings.database_url) as session:
        job, _ = _create(session, settings, app_state, principal, spec, None, None)
        stored = JobSpec.model_validate(job.spec)
        now = db_now(session)
        throughput = measured(pool_history(session, stored.resources.pool, now))
        guess = (estimate(stored, Throughput(settings.estimate_tokens_per_gpu_second, 0.0, 0), "default")
                 if throughput is None else estimate(stored, throughput, "measured"))
        [budget] = team_budgets(session, settings, now, [principal.team_id])
        discard(session)  # the job, its events and its admission: none of it happened
    return JobDryRun(spec=job.spec, warnings=job.warnings, estimate=guess, team_budget=budget_read(budget))


def _create(session: Session, settings: Settings, app_state: State, principal: Principal, spec: JobSpec,
            idempotency_key: str | None, recorded: Recorded | None) -> tuple[JobRead, bool]:
    # One threadpool hop for everything that blocks: the filesystem and Redis checks, then one
    # transaction. A Redis outage while reading live workers is a 503, like any backend's.
    team_id = principal.team_id
    check_submission(spec, settings)

    def live_workers() -> list[Heartbeat]:
        return bus.live_workers(app_state.sync_redis, settings.redis_keys)

    check_capabilities(spec, live_workers)
    check_placement(session, spec, settings, live_workers)
    check_job_sources(session, spec, team_id, settings)
    files = check_file_sources(session, spec, team_id)
    spec = with_dataset_files(spec, files)
    check_model_positions(session, spec, settings)
    check_verifiers(session, spec, team_id)
    spec = with_team_priority(session, team_id, spec, settings)
    job, created = job_store.create_job(session, team_id, spec, idempotency_key,
                                        dataset_file_warnings(spec, files))
    if recorded is not None:
        recorded(session, job, created)
    if created:  # a replay queues nothing
        admit(session, team_id, job.priority, settings, member=not principal.is_admin)
    return job, created

