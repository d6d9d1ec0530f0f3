"""Probes and the reward catalog. ``/healthz`` says the process serves requests; ``/readyz``
says it can do its job: the database and Redis both answer and the database's schema is the
code's (else 503). ``/readyz`` needs no key,
so it says only ``ok`` / ``down`` per component; why one is down (which carries hosts, database
names and driver errors) is told to admin credentials only. It also reports the scheduler's last
pass: with none lately it answers 200 ``degraded``, not 503, since this API still serves every
request and taking it out of a load balancer would not bring a scheduler back; queued jobs then
say ``no_scheduler`` (``api.scheduling.liveness``). ``/v1/codes`` says what each job code means,
``/v1/lifecycle`` which statuses a job has and which actions apply in each."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api.domain import explanations, lifecycle
from api.http.deps import RedisDep, SettingsDep, caller_is_admin
from api.http.error_responses import error_body
from api.scheduling import liveness
from api.schemas.jobs import CodesRead, LifecycleRead
from api.store.db import get_engine
from api.store.migrate import schema_problem
from api.vocabulary import PRIORITIES
from grpo_core.rewards import reward_catalog

PROBE_TIMEOUT_S = 2.0
SCHEMA_BEHIND = "schema behind the code"  # no secret in it: said to anyone

probes = APIRouter(tags=["meta"])
catalog = APIRouter(tags=["meta"])


@probes.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@probes.get("/readyz", responses={503: {"description": "The database or Redis does not answer"}})
async def readyz(settings: SettingsDep, redis: RedisDep,
                 admin: Annotated[bool, Depends(caller_is_admin)]) -> JSONResponse:
    """``checks``: ``ok`` or ``down`` per component; with an admin key or the operator token,
    a component that is down says why instead. ``scheduler``: its last pass's age."""
    database, schema = await _check(run_in_threadpool(_schema_problem, settings.database_url))
    if database == "ok" and schema is not None:  # it answers, but new code must not meet an old schema
        database = SCHEMA_BEHIND if not admin else schema
    # The probe of Redis reads the scheduler's last pass: one round trip tells both.
    redis_check, stamp = await _check(redis.get(settings.redis_keys.scheduler_pass))
    results = {"database": database, "redis": redis_check}
    public = ("ok", SCHEMA_BEHIND)
    checks = results if admin else {name: r if r in public else "down" for name, r in results.items()}
    age = liveness.pass_age_seconds(stamp)
    scheduler = {"last_pass_age_seconds": None if age is None else round(age, 3),
                 "stale_after_seconds": liveness.stale_after_seconds(settings)}
    failed = {name: result for name, result in checks.items() if result != "ok"}
    if failed:
        message = "; ".join(f"{name}: {result}" for name, result in failed.items())
        return JSONResponse({**error_body("not_ready", message), "checks": checks, "scheduler": scheduler},
                            status_code=503)
    if not liveness.scheduler_alive(age, settings):
        checks["scheduler"] = "no scheduler pass yet" if age is None else f"no pass for {age:.0f} s"
        return JSONResponse({"status": "degraded", "checks": checks, "scheduler": scheduler})
    checks["scheduler"] = "ok"
    return JSONResponse({"status": "ready", "checks": checks, "scheduler": scheduler})


async def _check(probe: Any) -> tuple[str, Any]:
    """``("ok", the probe's answer)``, or what went wrong and None."""
    try:
        return "ok", await asyncio.wait_for(probe, PROBE_TIMEOUT_S)
    except TimeoutError:
        return f"no answer within {PROBE_TIMEOUT_S:g} s", None
    except Exception as exc:  # any failure means not ready; its text tells the operator which
        return f"{type(exc).__name__}: {exc}", None


def _schema_problem(url: str) -> str | None:
    """The database answers; None when its schema is the code's, else what is wrong."""
    with get_engine(url).connect() as connection:
        return schema_problem(connection)


@catalog.get("/rewards")
def list_rewards() -> dict[str, list[dict[str, Any]]]:
    """Every reward a spec may name, with the JSON schema of its ``args``."""
    return {"items": reward_catalog()}


@catalog.get("/codes", response_model=CodesRead)
def list_codes() -> CodesRead:
    """What each ``pending_reason`` and ``error.code`` a job may show means, for a person: one
    table that every client shows, so none keeps its own copy."""
    return CodesRead(pending_reasons=explanations.PENDING_REASONS, error_codes=explanations.ERROR_CODES,
                     alert_rules=explanations.ALERT_RULES)


@catalog.get("/lifecycle", response_model=LifecycleRead)
def describe_lifecycle() -> LifecycleRead:
    """Every status a job may have, which are terminal, which actions apply in which status
    (``POST /v1/jobs/{id}/{action}`` is a 409 elsewhere) and the priority classes: what clients
    show, read from the service's one table."""
    actions = {action.value: list(statuses) for action, statuses in lifecycle.ACTIONS.items()}
    return LifecycleRead(statuses=list(lifecycle.JOB_STATUSES), terminal=list(lifecycle.TERMINAL_STATUSES),
                         actions=actions, priorities=list(PRIORITIES))
