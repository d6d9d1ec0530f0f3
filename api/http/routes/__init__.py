"""The HTTP surface: probes and Prometheus' ``/metrics`` at the root, everything else under
``/v1`` behind auth."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.http.deps import get_principal
from api.http.rate_limit import enforce_rate_limit
from api.http.routes import (
    admin,
    chat,
    cluster,
    compare,
    dashboard,
    downloads,
    environment_trials,
    files,
    fine_tuning,
    jobs,
    meta,
    openai_graders,
    prometheus,
    reward_trials,
    stream,
    telemetry,
    usage,
    webhooks,
)


def build_router() -> APIRouter:
    root = APIRouter()
    root.include_router(meta.probes)
    root.include_router(dashboard.router)  # the page and its files; its data comes from /v1
    root.include_router(prometheus.router)
    # The principal first: the rate limit counts against the caller's team.
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(get_principal), Depends(enforce_rate_limit)],
                   responses={401: {"description": "Missing or wrong bearer token"},
                              429: {"description": "The team's reads or writes are over its rate limit; "
                                                   "retry after `Retry-After` seconds"}})
    # compare before jobs: `/jobs/{job_id}` would take `compare` for an id (and refuse it).
    for module_router in (meta.catalog, reward_trials.router, environment_trials.router,
                          openai_graders.router, compare.router,
                          jobs.router, telemetry.router, downloads.router, stream.router, cluster.router,
                          usage.router, webhooks.router, files.router, fine_tuning.router, chat.router,
                          admin.me, admin.router):
        v1.include_router(module_router)
    root.include_router(v1)
    return root
