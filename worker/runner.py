"""One attempt at a claimed job, in the Celery pool process that claimed it: supervise the job's
own process (:mod:`worker.supervisor`) and record how the attempt ended, as the attempt's last
write. Torch never loads here: the job's process trains.

What the supervisor saw becomes one of:

* the job's own outcome (succeeded, failed with its code, cancelled, preempted);
* a machine fault (a rank died, the database stayed away, the job's process was killed or
  crashed without saying why): back to the queue at once, to resume from its checkpoint, bounded
  by ``GRPO_MAX_ATTEMPTS``; a kill by the kernel's OOM killer is recorded as ``out_of_memory``;
* an ending the supervisor forced: ``stalled`` (failed), a cancel or a preemption the job did not
  honour in time (cancelled, or back to the queue);
* nothing, when the lease was lost: another attempt owns the job.

On a gang's host (:mod:`api.store.gangs`) the same, recorded by whichever host saw the cause
first, and two more: a host other than node 0 whose ranks returned only marks its part done
(node 0 records the outcome), and a host whose ranks only lost a peer on another host waits a
moment for that host's record before it requeues the job as a lost host.

The record is retried through transient database errors (:mod:`worker.retrying`; each is one
guarded transition, so a retry whose first try committed changes nothing). If the database stays
away for the whole budget the record is dropped: the lease then expires and the scheduler
requeues the job, which resumes from its checkpoint.
"""

from __future__ import annotations

import logging
import time

import redis
from sqlalchemy.exc import SQLAlchemyError

from api.artifacts.paths import remote_store
from api.domain.lifecycle import JobStatus, StopRequest
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import bus, outbox
from api.store.attempts import finish, requeue_after_fault, still_held, stop_paused
from api.store.clock import Backoff
from api.store.db import session_scope
from api.store.dispatching import yield_preempted
from api.store.gangs import HostPart, finish_host
from grpo_core.run.processes import signal_name
from worker.fencing import AttemptFence, StaleAttempt
from worker.heartbeat import JobLease
from worker.job_storage import drop_local_copies
from worker.memory import gib
from worker.outcome import (
    LEASE_LOST,
    PEER_LOST,
    STATUS_AFTER_STOP,
    Fault,
    Outcome,
    PartDone,
    outcome_for_stop,
)
from worker.retrying import DatabaseUnavailable, retry_transient
from worker.supervisor import OUT_OF_MEMORY, STALLED, Ended, stall_limit, supervise

log = logging.getLogger(__name__)


def run_claimed_job(job: JobRead, worker_id: str, settings: Settings, lease: JobLease,
                    client: redis.Redis, part: HostPart | None = None) -> str:
    """Run ``job`` (claimed by ``worker_id``, lease renewing; with ``part``, this host's part of a
    gang it claimed or joined) and return its final status, ``part_done`` for a gang host whose
    ranks returned (node 0 records the outcome), or ``lost`` when another attempt owns it now.
    Any host of a gang records an ending it saw the cause of (each record is guarded by its
    holding the job: the first wins)."""
    ended = supervise(job, settings, worker_id, lease, part)
    if ended.killed_for == LEASE_LOST:
        log.warning("job %s: lease lost; its process was killed and the job left to its new attempt", job.id)
        return "lost"
    drop_stored_copies(job, worker_id, settings, part)
    lease.stop()  # no renewal may race the outcome: it is the attempt's last write
    publish = bus.publisher(client, settings.redis_keys, settings.stream_maxlen)
    report = ended.report if ended.killed_for is None else None
    try:
        if isinstance(report, PartDone):
            return _part_done(job, worker_id, settings)
        if isinstance(report, Fault) and report.code == LEASE_LOST:  # its writes were refused: fenced
            log.warning("job %s: %s", job.id, report.message)
            return "lost"
        if isinstance(report, Fault) and report.code == PEER_LOST:
            return _after_peer_lost(job, worker_id, settings, publish, report)
        if isinstance(report, Fault):
            return _requeue(job, worker_id, settings, publish, report)
        if isinstance(report, Outcome):
            return record_outcome(job, worker_id, settings, publish, report)
        if ended.killed_for is not None:
            return record_outcome(job, worker_id, settings, publish, forced_outcome(ended, settings, job))
        return _requeue(job, worker_id, settings, publish, death_fault(ended))
    except DatabaseUnavailable as exc:
        log.error("job %s: how its attempt ended was not recorded; its lease will expire and the "
                  "scheduler requeue it: %s", job.id, exc)
        return "unrecorded"


def drop_stored_copies(job: JobRead, worker_id: str, settings: Settings, part: HostPart | None) -> None:
    """With a store apart from the artifacts folder, the attempt's local files removed once its
    process has ended (its uploads with it), whatever the outcome, while the lease still renews:
    under the attempt's fence, so an attempt that lost the job never removes the files of the one
    that owns it now on this host. Before the outcome is recorded, so a requeued job is not
    claimed again here while they go. A gang's other hosts keep theirs (they may share node 0's
    folder, and node 0 may still be storing the final model)."""
    if remote_store(settings) is None or (part is not None and not part.leads):
        return
    fence = AttemptFence(settings, job.id, job.worker_id or worker_id, job.attempt)
    try:
        fence.hold("removing the local copies", lambda: drop_local_copies(settings, job.id, job.attempt))
    except (StaleAttempt, DatabaseUnavailable) as exc:
        log.info("job %s: its local copies were kept: %s", job.id, exc)


