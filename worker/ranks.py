"""A job that holds k > 1 devices trains on k data-parallel ranks (:func:`grpo_core.run.launch.launch_ranks`),
one process per device, started from the job's process; a job spanning hosts (a gang) runs each
host's share of its ranks from that host's job process, all of them one process group.

Rank 0 alone reports, as the 1-process job does (:func:`worker.training.train_reporting`): to SQL
and the job's stream, and to the supervisor (progress, and its stop request read before every
step). A cancel or a preemption is thus seen by rank 0 and reaches every rank through the
trainer's ``ranks.any(should_stop())``. The other ranks report nothing.

How an attempt on ranks ends: rank 0's :class:`Outcome`; a rank's error fails the job with that
rank's code; a rank process that died without raising (:class:`grpo_core.run.launch.RankDied`, the
machine's fault) propagates for the caller to requeue. The launcher has taken every rank down in
each case.
"""

from __future__ import annotations

from datetime import timedelta

from api.domain.job_spec import JobSpec
from api.domain.lifecycle import JobStatus
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.storage import StorageUnavailable
from api.store.gangs import HostPart
from grpo_core.io.model_loading import quiet_library_progress_bars
from grpo_core.parallel.distributed import Ranks
from grpo_core.run.callbacks import TrainerCallback
from grpo_core.run.launch import RankFailed, check_data_parallel, launch_ranks
from worker.attempt_files import AttemptFiles
from worker.fencing import StaleAttempt
from worker.outcome import Outcome, PartDone
from worker.rendezvous import meet
from worker.retrying import DatabaseUnavailable
from worker.training import SupervisorLink, train_job, train_reporting

_DATABASE_UNAVAILABLE = f"{DatabaseUnavailable.__module__}.{DatabaseUnavailable.__qualname__}"
_STORAGE_UNAVAILABLE = f"{StorageUnavailable.__module__}.{StorageUnavailable.__qualname__}"
_STALE_ATTEMPT = f"{StaleAttempt.__module__}.{StaleAttempt.__qualname__}"


def train_on_ranks(job: JobRead, spec: JobSpec, settings: Settings, files: AttemptFiles,
                   part: HostPart | None = None) -> Outcome | PartDone:
    """Train ``job`` on one rank per device it holds on this host, or for a gang (``part``) on this
    host's share of the gang's ranks, which meet the other hosts' at node 0's rendezvous
    (:mod:`worker.rendezvous`). Node 0 (or a job on one host) returns the attempt's Outcome, any
    other host of a gang :class:`PartDone`. Raises :class:`grpo_core.run.launch.RankDied`,
    :class:`grpo_core.run.launch.PeerLost` (a rank on another host went away), or
    :class:`worker.retrying.DatabaseUnavailable` when rank 0 could not reach the database; a spec
    the ranks cannot train raises SpecError first."""
    nproc = len(part.devices if part is not None else job.devices or ())
    check_data_parallel(spec, nproc if part is None else sum(part.node_sizes))
    hang_timeout = timedelta(seconds=settings.rank_timeout_seconds)
    hosts = None if part is None else meet(job, settings, part)
    try:
        args = (job, spec, settings, files, part)
        [outcome, *_] = launch_ranks(train_rank, args, nproc, hang_timeout=hang_timeout, hosts=hosts,
                                     warm=settings.warm_job_process)
    except RankFailed as exc:
        if exc.exception_type == _DATABASE_UNAVAILABLE:  # rank 0 lost the database: not the job's fault
            raise DatabaseUnavailable(exc.reason) from exc
        if exc.exception_type == _STORAGE_UNAVAILABLE:  # nor the object store
            raise StorageUnavailable(exc.reason) from exc
        if exc.exception_type == _STALE_ATTEMPT:  # another attempt owns the job
            raise StaleAttempt(exc.reason) from exc
        # Anything but a GRPOError is a crash, as in one process.
        return Outcome(JobStatus.FAILED, exc.message, exc.rank_code or "internal_error", exc.traceback)
    return PartDone() if part is not None and not part.leads else outcome


def train_rank(ranks: Ranks, job: JobRead, spec: JobSpec, settings: Settings,
               files: AttemptFiles, part: HostPart | None = None) -> Outcome | None:
    """One rank, in its own process: rank 0 returns the attempt's outcome, the others None. The
    first rank of a gang's other host keeps that host's supervisor informed (progress for its
    watchdog, its stop request), as rank 0 does node 0's; it reports nothing else."""
    quiet_library_progress_bars()
    if ranks.is_main:
        return train_reporting(job, spec, settings, files, ranks)
    first_here = part is not None and ranks.rank == part.rank_offset
    link = SupervisorLink(files, job.last_step) if first_here else TrainerCallback()
    train_job(job, spec, settings, link, ranks)
    return None
