"""The job's supervisor: runs in the Celery pool process that claimed the job, starts the job's
own process (:mod:`worker.job_process`), and watches it while the lease thread
(:class:`worker.heartbeat.JobLease`) renews the job's lease from here.

The supervisor never loads torch and runs no user-controlled code, so nothing a job does (a
reward stuck in a regex holding its GIL, a hung collective, a CUDA call that never returns)
can stop the lease or the watch. It ends the job's process when:

* the lease is lost (another attempt owns the job): SIGKILL at once, nothing more may be written;
* a cancel or a preemption was requested and the job has not stopped within the grace period
  (it is asked first, through :mod:`worker.attempt_files`, and normally checkpoints and returns);
* no step finished for the stall limit (``GRPO_STALL_SECONDS``, or the spec's lower
  ``stall_seconds``): the job is stalled;
* its processes hold more memory than the job may use (:mod:`worker.memory`): out of memory.

Ending is SIGTERM to the job's process group, then SIGKILL after a grace; the job's rank
processes die with it (they ask the kernel to). :func:`supervise` returns only once the process
is gone, so the job's devices stay marked busy until then.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store.gangs import HostPart
from worker.attempt_files import AttemptFiles
from worker.heartbeat import JobLease
from worker.memory import job_memory_limit, private_bytes
from worker.outcome import LEASE_LOST, Fault, Outcome, PartDone
from worker.warm_spare import start_job_process
from worker.workdir import absolute_settings, make_workdir

log = logging.getLogger(__name__)

STALLED, OUT_OF_MEMORY = "stalled", "out_of_memory"
# cgroup v2, then v1: the kernel's count of OOM kills in the worker's memory cgroup.
_OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


@dataclass
class Ended:
    """What the supervisor saw: the job's own account (``report``) if it gave one, why the
    supervisor ended the process (``killed_for``: ``lease_lost``, ``stalled``, ``out_of_memory``,
    ``cancel``, ``preempt``), its return code (negative: the signal), the last step it finished,
    whether the kernel's OOM killer struck meanwhile, and the memory the job's processes held at
    their largest against their limit (bytes)."""

    report: Outcome | Fault | PartDone | None
    killed_for: str | None
    returncode: int
    last_step: int
    oom_killed: bool = False
    pid: int = 0
    memory_peak: int = 0
    memory_limit: int = 0


def stall_limit(job: JobRead, settings: Settings) -> float:
    """The service's limit, or the spec's when lower: a spec may ask to be killed sooner, never
    to hold a device longer than the operator allows."""
    asked = (job.spec or {}).get("stall_seconds")
    return min(settings.stall_seconds, float(asked)) if asked else settings.stall_seconds


def supervise(job: JobRead, settings: Settings, worker_id: str, lease: JobLease,
              part: HostPart | None = None) -> Ended:
    """Run the attempt (or, with ``part``, this host's part of a gang's attempt) in the job's own
    process and watch it until it is gone."""
    folder = Path(tempfile.mkdtemp(prefix=f"grpo-job-{job.id}-"))
    try:
        files = AttemptFiles(folder)
        files.write_call(job, absolute_settings(settings), worker_id, part)
        return _Watch(job, settings, lease, files, None if part is None else len(part.devices)).run()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _Watch:
    def __init__(self, job: JobRead, settings: Settings, lease: JobLease, files: AttemptFiles,
                 devices_here: int | None = None) -> None:
        self.job, self.settings, self.lease, self.files = job, settings, lease, files
        self.stall_seconds = stall_limit(job, settings)
        self.poll_seconds = min(0.5, settings.heartbeat_seconds)
        self.last_step = job.last_step
        self.stop_asked_at: float | None = None
        self.memory_limit, self.memory_peak = job_memory_limit(job, settings, devices_here), 0

    def run(self) -> Ended:
        oom_before = oom_kills()
        # A session of its own, so the whole group can be signalled; the job's process asks the
        # kernel to kill it if this process dies (grpo_core.run.lifetime), this thread being the
        # pool process's main thread, which outlives it.
        # In an empty folder of its own (worker.workdir): no relative name reaches the worker's.
        self.files.mark_supervised(self.lease.beats)
        self.lease.on_beat = self.files.mark_supervised
        # The warm spare when there is one (worker.warm_spare): the same process, past its imports.
        process = start_job_process(self.files.folder, make_workdir(self.files.folder),
                                    self.settings.warm_job_process)
        self.lease.track_process(process.pid)
        log.info("job %s: process %s started", self.job.id, process.pid)
        killed_for, seen = None, None
        last_progress = time.monotonic()
        while process.poll() is None:
            now = time.monotonic()
            progress = self.files.progress()
            if progress is not None and progress != seen:
                seen, last_progress = progress, now
                self.last_step = progress[0]
            self.memory_peak = max(self.memory_peak, private_bytes(process.pid))
            killed_for = self._reason_to_end(now, last_progress)
            if killed_for is not None:
                log.warning("job %s: ending its process %s (%s)", self.job.id, process.pid, killed_for)
                # No grace where more time only does harm: another attempt owns the job, or memory grows.
                end_process(process, self.settings.kill_grace_seconds,
                            term_first=killed_for not in (LEASE_LOST, OUT_OF_MEMORY))
                break
            try:
                process.wait(timeout=self.poll_seconds)
            except subprocess.TimeoutExpired:
                pass
        returncode = process.wait()
        self.lease.on_beat = None
        report = self.files.read_outcome()
        progress = self.files.progress()
        self.last_step = progress[0] if progress is not None else self.last_step
        return Ended(report, killed_for, returncode, self.last_step,
                     oom_killed=returncode == -signal.SIGKILL and oom_kills() > oom_before, pid=process.pid,
                     memory_peak=self.memory_peak, memory_limit=self.memory_limit)

    def _reason_to_end(self, now: float, last_progress: float) -> str | None:
        if self.lease.lost:
            return LEASE_LOST
        asked = self.lease.asked
        if asked is not None:
            self.files.request_stop(asked)
            if self.stop_asked_at is None:
                self.stop_asked_at = now
                log.info("job %s: %s requested; asking its process to stop", self.job.id, asked)
            elif now - self.stop_asked_at > self.settings.cancel_grace_seconds:
                return self.files.stop_reason() or asked
        if now - last_progress > self.stall_seconds:
            return STALLED
        if self.memory_peak > self.memory_limit:
            return OUT_OF_MEMORY
        return None


def end_process(process: subprocess.Popen, kill_grace: float, *, term_first: bool = True) -> None:
    """SIGTERM to the process's group, then SIGKILL if it is still there after ``kill_grace``
    seconds (or at once without ``term_first``: a job that lost its lease may write nothing more).
    Returns once the process is gone."""
    if term_first:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=kill_grace)
            return
        except subprocess.TimeoutExpired:
            pass
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(pid: int, number: signal.Signals) -> None:
    try:
        os.killpg(pid, number)
    except ProcessLookupError:
        pass


def oom_kills() -> int:
    """The OOM killer's count for this cgroup (0 where the kernel does not say)."""
    for path in _OOM_COUNTERS:
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill" and value.strip().isdigit():
                    return int(value)
        except OSError:
            continue
    return 0
