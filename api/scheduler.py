"""``grpo scheduler``: moves queued jobs onto Celery only when a worker of the job's pool is free.

Order is ours, not the broker's FIFO: priority (high > normal > low), then age (id). Capacity is
what live workers advertise (``api.bus.live_workers``); a worker runs one job at a time, so a free
worker is one with no job running on it (per SQL) and not already promised to a dispatched job.

One leader at a time: a Redis lock (``SET NX PX``, renewed and released by compare-and-set), so
it works whatever the SQL database is. Two leaders overlapping for a moment still cannot both
dispatch a job: the ``queued → dispatched`` transition is guarded. This module never imports the
worker's task modules; it sends by name.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections import defaultdict
from typing import Any

import redis
from celery import Celery
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from api import bus
from api.db import session_scope
from api.models import utcnow
from api.schemas import JobRead
from api.settings import Settings
from api.store.jobs import list_jobs, requeue_expired, transition
from api.task_names import RUN_JOB, pool_queue

LEADER_KEY = "grpo:scheduler:leader"
PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}
WAITING_STATUSES = ("queued", "preempted")
PAGE = 500
log = logging.getLogger(__name__)

_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
          "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0")
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class LeaderLock:
    def __init__(self, client: redis.Redis, holder: str, ttl_seconds: float) -> None:
        self.client, self.holder, self.ttl_ms = client, holder, int(ttl_seconds * 1000)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def hold(self) -> bool:
        """Renew if we hold the lock, else try to take it; True when we are the leader now."""
        if self._renew(keys=[LEADER_KEY], args=[self.holder, self.ttl_ms]):
            return True
        return bool(self.client.set(LEADER_KEY, self.holder, nx=True, px=self.ttl_ms))

    def release(self) -> None:
        self._release(keys=[LEADER_KEY], args=[self.holder])


def celery_client(settings: Settings) -> Celery:
    """A producer-only Celery app: it knows the broker and task names, no task code."""
    app = Celery("grpo_scheduler", broker=settings.redis_url, set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=True, task_ignore_result=True)
    return app


def all_jobs(session: Session, statuses: tuple[str, ...]) -> list[JobRead]:
    """Every job in ``statuses``, id order, read page by page through the store."""
    jobs: list[JobRead] = []
    while True:
        page = list_jobs(session, None, statuses, after=jobs[-1].id if jobs else 0, limit=PAGE)
        jobs.extend(page)
        if len(page) < PAGE:
            return jobs


def free_workers(workers: list[dict[str, Any]], active: list[JobRead]) -> dict[str, list[int]]:
    """Per pool, the GPU counts of idle workers, smallest first, less those promised to jobs
    already dispatched but not yet claimed."""
    busy = {job.worker_id for job in active if job.status != "dispatched"}
    free: dict[str, list[int]] = defaultdict(list)
    for worker in workers:
        if worker.get("worker_id") not in busy and not worker.get("running_job"):
            free[worker.get("pool", "default")].append(int(worker.get("gpus", 1)))
    for gpus in free.values():
        gpus.sort()
    for job in active:
        if job.status == "dispatched":
            take_worker(free[job.pool], job.gpus)
    return free


def take_worker(free_gpus: list[int], needed: int) -> bool:
    """Take the smallest free worker with at least ``needed`` GPUs (big workers stay for big jobs)."""
    for index, gpus in enumerate(free_gpus):
        if gpus >= needed:
            del free_gpus[index]
            return True
    return False


class Scheduler:
    def __init__(self, settings: Settings, client: redis.Redis | None = None,
                 sender: Celery | None = None) -> None:
        self.settings = settings
        self.client = client or redis.Redis.from_url(settings.redis_url)
        self.sender = sender or celery_client(settings)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lock = LeaderLock(self.client, self.holder, max(5.0, 10 * settings.scheduler_interval_seconds))

    def tick(self) -> list[int]:
        """Reap expired leases, then dispatch what fits; the ids dispatched, in order."""
        url = self.settings.database_url
        with session_scope(url) as session:
            for job_id in requeue_expired(session, self.settings.lease_seconds):
                log.warning("job %s: lease expired, back to the queue", job_id)
        workers = bus.live_workers(self.client)
        with session_scope(url) as session:
            active = all_jobs(session, ("dispatched", "running", "cancelling"))
            waiting = all_jobs(session, WAITING_STATUSES)
        free = free_workers(workers, active)
        waiting.sort(key=lambda job: (PRIORITY_RANK.get(job.priority, 1), job.id))
        sent = []
        for job in waiting:
            if take_worker(free[job.pool], job.gpus) and self.dispatch(job):
                sent.append(job.id)
        return sent

    def dispatch(self, job: JobRead) -> bool:
        """Commit ``dispatched`` first, then send: a worker never sees a job SQL does not know."""
        with session_scope(self.settings.database_url) as session:
            moved = transition(session, job.id, WAITING_STATUSES, "dispatched", "dispatched",
                               f"dispatched to pool {job.pool}", {"pool": job.pool}, dispatched_at=utcnow())
        if not moved:
            return False
        try:
            self.sender.send_task(RUN_JOB, args=[job.id], queue=pool_queue(job.pool))
        except Exception as exc:  # noqa: BLE001 - any broker failure: undo, retry next tick
            log.error("job %s: send failed, back to the queue: %s", job.id, exc)
            with session_scope(self.settings.database_url) as session:
                transition(session, job.id, ("dispatched",), "queued", "dispatch_failed", str(exc),
                           level="warning", dispatched_at=None)
            return False
        log.info("job %s dispatched to %s", job.id, pool_queue(job.pool))
        return True

    def run(self, stop: threading.Event) -> None:
        """Tick every interval while leader; errors are logged and retried, never fatal."""
        leading = False
        try:
            while not stop.is_set():
                try:
                    now_leading = self.lock.hold()
                    if now_leading != leading:
                        log.info("scheduler %s %s", self.holder,
                                 "is the leader" if now_leading else "stood down")
                        leading = now_leading
                    if leading:
                        self.tick()
                except (RedisError, SQLAlchemyError) as exc:
                    log.warning("scheduler tick failed: %s", exc)
                stop.wait(self.settings.scheduler_interval_seconds)
        finally:
            try:
                self.lock.release()
            except RedisError:
                pass
