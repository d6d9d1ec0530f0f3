"""``GET /metrics``: the service in Prometheus' text format (``api.http.prometheus``).

Admin only (an admin key or the operator token as the scrape's bearer token; open under
``GRPO_AUTH=none``): it names running jobs and teams across the whole service.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from api.http.deps import AdminDep, RedisDep, SettingsDep
from api.http.prometheus import ServiceSnapshot, read_sql, render
from api.scheduling import liveness
from api.store import bus
from api.store.db import session_scope

router = APIRouter(tags=["meta"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"},
                       401: {"description": "Missing or wrong bearer token"},
                       403: {"description": "Not an admin key"}})
async def metrics(request: Request, _admin: AdminDep, settings: SettingsDep, redis: RedisDep) -> Response:
    snapshot: ServiceSnapshot = await run_in_threadpool(_read_sql, settings.database_url)
    keys = settings.redis_keys
    snapshot.counters = await bus.read_counters(redis, keys)
    snapshot.heartbeats = await bus.live_workers_async(redis, keys)
    snapshot.seconds_since_scheduler_pass = liveness.pass_age_seconds(await redis.get(keys.scheduler_pass))
    hubs = getattr(request.app.state, "stream_hubs", None)
    snapshot.stream_subscribers = hubs.subscriber_count() if hubs is not None else 0
    intake = getattr(request.app.state, "spec_intake", None)
    if intake is not None:
        snapshot.spec_intake = {"running": intake.running, "waiting": intake.waiting}
    return Response(render(snapshot), media_type=CONTENT_TYPE_LATEST)


def _read_sql(database_url: str) -> ServiceSnapshot:
    with session_scope(database_url) as session:
        return read_sql(session)
