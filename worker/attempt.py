"""The body of a job's process: train the claimed job in this process or, for a job that holds
k > 1 devices, on k ranks, and turn how that ended into the attempt's :class:`Outcome` or
:class:`Fault`. It sits above :mod:`worker.training` and :mod:`worker.ranks` (which runs the
training on each rank), so neither of those needs the other's caller. Imported only where torch
may load: the job's process.
"""

from __future__ import annotations

from pydantic import ValidationError

from api.artifacts.paths import remote_store
from api.domain.job_spec import JobSpec
from api.domain.lifecycle import JobStatus
from api.domain.serve_spec import SERVE
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.storage import StorageUnavailable
from api.store.gangs import HostPart
from api.store.jobs import capabilities_needed
from grpo_core.errors import EnvironmentUnavailable, GRPOError, traceback_tail
from grpo_core.io.model_loading import quiet_library_progress_bars
from grpo_core.parallel.distributed import SINGLE
from grpo_core.run.launch import PeerLost, RankDied
from worker.attempt_files import AttemptFiles
from worker.fencing import StaleAttempt
from worker.file_sources import release_files
from worker.heartbeat import CAPABILITY_MISSING, missing_capabilities
from worker.job_storage import STORAGE_UNAVAILABLE, fetch_resume_checkpoint
from worker.outcome import LEASE_LOST, PEER_LOST, Fault, Outcome, PartDone
from worker.ranks import train_on_ranks
from worker.retrying import DATABASE_UNAVAILABLE, DatabaseUnavailable
from worker.serving import serve_attempt
from worker.staged_artifacts import clear_staging, drop_unpublished_checkpoints, published_of
from worker.training import attempt_fence, train_reporting

__all__ = ["failure", "run_attempt"]


def run_attempt(job: JobRead, settings: Settings, worker_id: str, files: AttemptFiles,
                part: HostPart | None = None) -> Outcome | Fault | PartDone:
    """Train ``job`` and say how the attempt ended. Every failure of the job's own becomes an
    Outcome with a stable code; a machine fault (a rank process that died, the database away
    longer than the retry budget, the object store away as long, a capability the job's rewards
    need that this worker lacks, such as the code_tests sandbox) becomes a Fault."""
    quiet_library_progress_bars()
    try:
        if job.kind == SERVE:  # no training: a model loaded to answer chat requests (worker.serving)
            return serve_attempt(job, settings, files)
        spec = JobSpec.model_validate(job.spec)
        missing = missing_capabilities(capabilities_needed(spec))
        if missing:  # the machine's fault, found before the model loads: another worker can run it
            why = "; ".join(f"{capability}: {problem}" for capability, problem in missing.items())
            return Fault(f"this worker cannot offer what the job's rewards need ({why})",
                         {"error_code": CAPABILITY_MISSING, "missing": sorted(missing)}, CAPABILITY_MISSING)
        clear_staging(settings, job.id, job.attempt)  # earlier attempts' writes, never published
        # Before any rank starts: they all resume from the newest checkpoint an attempt published
        # (its row), this host's copy of it.
        published = published_of(settings, job.id).checkpoints
        store = remote_store(settings)
        if store is not None:
            fetch_resume_checkpoint(store, settings, job.id, published, job.best.step if job.best else None)
        elif part is None or part.leads:  # a gang's hosts sharing the folder: node 0 tidies it
            drop_unpublished_checkpoints(attempt_fence(job, settings), settings, job.id, published)
        try:
            if part is not None or len(job.devices or ()) > 1:
                return train_on_ranks(job, spec, settings, files, part)
            return train_reporting(job, spec, settings, files, SINGLE)
        finally:
            release_files(settings)  # the uploads it used may be evicted now
            clear_staging(settings, job.id, job.attempt + 1)
    except PeerLost as exc:  # another host's record names the cause; failing that, a lost host
        return Fault(exc.message, {"error_code": PEER_LOST}, PEER_LOST)
    except RankDied as exc:
        data = {"rank": exc.rank, "pid": exc.pid, "exitcode": exc.exitcode, "signal": exc.signal_name}
        return Fault(exc.message, data)
    except DatabaseUnavailable as exc:  # the infrastructure's fault: resume once it is back
        return Fault(str(exc), {"error_code": DATABASE_UNAVAILABLE}, DATABASE_UNAVAILABLE)
    except StorageUnavailable as exc:  # the same for the object store
        return Fault(str(exc), {"error_code": STORAGE_UNAVAILABLE}, STORAGE_UNAVAILABLE)
    except EnvironmentUnavailable as exc:  # an environment server away: resume once it is back
        return Fault(exc.message, {"error_code": exc.code}, exc.code)
    except StaleAttempt as exc:  # another attempt owns the job: nothing of this one is recorded
        return Fault(str(exc), {"error_code": LEASE_LOST}, LEASE_LOST)
    except ValidationError as exc:
        return failure("invalid_spec", f"stored spec no longer validates: {exc}")
    except GRPOError as exc:
        return failure(exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - any crash must still end the job with a record
        return failure("internal_error", f"{type(exc).__name__}: {exc}")


def failure(code: str, message: str) -> Outcome:
    """The job's own failure, with the traceback of the exception being handled."""
    return Outcome(JobStatus.FAILED, message, code, traceback_tail())
