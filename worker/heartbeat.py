"""Liveness, two kinds.

* :class:`WorkerHeartbeat` runs in the Celery main process and advertises the worker's pool,
  devices and the jobs on them (``api.store.bus.advertise_worker``) with a TTL, so a dead worker
  drops out of the scheduler's view on its own. It never touches CUDA: the GPU model comes from
  ``nvidia-smi``.
* :class:`JobLease` runs in the job's child process and renews the job's SQL lease; the answer
  also says whether a cancel was requested or the lease was lost (the job was requeued). It also
  marks the job's devices busy in a hash of the worker's (:func:`busy_key`), which is how the main
  process learns what its children run: each entry carries its own deadline, so a killed child's
  devices free up about as fast as a dead worker's heartbeat expires.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import replace

import redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from api.settings import Settings
from api.store import bus
from api.store.db import session_scope
from api.store.jobs import renew_lease
from api.vocabulary import Heartbeat
from worker.devices import device_count

WORKER_ID_ENV = "GRPO_WORKER_ID"
log = logging.getLogger(__name__)


class LeaseLost(Exception):  # noqa: N818 - a signal, like TrainingStopped
    """Another attempt owns the job now: stop at once, write no checkpoint, record no outcome."""


def busy_key(worker_id: str) -> str:
    """A hash, job id -> ``{"devices": [...], "until": epoch ms}``, written by each job's child
    while it runs; outside ``bus.WORKER_PREFIX`` so it is no heartbeat."""
    return f"grpo:busy:{worker_id}"


def running_jobs(client: redis.Redis, worker_id: str, gpus: int, now_ms: int) -> dict[int, list[int]]:
    """Job id -> devices, for the jobs the worker's children marked and whose mark has not
    expired; expired marks (a child killed before it could remove its own) are dropped. A job
    with no devices recorded uses the whole worker."""
    running, stale = {}, []
    for job_id, raw in client.hgetall(busy_key(worker_id)).items():
        mark = json.loads(raw)
        if mark["until"] < now_ms:
            stale.append(job_id)
        else:
            devices = mark["devices"]
            running[int(job_id)] = list(range(gpus)) if devices is None else sorted(devices)
    if stale:
        client.hdel(busy_key(worker_id), *stale)
    return running


def current_worker_id() -> str:
    """One id per worker process, kept in the environment so forked job children share it.
    Set ``GRPO_WORKER_ID`` yourself only to give a worker a stable name: two live workers must
    never share one (each would see the other's job as its own)."""
    worker_id = os.environ.get(WORKER_ID_ENV)
    if not worker_id:
        worker_id = f"{socket.gethostname()}:{os.getpid()}"
        os.environ[WORKER_ID_ENV] = worker_id
    return worker_id


def detect_gpus() -> dict[str, object]:
    """The GPU model and memory per GPU, from the driver, not CUDA: initialising CUDA in the main
    process would break forked children. ``cpu`` / None where there is no NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return {"gpu_model": "cpu", "gpu_memory_mb": None}
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return {"gpu_model": "unknown", "gpu_memory_mb": None}
    rows = [line.split(",") for line in done.stdout.splitlines() if line.strip()]
    if not rows:
        return {"gpu_model": "cpu", "gpu_memory_mb": None}
    name, _, memory = (part.strip() for part in (rows[0] + ["", ""])[:3])
    return {"gpu_model": name, "gpu_memory_mb": int(memory) if memory.isdigit() else None}


def host_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (OSError, ValueError):
        return None


class _Ticker:
    """A daemon thread calling ``beat`` every ``interval`` seconds until stopped."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def beat(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)


class WorkerHeartbeat(_Ticker):
    def __init__(self, settings: Settings, worker_id: str) -> None:
        super().__init__(settings.heartbeat_seconds, "grpo-worker-heartbeat")
        self.client = redis.Redis.from_url(settings.redis_url)
        self.worker_id = worker_id
        self.ttl = 3 * settings.heartbeat_seconds
        self.static = Heartbeat(worker_id=worker_id, pool=settings.pool, gpus=device_count(settings),
                                **detect_gpus(), memory_mb=host_memory_mb(), hostname=socket.gethostname())
        self._withdrawn = threading.Event()

    def beat(self) -> None:
        if self._withdrawn.is_set():
            return
        try:
            jobs = running_jobs(self.client, self.worker_id, self.static.gpus, int(time.time() * 1000))
            bus.advertise_worker(self.client, replace(self.static, jobs=jobs), self.ttl)
        except RedisError as exc:  # the key expires meanwhile: the scheduler sees no capacity here
            log.warning("heartbeat failed: %s", exc)

    def stop(self) -> None:
        self._withdrawn.set()
        super().stop()
        try:
            self.client.delete(bus.worker_key(self.worker_id))
        except RedisError:
            pass


class JobLease(_Ticker):
    """Renews the lease from a thread (model loading can take minutes) and on every step."""

    def __init__(self, settings: Settings, job_id: int, worker_id: str, client: redis.Redis,
                 devices: list[int] | None = None) -> None:
        super().__init__(settings.heartbeat_seconds, f"grpo-lease-{job_id}")
        self.database_url = settings.database_url
        self.job_id, self.worker_id, self.client, self.devices = job_id, worker_id, client, devices
        # Short, so a killed child's mark vanishes about as fast as a dead worker's heartbeat.
        self.busy_ttl_ms = int(3 * settings.heartbeat_seconds * 1000)
        self._lock = threading.Lock()
        self.lost = False
        self.cancel_requested = False
        self.preempt_requested = False

    def beat(self) -> None:
        try:
            with session_scope(self.database_url) as session:
                still_ours, cancel, preempt = renew_lease(session, self.job_id, self.worker_id)
        except SQLAlchemyError as exc:  # if this lasts, the lease expires and the answer is "lost"
            log.warning("lease renewal of job %s failed: %s", self.job_id, exc)
            return
        with self._lock:
            self.lost = self.lost or not still_ours
            self.cancel_requested = self.cancel_requested or cancel
            self.preempt_requested = self.preempt_requested or preempt
        if still_ours:
            mark = {"devices": self.devices, "until": int(time.time() * 1000) + self.busy_ttl_ms}
            try:
                with self.client.pipeline() as pipe:
                    pipe.hset(busy_key(self.worker_id), str(self.job_id), json.dumps(mark))
                    # The whole hash goes once no child renews it (a worker that died with its jobs).
                    pipe.pexpire(busy_key(self.worker_id), self.busy_ttl_ms)
                    pipe.execute()
            except RedisError as exc:
                log.warning("could not mark the job's devices busy: %s", exc)

    def should_stop(self) -> bool:
        """Checked before every step: a cancel or a preemption stops the trainer, which then
        checkpoints; raising on a lost lease skips that checkpoint."""
        self.beat()
        if self.lost:
            raise LeaseLost(f"job {self.job_id} is no longer leased to {self.worker_id}")
        return self.cancel_requested or self.preempt_requested

    def stop(self) -> None:
        super().stop()
        try:
            self.client.hdel(busy_key(self.worker_id), str(self.job_id))
        except RedisError:
            pass
