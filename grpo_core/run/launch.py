"""k data-parallel ranks of one job on this machine: :func:`launch_ranks` starts them, and
``grpo train --nproc-per-node k`` (:func:`run_data_parallel`) is one use of it, the service's
worker another.

The ranks are started by torch's own elastic launcher (what ``torchrun --standalone`` runs), which
also takes the whole group down when one rank fails, so a run is never left half-running. Each
rank joins a gloo (CPU) or NCCL (CUDA) process group and calls a module-level ``entry(ranks,
*args)`` with its :class:`Ranks`; the k-rank result equals the 1-process one
(``grpo_core.parallel.distributed``).

The ranks may span hosts (a :class:`HostGroup` per host, every host calling :func:`launch_ranks`):
each host's agent joins one rendezvous at node 0, and global ranks follow node order.

What reaches the caller when a rank fails: :class:`RankFailed` with that rank's code,
:class:`RankDied` for a rank process that ended without raising (the machine's fault, not the
job's), or, across hosts, :class:`PeerLost` when this host's ranks only lost a peer host
(``grpo_core.run.rank_failures`` tells them apart).
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
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from grpo_core.errors import SpecError
from grpo_core.parallel.distributed import Ranks
from grpo_core.parallel.placement import pick_device
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.run import rank_server
from grpo_core.run.host_group import HostGroup
from grpo_core.run.local_run import run_local
from grpo_core.run.processes import name_process, write_whole
from grpo_core.run.rank_client import FORWARDED_SIGNALS
from grpo_core.run.rank_failures import (
    PeerLost,
    RankDied,
    RankFailed,
    qualified_name,
    rank_error,
    record_rank_pid,
    write_report,
)
from grpo_core.run.trainer import TrainResult
from grpo_core.spec.run_spec import RunSpec

T = TypeVar("T")
DEFAULT_HANG_TIMEOUT = timedelta(minutes=30)
_HANDLED_SIGNALS = ",".join(number.name for number in FORWARDED_SIGNALS)
# What failed launches raise, importable from here as before.
__all__ = ["HostGroup", "PeerLost", "RankDied", "RankFailed", "check_data_parallel", "launch_ranks",
           "rank_process", "run_data_parallel"]


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
    hosts: HostGroup | None = None,
) -> TrainResult:
    """Train ``spec`` on ``nproc`` ranks of this machine, or, with ``hosts``, on this host's
    ``nproc`` ranks of a launch across hosts (every host calls this with its own
    :class:`HostGroup`); returns this host's first rank's result (global rank 0's on node 0). A
    rank's failure raises :class:`RankFailed` or :class:`RankDied` naming the rank, a peer host's
    :class:`PeerLost`; so does a rank that waits longer than ``hang_timeout`` on the others (at
    the rendezvous or in a collective)."""
    check_data_parallel(spec, hosts.world_size if hosts else nproc)
    args = (spec, spec_dir, output_dir, resume, device, progress, verifiers)
    return launch_ranks(_train_rank, args, nproc, device=device, hang_timeout=hang_timeout, hosts=hosts)[0]


def _train_rank(ranks: Ranks, spec: RunSpec, spec_dir: Path, output_dir: Path, resume: bool,
                device: str | None, progress: bool, verifiers: dict[str, VerifierEndpoint] | None,
                ) -> TrainResult:
    return run_local(spec, spec_dir, output_dir, resume, device, progress, ranks, verifiers)


def launch_ranks(entry: Callable[..., T], args: Sequence[Any], nproc: int, *, device: str | None = None,
                 hang_timeout: timedelta = DEFAULT_HANG_TIMEOUT, hosts: HostGroup | None = None,
                 warm: bool = True) -> list[T]:
    """Run ``entry(ranks, *args)`` in ``nproc`` new processes, one per rank, and return each
    rank's value in rank order. ``entry`` must be a module-level function; it, ``args`` and its
    value travel pickled. Ranks train on ``device`` (default: CUDA when present, rank ``i`` on
    ``cuda:i`` of the devices this process sees); a rank waiting longer than ``hang_timeout`` on
    the others fails. Raises :class:`RankFailed` or :class:`RankDied`; all ranks are gone by
    then, and they die with this process however it ends.

    With ``hosts``, these ``nproc`` ranks (``hosts.local_size``) are this host's share of a launch
    across hosts: every host calls this with its own :class:`HostGroup`, node 0 hosting the
    rendezvous at ``hosts.endpoint``; the values are this host's ranks', in local-rank order. When
    this host's ranks fail only because a peer host went, the error is :class:`PeerLost`.

    ``warm``: the ranks are forked from this thread's rank server, past their imports
    (:mod:`grpo_core.run.rank_server`); else each is a fresh interpreter, as torchrun starts them."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if hosts is not None and nproc != hosts.local_size:
        raise ValueError(f"node {hosts.node_rank} of {hosts.node_sizes} starts {hosts.local_size} ranks, "
                         f"not {nproc}")
    folder = Path(tempfile.mkdtemp(prefix="grpo-ranks-"))
    config = LaunchConfig(
        min_nodes=hosts.nnodes if hosts else 1,
        max_nodes=hosts.nnodes if hosts else 1,
        nproc_per_node=nproc,
        run_id=hosts.run_id if hosts else f"grpo-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        # Alone: a free port, as torchrun --standalone picks.
        rdzv_endpoint=hosts.endpoint if hosts else "127.0.0.1:0",
        rdzv_configs=_host_configs(hosts, hang_timeout) if hosts else {},
        local_addr=hosts.local_addr if hosts else None,
        max_restarts=0,  # a failed rank fails the attempt; retrying is the caller's decision
        rdzv_timeout=int(hang_timeout.total_seconds()),
        signals_to_handle=_HANDLED_SIGNALS,
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "elastic")),  # removed with the folder
    )
    # The agent starts commands, not multiprocessing children: the caller may be a process
    # multiprocessing will not let have children (a Celery pool process is daemonic to it). Warm,
    # each is a stand-in for a rank forked from this thread's rank server, past its imports
    # (rank_server says why). The call goes through the folder.
    (folder / _CALL).write_bytes(pickle.dumps((entry, tuple(args), device, hang_timeout, hosts)))
    path = json.dumps(sys.path)
    if warm:
        command = ("-S", "-c", _STAND_IN, rank_server.address([entry.__module__]), str(os.getpid()), path,
                   f"{__name__}:rank_process", str(folder))
    else:
        command = ("-c", _FRESH, path, str(os.getpid()), str(folder))
    # The agent installs its own handlers for these (to take the ranks down before it exits) and
    # leaves them behind; the caller's come back afterwards.
    handlers = _current_handlers()
    try:
        elastic_launch(config, sys.executable)(*command)
        return [pickle.loads((folder / _value_file(local)).read_bytes()) for local in range(nproc)]
    except ChildFailedError as exc:
        raise rank_error(exc, folder, hosts.rank_offset if hosts else 0, hosts is not None) from exc
    except SignalException as exc:
        # The ranks are down; now the signal has the effect it would have had without us.
        _restore_handlers(handlers)
        shutil.rmtree(folder, ignore_errors=True)
        signal.raise_signal(exc.sigval)
        raise
    except (RendezvousError, dist.DistError) as exc:
        # The agent itself lost the others: the rendezvous or its store (hosted by node 0) went.
        if hosts is None:
            raise
        reason = str(exc) or f"not every host joined the rendezvous within {hang_timeout}"
        raise PeerLost(None, f"{type(exc).__name__}: {reason}", qualified_name(exc)) from exc
    finally:
        _restore_handlers(handlers)
        shutil.rmtree(folder, ignore_errors=True)


