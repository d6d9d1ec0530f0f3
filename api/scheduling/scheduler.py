"""``grpo scheduler``: each tick, reap expired leases, pause the jobs whose GPU-hour budget is used up
(:mod:`api.store.budgets`), ask :func:`api.scheduling.policy.plan` what to do with the cluster as it
is now, and do it: dispatch jobs onto the workers the plan chose, ask victims
of preemption to yield, record why every other waiting job waits, and publish the queue.

The order is ours, not the broker's: each worker consumes a queue of its own, and a job is sent
only to the worker whose GPUs the plan gave it. Capacity is what live workers advertise
(``api.store.bus.live_workers``); pools are registered, and their largest worker and their live
workers' GPUs together recorded, from the same heartbeats: a submission is checked against the
total (a job larger than the largest worker spans several: a gang, one message to each host).

One leader per namespace (``api.redis_keys``) at a time: a Redis lock (``SET NX PX``,
renewed and released by compare-and-set), so it works whatever the SQL database is. Two leaders
overlapping for a moment still cannot both dispatch a job: the ``queued -> dispatched``
transition is guarded. This module never imports the worker's task modules; it sends by name.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from contextlib import AbstractContextManager
from typing import Any

import redis
from celery import Celery
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from api.scheduling import liveness, policy
from api.settings import Settings
from api.store import bus
from api.store.attempts import requeue_expired
from api.store.budgets import pause_over_budget
from api.store.clock import Backoff, db_now
from api.store.db import session_scope
from api.store.dispatching import (
    SchedulingState,
    dispatch_job,
    load_state,
    request_preempt,
    set_pending_reasons,
    undispatch,
    undispatch_unclaimed,
)
from api.store.pools import record_pool, sizes_from_heartbeats
from api.store.tables import utcnow
from api.vocabulary import RUN_JOB, Heartbeat

log = logging.getLogger(__name__)

_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
          "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0")
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class LeaderLock:
    def __init__(self, client: redis.Redis, key: str, holder: str, ttl_seconds: float) -> None:
        self.client, self.key, self.holder, self.ttl_ms = client, key, holder, int(ttl_seconds * 1000)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def hold(self) -> bool:
        """Renew if we hold the lock, else try to take it; True when we are the leader now."""
        if self._renew(keys=[self.key], args=[self.holder, self.ttl_ms]):
            return True
        return bool(self.client.set(self.key, self.holder, nx=True, px=self.ttl_ms))

    def release(self) -> None:
        self._release(keys=[self.key], args=[self.holder])


def celery_client(settings: Settings) -> Celery:
    """A producer-only Celery app: it knows the broker and task names, no task code. Its sends
    time out like the scheduler's other Redis calls (``bus.client_timeouts``), so a frozen Redis
    fails a tick, which is retried, instead of hanging the scheduler."""
    timeouts = bus.client_timeouts(settings)
    app = Celery("grpo_scheduler", broker=settings.redis_url, set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=True, task_ignore_result=True,
                    broker_transport_options={"socket_timeout": timeouts.socket,
                                              "socket_connect_timeout": timeouts.connect})
    return app


def queue_snapshot(state: SchedulingState, decision: policy.Plan) -> list[dict[str, Any]]:
    """The waiting jobs in dispatch order per pool, as ``GET /v1/queue`` shows them."""
    entries = []
    for job in state.cluster.waiting:
        position = decision.position.get(job.id)
        if position is None:  # dispatched in this tick
            continue
        entries.append({"job_id": job.id, "name": state.waiting_info[job.id].name, "team_id": job.team_id,
                        "team": state.team_names.get(job.team_id), "pool": job.pool, "gpus": job.gpus,
                        "priority": job.priority, "position": position,
                        "pending_reason": decision.pending.get(job.id)})
    entries.sort(key=lambda entry: (entry["pool"], entry["position"]))
    return entries


class Scheduler:
    def __init__(self, settings: Settings, client: redis.Redis | None = None,
                 sender: Celery | None = None) -> None:
        self.settings = settings
        self.keys = settings.redis_keys
        self.client = client or bus.connect(settings)
        self.sender = sender or celery_client(settings)
        # Every transition and event a tick writes reaches the job's stream after its commit.
        self.publish = bus.publisher(self.client, self.keys, settings.stream_maxlen)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lock = LeaderLock(self.client, self.keys.scheduler_leader, self.holder,
                               liveness.leader_ttl_seconds(settings))
        self._published_queue: list[tuple] | None = None  # what the last published queue showed
        self._live: set[str] = set()  # workers heartbeating at the last tick
        self._gone: set[str] = set()  # workers that stopped, whose queue is not dropped yet

    def tick(self) -> list[int]:
        """One pass; the ids dispatched, in order."""
        url = self.settings.database_url
        window = self.settings.claim_window_seconds
        with self._session() as session:
            for job_id in undispatch_unclaimed(session, window):
                log.warning("job %s: not claimed within %g s of its dispatch; dispatched again",
                            job_id, window)
                self._count("unclaimed_dispatches")
            for job_id in requeue_expired(session, self.settings.lease_seconds,
                                          max_attempts=self.settings.max_attempts,
                                          backoff=Backoff.of(self.settings), claim_window_seconds=window):
                log.warning("job %s: lease expired (requeued, or failed once out of attempts)", job_id)
        with self._session() as session:  # before the plan: a job paused here is dispatched no more
            for job_id in pause_over_budget(session, self.settings):
                log.warning("job %s: paused, a GPU-hour budget is used up", job_id)
        heartbeats = bus.live_workers(self.client, self.keys)
        with session_scope(url) as session:
            state = load_state(session, heartbeats, db_now(session),
                               self.settings.fair_share_half_life_seconds)
        decision = policy.plan(state.cluster)
        sent = [item.job_id for item in decision.dispatch if self.dispatch(item)]
        for item in decision.preempt:
            self.preempt(item)
        self.record(state, decision, set(sent))
        self.register_pools(state, heartbeats)
        self.forget_gone_workers(state, heartbeats)
        return sent

    def dispatch(self, item: policy.Dispatch) -> bool:
        """Commit ``dispatched`` first, then send: a worker never sees a job SQL does not know. A
        gang's message goes to each of its hosts: node 0 claims the job, the others join it.

        The message carries the dispatch's number, and only a delivery of the job's current
        dispatch may claim it. A sent message can still never start a task. Redis removes it from
        the worker's queue (a list) when it answers the worker's pop, and kombu records it as
        unacknowledged only once the worker has read that answer: an answer that dies with its
        connection or process (a worker killed or frozen mid-pop, a reset connection) takes the
        message with it, with no line in any log. One taken and never run lies in the worker's
        unacknowledged set, where nothing takes it again before the visibility timeout (a week, so
        that no running job's message is redelivered). Our side drops nothing: the send is a push
        onto that list (Celery's default exchange, no binding looked up), nothing is revoked, each
        send has a task id of its own, and a gone worker's queue is dropped only once no job is
        promised to it. Hence the claim window (:func:`api.store.dispatching.undispatch_unclaimed`):
        a dispatch not claimed within it is made again, and the lost message, should it turn up,
        is refused."""
        with self._session() as session:
            number = dispatch_job(session, item.job_id, item.worker_id, item.devices, item.gang)
            if number is None:
                return False
        queues = [self.keys.worker_queue(worker_id)
                  for worker_id in (item.worker_id, *(share.worker_id for share in item.gang))]
        try:
            for node, queue in enumerate(queues):
                # An id that names the dispatch and host, so the worker's "Task ...[id] received"
                # line says whether this dispatch's message arrived. Celery decides nothing by it
                # here (no results, no revokes, no deduplication).
                self.sender.send_task(RUN_JOB, args=[item.job_id, number], queue=queue,
                                      task_id=f"job-{item.job_id}-dispatch-{number}-host-{node}")
        except Exception as exc:  # noqa: BLE001 - any broker failure: undo, retry next tick
            log.error("job %s: send failed, back to the queue: %s", item.job_id, exc)
            with self._session() as session:
                undispatch(session, item.job_id, str(exc), worker_id=item.worker_id)
            return False
        log.info("job %s dispatched (dispatch %s) to %s", item.job_id, number, ", ".join(queues))
        self._count("dispatches")
        return True

    def _session(self) -> AbstractContextManager[Session]:
        """A transaction whose events and transitions are published once it commits."""
        return session_scope(self.settings.database_url, publish=self.publish)

    def preempt(self, item: policy.Preemption) -> None:
        with self._session() as session:
            asked = request_preempt(session, item.victim_id, item.for_job_id)
        if asked:
            log.info("job %s asked to yield its worker to job %s", item.victim_id, item.for_job_id)
            self._count("preemptions")

    def _count(self, name: str) -> None:
        """Best effort: a lost increment only dents a Prometheus rate, never a decision."""
        try:
            bus.count(self.client, self.keys, name)
        except RedisError as exc:
            log.warning("could not count %s: %s", name, exc)

    def record(self, state: SchedulingState, decision: policy.Plan, sent: set[int]) -> None:
        """Pending reasons into SQL (only those that changed), the queue into Redis."""
        changed = {job_id: decision.pending.get(job_id) for job_id, info in state.waiting_info.items()
                   if job_id not in sent and decision.pending.get(job_id) != info.pending_reason}
        if changed:
            with session_scope(self.settings.database_url) as session:
                set_pending_reasons(session, changed)
        # What a queue entry shows that can change; its name, team and GPUs never do. Comparing
        # this first spares building 10k entries on a tick that changed nothing.
        signature = [(job.id, job.priority, decision.position.get(job.id), decision.pending.get(job.id))
                     for job in state.cluster.waiting]
        if signature != self._published_queue:
            bus.publish_queue(self.client, self.keys, queue_snapshot(state, decision), utcnow().isoformat())
            self._published_queue = signature
        bus.mark_scheduler_pass(self.client, self.keys, utcnow().isoformat())

    def forget_gone_workers(self, state: SchedulingState, heartbeats: list[Heartbeat]) -> None:
        """A worker that stopped heartbeating leaves its private queue behind. Once no job is
        promised to it any more (the lease reaper requeues those), nothing in that queue can
        ever be claimed, so it is dropped rather than left in Redis for good."""
        live = {beat.worker_id for beat in heartbeats}
        self._gone = (self._gone | (self._live - live)) - live  # a worker that came back is not gone
        self._live = live
        promised = {job.worker_id for job in state.cluster.holding}
        promised |= {share.worker_id for job in state.cluster.holding for share in job.gang}
        done = {worker_id for worker_id in self._gone if worker_id not in promised}
        if done:
            self.client.delete(*(self.keys.worker_queue(worker_id) for worker_id in done))
            self._gone -= done

    def register_pools(self, state: SchedulingState, heartbeats: list[Heartbeat]) -> None:
        """Pools live workers serve exist; each records its largest live worker's GPU count and the
        GPUs of all its live workers together (what a submission is checked against: a job larger
        than one worker runs across several), written only when they changed from the sizes the
        pass's state read (``state.pools``)."""
        seen = sizes_from_heartbeats(heartbeats)
        if not seen:
            return
        recorded = {pool: size for pool, (_, size) in state.pools.items()}
        changed = {pool: size for pool, size in seen.items() if recorded.get(pool) != size}
        if not changed:
            return
        with session_scope(self.settings.database_url) as session:
            for pool, size in changed.items():
                record_pool(session, pool, size)

    def run(self, stop: threading.Event) -> None:
        """Tick every interval while leader; errors are logged and retried, never fatal."""
        leading = False
        try:
            while not stop.is_set():
                try:
                    now_leading = self.lock.hold()
                    if now_leading != leading:
                        # The namespace is in the line: a stack whose processes derive different
                        # ones (different database URLs) would see no workers, silently.
                        log.info("scheduler %s %s of namespace %s", self.holder,
                                 "is the leader" if now_leading else "stood down", self.keys.namespace)
                        leading = now_leading
                    if leading:
                        self.tick()
                except (RedisError, SQLAlchemyError) as exc:
                    log.warning("scheduler tick failed: %s", exc)
                except Exception:  # noqa: BLE001 - a bug in one tick must not stop scheduling
                    log.exception("scheduler tick failed")
                stop.wait(self.settings.scheduler_interval_seconds)
        finally:
            try:
                self.lock.release()
            except RedisError:
                pass
