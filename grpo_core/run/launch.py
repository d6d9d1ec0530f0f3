"""k data-parallel ranks of one job on this machine: :func:`launch_ranks` starts them, and
``grpo train --nproc-per-node k`` (:func:`run_data_parallel`) is one use of it, the service's
worker another.

The ranks are started by torch's own elastic launcher (what ``torchrun --standalone`` runs), which
also takes the whole group down when one rank fails, so a run is never left half-running. Each
rank joins a gloo (CPU) or NCCL (CUDA) process group and calls a module-level ``entry(ranks,
*args)`` with its :class:`Ranks`; the k-rank result equals the 1-process one
(``grpo_core.parallel.distributed``).

What reaches the caller when a rank fails: the launcher only knows exit codes, so each rank writes
what it raised (type, :class:`GRPOError` code, message, traceback) into the launch's own folder
before the process ends, and the caller gets :class:`RankFailed` with that rank's code, or
:class:`RankDied` for a rank process that ended without raising (a signal such as the OOM killer's
SIGKILL: the machine's fault, not the job's).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from grpo_core.errors import GRPOError, SpecError, traceback_tail
from grpo_core.parallel.distributed import Ranks
from grpo_core.parallel.placement import pick_device
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.run.lifetime import die_with_parent
from grpo_core.run.local_run import run_local
from grpo_core.run.processes import signal_name, write_whole
from grpo_core.run.trainer import TrainResult
from grpo_core.spec.run_spec import RunSpec

T = TypeVar("T")
DEFAULT_HANG_TIMEOUT = timedelta(minutes=30)
# The agent's teardown signal for the surviving ranks once one has failed: a rank that ended by
# it is collateral, never the cause.
_TEARDOWN_SIGNAL = signal.SIGTERM
_HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


class RankFailed(GRPOError):
    """A rank raised. ``code`` is its own :class:`GRPOError` code, ``rank_failed`` for any other
    exception (``rank_code`` is then None); ``exception_type`` is the qualified name of what it
    raised, ``reason`` its message and ``traceback`` its last lines."""

    code = "rank_failed"

    def __init__(self, rank: int, exception_type: str, message: str, traceback: str,
                 code: str | None = None) -> None:
        super().__init__(f"rank {rank} failed: {message}", code=code)
        self.rank, self.exception_type, self.reason, self.traceback = rank, exception_type, message, traceback
        self.rank_code = code


class RankDied(GRPOError):
    """A rank process ended without raising: killed by a signal (``signal_name``) or exited with
    ``exitcode`` before it could say why. The machine's fault, not the job's."""

    code = "rank_died"

    def __init__(self, rank: int, exitcode: int, pid: int) -> None:
        self.rank, self.exitcode, self.pid = rank, exitcode, pid
        self.signal_name = signal_name(-exitcode) if exitcode < 0 else None
        how = f"was killed by {self.signal_name}" if self.signal_name else f"exited with code {exitcode}"
        super().__init__(f"rank {rank} (process {pid}) {how}")


def check_data_parallel(spec: RunSpec, nproc: int) -> None:
    """Refuse, before any process starts, what k ranks cannot yet train exactly like one."""
    if spec.grpo.prompts_per_step % nproc:
        raise SpecError(
            "grpo.prompts_per_step",
            f"must be divisible by the number of ranks ({nproc}): each rank trains on whole groups",
        )


def run_data_parallel(
    spec: RunSpec,
    spec_dir: Path,
    output_dir: Path,
    nproc: int,
    resume: bool = False,
    device: str | None = None,
    progress: bool = True,
    hang_timeout: timedelta = DEFAULT_HANG_TIMEOUT,
    verifiers: dict[str, VerifierEndpoint] | None = None,
) -> TrainResult:
    """Train ``spec`` on ``nproc`` ranks; returns rank 0's result. A rank's failure raises
    :class:`RankFailed` or :class:`RankDied` naming the rank; so does a rank that waits longer
    than ``hang_timeout`` on the others (at the rendezvous or in a collective)."""
    check_data_parallel(spec, nproc)
    args = (spec, spec_dir, output_dir, resume, device, progress, verifiers)
    return launch_ranks(_train_rank, args, nproc, device=device, hang_timeout=hang_timeout)[0]


def _train_rank(ranks: Ranks, spec: RunSpec, spec_dir: Path, output_dir: Path, resume: bool,
                device: str | None, progress: bool, verifiers: dict[str, VerifierEndpoint] | None,
                ) -> TrainResult:
    return run_local(spec, spec_dir, output_dir, resume, device, progress, ranks, verifiers)


def launch_ranks(entry: Callable[..., T], args: Sequence[Any], nproc: int, *, device: str | None = None,
                 hang_timeout: timedelta = DEFAULT_HANG_TIMEOUT) -> list[T]:
    """Run ``entry(ranks, *args)`` in ``nproc`` new processes, one per rank, and return each
    rank's value in rank order. ``entry`` must be a module-level function; it, ``args`` and its
    value travel pickled. Ranks train on ``device`` (default: CUDA when present, rank ``i`` on
    ``cuda:i`` of the devices this process sees); a rank waiting longer than ``hang_timeout`` on
    the others fails. Raises :class:`RankFailed` or :class:`RankDied`; all ranks are gone by
    then, and they die with this process however it ends."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    folder = Path(tempfile.mkdtemp(prefix="grpo-ranks-"))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"grpo-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # a free port, as torchrun --standalone picks
        max_restarts=0,  # a failed rank fails the attempt; retrying is the caller's decision
        rdzv_timeout=int(hang_timeout.total_seconds()),
        signals_to_handle=_HANDLED_SIGNALS,
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "elastic")),  # removed with the folder
    )
    # Each rank is a fresh interpreter (the launcher's command form, as torchrun runs a script),
    # not a multiprocessing child: the caller may be a process multiprocessing will not let have
    # children (a Celery pool process is daemonic to it). The call goes through the folder.
    (folder / _CALL).write_bytes(pickle.dumps((entry, tuple(args), device, hang_timeout)))
    command = ("-c", _BOOTSTRAP, json.dumps(sys.path), str(folder), str(os.getpid()))
    # The agent installs its own handlers for these (to take the ranks down before it exits) and
    # leaves them behind; the caller's come back afterwards.
    handlers = _current_handlers()
    try:
        elastic_launch(config, sys.executable)(*command)
        return [pickle.loads((folder / _value_file(rank)).read_bytes()) for rank in range(nproc)]
    except ChildFailedError as exc:
        raise _rank_error(exc, folder) from exc
    except SignalException as exc:
        # The ranks are down; now the signal has the effect it would have had without us.
        _restore_handlers(handlers)
        shutil.rmtree(folder, ignore_errors=True)
        signal.raise_signal(exc.sigval)
        raise
    finally:
        _restore_handlers(handlers)
        shutil.rmtree(folder, ignore_errors=True)


