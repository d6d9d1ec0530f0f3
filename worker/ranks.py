"""A job that holds k > 1 devices trains on k data-parallel ranks (:func:`grpo_core.launch.launch_ranks`),
one process per device, started from the job's child.

Rank 0 alone reports, as the 1-process job does: a :class:`JobReporter` on its own Redis client
and a :class:`JobLease` that is only asked (never started: the job's child keeps renewing the
lease from its thread, and a second renewal by the same worker is harmless). So a cancel or a
preemption is seen by rank 0 before the next step and reaches every rank through the trainer's
``ranks.any(should_stop())``. The other ranks report nothing.

How an attempt on ranks ends: rank 0's :class:`Outcome`; a rank's error fails the job with that
rank's code; a lost lease in rank 0 is :class:`LeaseLost` here too; a rank process that died
without raising (:class:`RankDied`, the machine's fault) propagates for the caller to requeue.
The launcher has taken every rank down in each case.
"""

from __future__ import annotations

from datetime import timedelta

import redis

from api.lifecycle import JobStatus
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store import bus
from grpo_core.callbacks import TrainerCallback
from grpo_core.distributed import Ranks
from grpo_core.launch import RankFailed, check_data_parallel, launch_ranks
from grpo_core.models import quiet_library_progress_bars
from grpo_core.spec import JobSpec
from worker.heartbeat import JobLease, LeaseLost
from worker.reporting import JobReporter
from worker.training import Outcome, ending, train_job

_LEASE_LOST = f"{LeaseLost.__module__}.{LeaseLost.__qualname__}"


def train_on_ranks(job: JobRead, spec: JobSpec, settings: Settings, worker_id: str) -> Outcome:
    """Train ``job`` on one rank per device it holds. Raises :class:`LeaseLost` and
    :class:`grpo_core.launch.RankDied`; a spec the ranks cannot train raises SpecError first."""
    nproc = len(job.devices or ())
    check_data_parallel(spec, nproc)
    hang_timeout = timedelta(seconds=settings.rank_timeout_seconds)
    try:
        [outcome, *_] = launch_ranks(train_rank, (job, spec, settings, worker_id), nproc,
                                     hang_timeout=hang_timeout)
    except RankFailed as exc:
        if exc.exception_type == _LEASE_LOST:
            raise LeaseLost(exc.reason) from exc
        # Anything but a GRPOError is a crash, as in one process.
        return Outcome(JobStatus.FAILED, exc.message, exc.rank_code or "internal_error", exc.traceback)
    return outcome


def train_rank(ranks: Ranks, job: JobRead, spec: JobSpec, settings: Settings,
               worker_id: str) -> Outcome | None:
    """One rank, in its own process: rank 0 returns the attempt's outcome, the others None."""
    quiet_library_progress_bars()
    if not ranks.is_main:
        train_job(job, spec, settings, TrainerCallback(), ranks)
        return None
    client = redis.Redis.from_url(settings.redis_url)
    try:
        lease = JobLease(settings, job.id, worker_id, client, job.devices)
        publish = bus.publisher(client, settings.stream_maxlen)
        reporter = JobReporter(settings.database_url, job.id, publish, lease)
        return ending(train_job(job, spec, settings, reporter, ranks), lease)
    finally:
        client.close()
