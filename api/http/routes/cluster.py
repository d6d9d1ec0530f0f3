"""``GET /v1/cluster`` (workers, GPUs, running jobs, each team's usage against its quota) and
``GET /v1/queue`` (waiting jobs in the scheduler's dispatch order, with why each waits).

The cluster view is computed now, from live heartbeats and SQL, by the same state loader and
fair-share rule the scheduler uses, so its fair shares are the scheduler's. The queue is the order the
scheduler published at its last pass (``RedisKeys.queue``): positions are its decisions, not
a guess made here.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from api.http.deps import PrincipalDep, RedisDep, SettingsDep
from api.http.params import MAX_NAME_LENGTH
from api.scheduling import liveness, policy
from api.scheduling.cluster_views import ClusterView, QueueView, cluster_view, queue_view
from api.settings import Settings
from api.store import bus
from api.store.clock import db_now
from api.store.db import session_scope
from api.store.dispatching import load_state
from api.vocabulary import NAME_PATTERN, Heartbeat

router = APIRouter(tags=["scheduling"])


@router.get("/cluster", response_model=ClusterView)
async def get_cluster(principal: PrincipalDep, settings: SettingsDep, redis: RedisDep) -> ClusterView:
    """Pools with their live workers and free GPUs, every team's GPUs held against its quota
    and fair share, and the running jobs (a member sees only its own team's)."""
    heartbeats = await bus.live_workers_async(redis, settings.redis_keys)
    return await run_in_threadpool(_cluster, settings, heartbeats, principal.scope)


def _cluster(settings: Settings, heartbeats: list[Heartbeat], scope: int | None) -> ClusterView:
    with session_scope(settings.database_url) as session:
        state = load_state(session, heartbeats, db_now(session), settings.fair_share_half_life_seconds)
    return cluster_view(state, heartbeats, policy.fair_shares(state.cluster), scope)


@router.get("/queue", response_model=QueueView)
async def get_queue(principal: PrincipalDep, settings: SettingsDep, redis: RedisDep,
                    pool: Annotated[str | None, Query(max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN,
                                                      description="Only this pool")] = None,
                    ) -> QueueView:
    """Waiting jobs in the order the scheduler will dispatch them, per pool, each with its
    ``position`` and ``pending_reason``; a member sees its own team's jobs, and how many wait
    in all."""
    keys = settings.redis_keys
    raw, passed = await redis.mget([keys.queue, keys.scheduler_pass])
    snapshot = json.loads(raw) if raw else None
    alive = liveness.scheduler_alive(liveness.pass_age_seconds(passed), settings)
    return queue_view(snapshot, passed.decode() if passed else None, principal.scope, pool, alive)