def _host_configs(hosts: HostGroup, hang_timeout: timedelta) -> dict[str, Any]:
    # is_host said outright: torch's guess (the endpoint names this machine) would make every
    # host of a test on one machine try to host the store. join_timeout bounds the wait for the
    # other hosts (the c10d rendezvous reads it, not rdzv_timeout: 600 s by default), read_timeout
    # how long a host started before node 0 keeps trying to reach its store (60 s by default).
    seconds = int(hang_timeout.total_seconds())
    return {"is_host": hosts.is_host, "join_timeout": seconds, "read_timeout": seconds}


# The stand-in's command: a bare interpreter (-S: not even site-packages) that finds this package
# where the launcher found it.
_STAND_IN = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
             "from grpo_core.run.rank_client import main; main()")
# A fresh rank's command: the launcher's import path first, so whatever it could import, the rank
# can; dying with the launcher before its imports, which take seconds.
_FRESH = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
          "from grpo_core.run.lifetime import die_with_parent; die_with_parent(int(sys.argv[2])); "
          "from grpo_core.run.launch import rank_process; rank_process(sys.argv[3])")
_CALL = "call.pkl"


def _value_file(local_rank: int) -> str:
    return f"value-{local_rank}.pkl"


def rank_process(folder: str) -> None:
    """One rank, with the environment the launcher gave it (its local rank and the rendezvous):
    forked from the rank server with its stand-in's, or a fresh interpreter. Run the launch's call
    and leave the value in ``folder``, or a report of what it raised."""
    path, local_rank = Path(folder), int(os.environ["LOCAL_RANK"])
    record_rank_pid(path, local_rank)
    rank = local_rank
    try:
        entry, args, device, hang_timeout, hosts = pickle.loads((path / _CALL).read_bytes())
        # Across hosts the global rank follows node order, not the rendezvous' (host_group says why);
        # the environment says so too, for any library that reads it. With the agent's store
        # every rank is a client of node 0's, so the process group takes any rank it is given.
        rank = hosts.rank_offset + local_rank if hosts else int(os.environ["RANK"])
        os.environ["RANK"] = str(rank)
        name_process(f"grpo-rank-{rank}")  # what ps and psutil call it
        world_size = int(os.environ["WORLD_SIZE"])
        cuda = pick_device(device).type == "cuda"
        comm_device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(comm_device)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=hang_timeout, rank=rank,
                                world_size=world_size)
        node_sizes = hosts.node_sizes if hosts else ()
        value = entry(Ranks(rank, world_size, comm_device, node_sizes), *args)
        write_whole(path / _value_file(local_rank), pickle.dumps(value))
    except Exception as exc:
        # Before the group goes: destroying it breaks the other ranks' collectives, and their
        # reports of that must come later than this one, the cause.
        write_report(path, local_rank, rank, exc)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _current_handlers() -> dict[signal.Signals, Any]:
    numbers = [signal.Signals[name] for name in _HANDLED_SIGNALS.split(",")]
    return {number: signal.getsignal(number) for number in numbers}


def _restore_handlers(handlers: dict[signal.Signals, Any]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # the agent installs none off the main thread
    for number, handler in handlers.items():
        if handler is not None:
            signal.signal(number, handler)