def forced_outcome(ended: Ended, settings: Settings, job: JobRead) -> Outcome:
    """The outcome of a process the supervisor ended (not for a lost lease)."""
    at = f"after step {ended.last_step}" if ended.last_step else "before its first step"
    if ended.killed_for == STALLED:
        limit = stall_limit(job, settings)
        message = f"no step finished for {limit:.0f} s ({at}); the job's process was killed"
        return Outcome(JobStatus.FAILED, message, STALLED, step=ended.last_step)
    if ended.killed_for == OUT_OF_MEMORY:  # the job's own doing: the limit is known at submit
        message = (f"the job's processes held {gib(ended.memory_peak)}, over its memory limit of "
                   f"{gib(ended.memory_limit)} ({at}); they were killed. Lower prompts_per_step, "
                   "num_generations or the prompt and completion lengths, or ask for a pool with more")
        return Outcome(JobStatus.FAILED, message, OUT_OF_MEMORY, step=ended.last_step)
    if ended.killed_for in STATUS_AFTER_STOP:
        grace = f"did not stop within {settings.cancel_grace_seconds:.0f} s; its process was killed {at}"
        return outcome_for_stop(StopRequest(ended.killed_for), ended.last_step, killed=grace)
    raise ValueError(f"unknown reason to end a job's process: {ended.killed_for}")


def death_fault(ended: Ended) -> Fault:
    """The job's process ended without an outcome and nobody here ended it: killed from outside
    (the OOM killer, an operator) or crashed (the worker's log has its output)."""
    data = {"pid": ended.pid, "exitcode": ended.returncode, "step": ended.last_step}
    if ended.returncode < 0:
        name = signal_name(-ended.returncode)
        data["signal"] = name
        if ended.oom_killed:
            return Fault(f"out of memory: the kernel's OOM killer ended the job's process with {name}",
                         {**data, "error_code": OUT_OF_MEMORY}, OUT_OF_MEMORY)
        return Fault(f"the job's process was killed by {name}", data)
    return Fault(f"the job's process exited with code {ended.returncode} before reporting how the "
                 "attempt ended (the worker's log has its output)", data)


def record_outcome(job: JobRead, worker_id: str, settings: Settings, publish: outbox.Publish | None,
            outcome: Outcome) -> str:
    # The transition stages the final status: readers learn it after the commit, and find it
    # (and every step) in SQL.
    def record() -> bool:
        with session_scope(settings.database_url, publish=publish) as session:
            if outcome.status is JobStatus.PREEMPTED:  # checkpointed: back to the queue, to resume from it
                return yield_preempted(session, job.id, worker_id, outcome.step)
            if outcome.status is JobStatus.PAUSED:  # checkpointed: at rest until resumed
                return stop_paused(session, job.id, worker_id, outcome.step, outcome.message)
            return finish(session, job.id, worker_id=worker_id, outcome=outcome.status,
                          message=outcome.message, error_code=outcome.error_code,
                          error_message=outcome.message if outcome.error_code else None,
                          traceback=outcome.traceback) is not None

    recorded = retry_transient(record, settings.db_retry_seconds, f"job {job.id}: its outcome")
    if not recorded:
        log.warning("job %s: lease lost before its outcome (%s) was recorded", job.id, outcome.status)
        return "lost"
    log.info("job %s %s: %s", job.id, outcome.status, outcome.message)
    return outcome.status.value


def _part_done(job: JobRead, worker_id: str, settings: Settings) -> str:
    """This gang host's ranks returned: its lease need not hold while node 0 finishes."""
    def record() -> None:
        with session_scope(settings.database_url) as session:
            finish_host(session, job.id, worker_id)

    retry_transient(record, settings.db_retry_seconds, f"job {job.id}: its host's part done")
    log.info("job %s: this host's part of the gang ended; node 0 records the outcome", job.id)
    return "part_done"


def peer_grace_seconds(settings: Settings) -> float:
    """How long a gang host whose ranks lost a peer waits for the host that saw the cause to record
    it (a rank's own error, a killed rank): well within a lease, so a host that vanished without a
    record is requeued by the survivors long before its lease would expire."""
    return min(10.0, settings.lease_seconds / 2)


def _after_peer_lost(job: JobRead, worker_id: str, settings: Settings, publish: outbox.Publish,
                     fault: Fault) -> str:
    """Wait for another host's record of why the gang broke; none within the grace: the lost host
    is the machine's fault, and the job goes back to the queue to resume on a new gang."""
    deadline = time.monotonic() + peer_grace_seconds(settings)
    while time.monotonic() < deadline:
        try:
            with session_scope(settings.database_url) as session:
                if not still_held(session, job.id, worker_id, job.dispatched_at):
                    log.info("job %s: a rank on another host went away; that host recorded why", job.id)
                    return "lost"
        except SQLAlchemyError as exc:
            log.warning("job %s: could not read the job while waiting for its gang: %s", job.id, exc)
        time.sleep(0.5)
    lost = Fault(f"a host of the gang was lost ({fault.message})", {**fault.data, "error_code": PEER_LOST})
    return _requeue(job, worker_id, settings, publish, lost)


def _requeue(job: JobRead, worker_id: str, settings: Settings, publish: outbox.Publish, fault: Fault) -> str:
    """The machine's fault: back to the queue now (bounded by ``max_attempts``, after a backoff) to
    resume from its checkpoint, rather than when its lease expires."""
    def record():
        with session_scope(settings.database_url, publish=publish) as session:
            return requeue_after_fault(session, job.id, worker_id=worker_id, message=fault.message,
                                       data=fault.data, max_attempts=settings.max_attempts,
                                       backoff=Backoff.of(settings))

    moved = retry_transient(record, settings.db_retry_seconds, f"job {job.id}: its requeue")
    if moved is None:
        log.warning("job %s: lease lost before its fault was recorded (%s)", job.id, fault.message)
        return "lost"
    log.warning("job %s %s: %s", job.id, moved.status, fault.message)
    return moved.status
