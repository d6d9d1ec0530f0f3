"""Liveness, two kinds.

* :class:`WorkerHeartbeat` runs in the Celery main process and advertises the worker's pool,
  devices and the jobs on them (``api.store.bus.advertise_worker``) with a TTL, so a dead worker
  drops out of the scheduler's view on its own. It never touches CUDA: the GPU model comes from
  ``nvidia-smi``. It also notices a pool process that died under its job (Celery's
  WorkerLostError: the OOM killer, a crash) and sends that job back to the queue at once,
  rather than after its lease expires.
* :class:`JobLease` runs in the pool process that supervises a job (:mod:`worker.supervisor`) and
  renews the job's SQL lease; the answer also says whether a cancel was requested or the lease
  was lost (the job was requeued). It also marks the job's devices busy in a hash of the worker's
  (``RedisKeys.busy``), with the pids of the supervisor and of the job's process, which is how the
  main process learns what its children run: each mark carries its own deadline, and a mark whose
  processes are all gone frees its devices at once.
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
from collections.abc import Callable
from dataclasses import replace

import redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from api.domain.lifecycle import StopRequest, stronger_stop
from api.settings import Settings
from api.store import bus
from api.store.attempts import renew_host_lease, renew_lease, requeue_after_fault
from api.store.clock import Backoff, db_now
from api.store.db import session_scope
from api.vocabulary import Heartbeat
from grpo_core.rewards.sandbox import CAPABILITY as SANDBOX
from grpo_core.rewards.sandbox import check_sandbox
from grpo_core.run.processes import process_alive
from worker.devices import device_count

WORKER_ID_ENV = "GRPO_WORKER_ID"
log = logging.getLogger(__name__)


# A worker's busy marks (``RedisKeys.busy``): a hash, job id -> ``{"devices": [...], "until": epoch
# ms, "pid": supervisor, "job_pid": job's process}``, written by each job's supervisor while it runs.


def running_jobs(client: redis.Redis, busy_key: str, gpus: int, now_ms: int) -> dict[int, list[int]]:
    """Job id -> devices, for the jobs the worker's children marked and whose mark has not
    expired nor outlived its processes; such marks (a child killed before it could remove its
    own) are dropped. A job with no devices recorded uses the whole worker."""
    running, stale = {}, []
    for job_id, mark in _marks(client, busy_key).items():
        if mark["until"] < now_ms or not any(process_alive(pid) for pid in _pids(mark)):
            stale.append(job_id)
        else:
            devices = mark["devices"]
            running[job_id] = list(range(gpus)) if devices is None else sorted(devices)
    if stale:
        client.hdel(busy_key, *map(str, stale))
    return running


def orphaned_jobs(client: redis.Redis, busy_key: str) -> dict[int, int]:
    """Job id -> pid, for the marks whose supervising pool process is gone: its job's attempt
    ended without a record (the job's own process dies with it)."""
    return {job_id: mark["pid"] for job_id, mark in _marks(client, busy_key).items()
            if mark.get("pid") and not process_alive(mark["pid"])}


def _marks(client: redis.Redis, busy_key: str) -> dict[int, dict]:
    return {int(job_id): json.loads(raw) for job_id, raw in client.hgetall(busy_key).items()}


def _pids(mark: dict) -> list[int]:
    pids = [mark.get("pid"), mark.get("job_pid")]
    return [pid for pid in pids if pid] or [os.getpid()]  # a mark without pids: trust its deadline


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


def probe_code_sandbox() -> str | None:
    """The sandbox's check, with which of its protections hold in the worker's log (the optional
    ones too, e.g. a cgroup per run, so an operator sees what a delegated cgroup would add)."""
    check = check_sandbox()
    if check.protections:
        log.info("code sandbox protections %s", check.describe())
    return check.problem


# What this host can run besides models, each with its real check (None: it works, else why not;
# a real check at each call, never a cached answer).
_CAPABILITY_PROBES: dict[str, Callable[[], str | None]] = {SANDBOX: probe_code_sandbox}


def capability_problems() -> dict[str, str | None]:
    """Each capability with why this host cannot offer it (None: it can), checked now."""
    return {capability: probe() for capability, probe in _CAPABILITY_PROBES.items()}


def worker_capabilities() -> list[str]:
    """The capabilities whose check passes here, so a spec that needs one is accepted only where it
    works; each failed check is logged (this is the worker's start)."""
    offered = []
    for capability, problem in capability_problems().items():
        if problem is None:
            offered.append(capability)
        else:
            log.warning("this worker will not advertise %s: %s", capability, problem)
    return offered


# Why a job's attempt ended before it began: the worker lacks what the job's rewards need.
CAPABILITY_MISSING = "capability_missing"


def missing_capabilities(needed: list[str]) -> dict[str, str]:
    """Each of ``needed`` this process cannot offer, with why: checked for real here, since the
    scheduler went by the worker's heartbeat, which may be stale or from another host (a worker id
    set by hand) or no longer true. Nothing is probed when nothing is needed."""
    problems = {capability: _CAPABILITY_PROBES[capability]() if capability in _CAPABILITY_PROBES
                else "no such capability here" for capability in needed}
    return {capability: problem for capability, problem in problems.items() if problem is not None}


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


class _CapabilityCheck(_Ticker):
    """Runs the heartbeat's capability checks again in a thread of their own: a check is a real
    sandboxed run, which may take up to its wall limit, and the heartbeat that keeps the worker
    visible (a TTL of a few seconds) must never wait for it."""

    def __init__(self, heartbeat: WorkerHeartbeat) -> None:
        super().__init__(heartbeat.capability_recheck_seconds, "grpo-worker-capabilities")
        self.heartbeat = heartbeat

    def beat(self) -> None:
        self.heartbeat.recheck_capabilities()

    def start(self) -> None:
        self._thread.start()  # no check at once: the worker's start just made one


class WorkerHeartbeat(_Ticker):
    # How often the capabilities are checked again after the start: a sandbox can break while the
    # worker runs (bubblewrap removed, user namespaces turned off); until the heartbeat says so,
    # the scheduler keeps sending such jobs here and each comes back as capability_missing. A
    # check is one short sandboxed run, so every few minutes costs nothing.
    capability_recheck_seconds = 300.0

    def __init__(self, settings: Settings, worker_id: str) -> None:
        super().__init__(settings.heartbeat_seconds, "grpo-worker-heartbeat")
        self.settings = settings
        self.client = bus.connect(settings)
        self.keys = settings.redis_keys
        self.worker_id = worker_id
        self.busy_key = self.keys.busy(worker_id)
        self.ttl = 3 * settings.heartbeat_seconds
        self.static = Heartbeat(worker_id=worker_id, pool=settings.pool, gpus=device_count(settings),
                                **detect_gpus(), memory_mb=host_memory_mb(), hostname=socket.gethostname(),
                                address=settings.worker_address,
                                capabilities=worker_capabilities())
        self._withdrawn = threading.Event()
        self._capability_check: _CapabilityCheck | None = None  # started with the heartbeat
        warm_up_database(settings.database_url)

    def beat(self) -> None:
        if self._withdrawn.is_set():
            return
        try:
            self._requeue_orphans()
            jobs = running_jobs(self.client, self.busy_key, self.static.gpus, int(time.time() * 1000))
            bus.advertise_worker(self.client, self.keys, replace(self.static, jobs=jobs), self.ttl)
        except RedisError as exc:  # the key expires meanwhile: the scheduler sees no capacity here
            log.warning("heartbeat failed: %s", exc)

    def recheck_capabilities(self) -> None:
        """Advertise from the next beat on what the capabilities' checks say now, logging each one
        lost (with why) or regained (every ``capability_recheck_seconds``, from its own thread)."""
        problems = capability_problems()
        offered = [capability for capability, problem in problems.items() if problem is None]
        before = set(self.static.capabilities)
        for capability in sorted(before - set(offered)):
            log.warning("this worker no longer advertises %s: %s", capability, problems[capability])
        for capability in sorted(set(offered) - before):
            log.warning("this worker advertises %s again: its check passes", capability)
        self.static = replace(self.static, capabilities=offered)

    def _requeue_orphans(self) -> None:
        """A pool process died under its job (this process is its parent, so it sees at once):
        the job goes back to the queue now, bounded by the attempt limit."""
        for job_id, pid in orphaned_jobs(self.client, self.busy_key).items():
            message = f"the worker's process for the job (pid {pid}) died"
            try:
                with session_scope(self.settings.database_url) as session:
                    moved = requeue_after_fault(session, job_id, worker_id=self.worker_id, message=message,
                                                data={"pid": pid}, max_attempts=self.settings.max_attempts,
                                                backoff=Backoff.of(self.settings))
            except SQLAlchemyError as exc:  # tried again next beat; the lease expires meanwhile anyway
                log.warning("could not requeue job %s after its process died: %s", job_id, exc)
                continue
            log.warning("job %s: %s; %s", job_id, message, moved.status if moved else "no longer ours")
            self.client.hdel(self.busy_key, str(job_id))

    def start(self) -> None:
        super().start()
        self._capability_check = _CapabilityCheck(self)
        self._capability_check.start()

    def stop(self) -> None:
        self._withdrawn.set()
        if self._capability_check is not None:
            self._capability_check.stop()
        super().stop()
        try:
            self.client.delete(self.keys.worker(self.worker_id))
        except RedisError:
            pass


def warm_up_database(url: str) -> None:
    """Import the database driver and connect once, from the main thread, before the heartbeat
    thread can: Celery forks a new pool process whenever one dies, and a fork while that thread is
    in the middle of the driver's first import leaves the child waiting forever on the module's
    import lock (the replacement pool process then never runs a task)."""
    try:
        with session_scope(url) as session:
            db_now(session)
    except SQLAlchemyError as exc:  # imported all the same; the heartbeat retries its own writes
        log.warning("database not reachable at worker start: %s", exc)


class JobLease(_Ticker):
    """Renews the lease from a thread of the supervising process, whatever the job's process is
    doing (loading a model for minutes, or stuck)."""

    def __init__(self, settings: Settings, job_id: int, worker_id: str, client: redis.Redis,
                 devices: list[int] | None = None, *, gang_host: bool = False) -> None:
        super().__init__(settings.heartbeat_seconds, f"grpo-lease-{job_id}")
        # A gang's host other than node 0 renews its own row's lease; node 0 renews the job's.
        self._renew = renew_host_lease if gang_host else renew_lease
        self.database_url, self.lease_seconds = settings.database_url, settings.lease_seconds
        self.job_id, self.worker_id, self.client, self.devices = job_id, worker_id, client, devices
        self.busy_key = settings.redis_keys.busy(worker_id)
        # Short, so a killed child's mark vanishes about as fast as a dead worker's heartbeat.
        self.busy_ttl_ms = int(3 * settings.heartbeat_seconds * 1000)
        self._lock = threading.Lock()
        self.job_pid: int | None = None
        self.lost = False
        self.asked: StopRequest | None = None  # the strongest stop asked for so far
        # Told of every beat, so the job's process sees its supervisor alive (worker.attempt_files).
        self.on_beat: Callable[[int], None] | None = None
        self.beats = 0

    def beat(self) -> None:
        self.beats += 1
        if self.on_beat is not None and not self.lost:
            try:
                self.on_beat(self.beats)  # alive, whatever the database answers
            except OSError as exc:  # its folder gone with its process: nobody is told any more
                log.warning("job %s: could not tell its process of the lease: %s", self.job_id, exc)
        try:
            with session_scope(self.database_url) as session:
                # Frozen before its commit (a stopped worker), it holds the job's row no longer
                # than the lease, or the reaper's requeue would wait on it as long.
                still_ours, asked = self._renew(session, self.job_id, self.worker_id, self.lease_seconds)
        except SQLAlchemyError as exc:  # if this lasts, the lease expires and the answer is "lost"
            log.warning("lease renewal of job %s failed: %s", self.job_id, exc)
            return
        with self._lock:
            self.lost = self.lost or not still_ours
            self.asked = stronger_stop(self.asked, asked)
        if still_ours:
            mark = {"devices": self.devices, "until": int(time.time() * 1000) + self.busy_ttl_ms,
                    "pid": os.getpid(), "job_pid": self.job_pid}
            try:
                with self.client.pipeline() as pipe:
                    pipe.hset(self.busy_key, str(self.job_id), json.dumps(mark))
                    # The whole hash goes once no child renews it (a worker that died with its jobs).
                    pipe.pexpire(self.busy_key, self.busy_ttl_ms)
                    pipe.execute()
            except RedisError as exc:
                log.warning("could not mark the job's devices busy: %s", exc)

    def track_process(self, pid: int) -> None:
        """The job's process: its devices stay marked busy until it is gone too."""
        self.job_pid = pid
        self.beat()

    def stop(self) -> None:
        super().stop()
        try:
            self.client.hdel(self.busy_key, str(self.job_id))
        except RedisError:
            pass