# A rank's command: the launcher's import path first, so whatever it could import, the rank can.
_BOOTSTRAP = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
    "from grpo_core.run.launch import rank_process; rank_process(sys.argv[2], int(sys.argv[3]))"
)
_CALL = "call.pkl"


def _value_file(rank: int) -> str:
    return f"value-{rank}.pkl"


def rank_process(folder: str, parent_pid: int) -> None:
    """One rank, in a process the launcher started (rank and rendezvous in its environment):
    run the launch's call and leave the value in ``folder``, or a report of what it raised."""
    # First: loading the call imports for seconds. The launch runs in the caller's thread and
    # returns only once every rank has ended, so that thread outlives its ranks.
    die_with_parent(parent_pid)
    path, rank = Path(folder), int(os.environ["RANK"])
    try:
        entry, args, device, hang_timeout = pickle.loads((path / _CALL).read_bytes())
        cuda = pick_device(device).type == "cuda"
        local_rank = int(os.environ["LOCAL_RANK"])
        comm_device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(comm_device)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=hang_timeout)
        value = entry(Ranks(dist.get_rank(), dist.get_world_size(), comm_device), *args)
        write_whole(path / _value_file(rank), pickle.dumps(value))
    except Exception as exc:
        # Before the group goes: destroying it breaks the other ranks' collectives, and their
        # reports of that must come later than this one, the cause.
        _write_report(path, rank, exc)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _write_report(folder: Path, rank: int, exc: Exception) -> None:
    """What the rank raised, as JSON."""
    report = {
        "rank": rank,
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "code": exc.code if isinstance(exc, GRPOError) else None,
        "message": exc.message if isinstance(exc, GRPOError) else f"{type(exc).__name__}: {exc}",
        "traceback": traceback_tail(),
        "time": time.time(),
    }
    write_whole(folder / f"rank-{rank}.json", json.dumps(report).encode())


def _rank_error(exc: Any, folder: Path) -> GRPOError:
    """The cause among the failed ranks (``exc``: torch's ChildFailedError). A rank that ended
    without a report and not by the teardown signal died first: the others failed because it
    went (a collective broke) or were torn down. Otherwise the earliest report is the cause."""
    reports = {r["rank"]: r for r in (json.loads(p.read_text()) for p in folder.glob("rank-*.json"))}
    failures = sorted(exc.failures.items())
    died = [(rank, f) for rank, f in failures if rank not in reports and f.exitcode != -_TEARDOWN_SIGNAL]
    if died or not reports:
        rank, failure = died[0] if died else failures[0]
        return RankDied(rank, failure.exitcode, failure.pid)
    first = min(reports.values(), key=lambda r: r["time"])
    return RankFailed(first["rank"], first["type"], first["message"], first["traceback"], first["code"])


def _current_handlers() -> dict[signal.Signals, Any]:
    numbers = [signal.Signals[name] for name in _HANDLED_SIGNALS.split(",")]
    return {number: signal.getsignal(number) for number in numbers}


def _restore_handlers(handlers: dict[signal.Signals, Any]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # the agent installs none off the main thread
    for number, handler in handlers.items():
        if handler is not None:
            signal.signal(number, handler)
