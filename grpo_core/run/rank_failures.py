"""What a launch raises when its ranks fail, and how the cause is picked among the failed ranks.

The launcher only knows exit codes, so each rank writes what it raised (type, :class:`GRPOError`
code, message, traceback, and whether it was a communication failure) into the launch's folder
before its process ends (:func:`write_report`); :func:`rank_error` reads those reports back.
Three kinds of cause, in the order they win on one host:

* :class:`RankDied`: a local rank process ended without raising (a signal such as the OOM
  killer's SIGKILL): the machine's fault, not the job's;
* :class:`RankFailed`: a local rank raised the job's own error;
* :class:`PeerLost`: across hosts, every local rank that raised lost the others (a collective's
  connection closed, the store went): a peer host's fault or its network's. The host where the
  cause happened reports it; this one only says it lost its peers.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from grpo_core.errors import GRPOError, traceback_tail
from grpo_core.run.processes import signal_name, write_whole

# The agent's teardown signal for the surviving ranks once one has failed: a rank that ended by
# it is collateral, never the cause.
TEARDOWN_SIGNAL = signal.SIGTERM


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


class PeerLost(GRPOError):
    """This host's ranks lost a peer host: each that raised, raised a communication failure (or
    the agent lost the rendezvous' store), none the job's own error and none died. ``local_rank``
    is the first such rank (None when the agent, not a rank, noticed); ``reason`` what it saw,
    ``exception_type`` the qualified name of what was raised."""

    code = "peer_lost"

    def __init__(self, local_rank: int | None, message: str, exception_type: str) -> None:
        where = "the launcher" if local_rank is None else f"local rank {local_rank}"
        super().__init__(f"{where} lost its peers on the other hosts: {message}")
        self.local_rank, self.reason, self.exception_type = local_rank, message, exception_type


def qualified_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


# Gloo's transport raises a plain RuntimeError whose message starts with its source location, e.g.
# "[.../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:32456: Connection
# reset by peer" (seen with torch 2.13 when the peer's process was SIGKILLed mid all_reduce), or
# "... unbound_buffer.cc ...] Timed out waiting ... for recv operation" for a frozen peer; while
# the group is being made, wrapped: "Gloo connectFullMesh failed with [.../gloo/transport/tcp/
# pair.cc:553] Connection closed by peer" (seen when a peer left right after joining).
_GLOO_TRANSPORT = "gloo/transport/"


def is_communication_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the other ranks went, not what this rank was doing: torch's
    distributed errors (the store unreachable, NCCL's DistBackendError for a peer that went, a
    collective past its timeout) and gloo's transport errors (a connection closed or reset)."""
    return isinstance(exc, dist.DistError) or (
        type(exc) is RuntimeError and _GLOO_TRANSPORT in str(exc).split("]", 1)[0]
    )


def write_report(folder: Path, local_rank: int, rank: int, exc: Exception) -> None:
    """What the rank raised, as JSON."""
    report = {
        "local_rank": local_rank,
        "rank": rank,
        "type": qualified_name(exc),
        "code": exc.code if isinstance(exc, GRPOError) else None,
        "message": exc.message if isinstance(exc, GRPOError) else f"{type(exc).__name__}: {exc}",
        "traceback": traceback_tail(),
        "communication": is_communication_failure(exc),
        "time": time.time(),
    }
    write_whole(folder / f"rank-{local_rank}.json", json.dumps(report).encode())


def record_rank_pid(folder: Path, local_rank: int) -> None:
    """The rank's own pid, which the launcher's failure records do not hold: they name the
    stand-in the agent started for it (:mod:`grpo_core.run.rank_server`)."""
    write_whole(folder / f"pid-{local_rank}", str(os.getpid()).encode())


def rank_pid(folder: Path, local_rank: int) -> int | None:
    try:
        return int((folder / f"pid-{local_rank}").read_text())
    except (OSError, ValueError):
        return None


def rank_error(exc: Any, folder: Path, rank_offset: int, across_hosts: bool) -> GRPOError:
    """The cause among this host's failed ranks (``exc``: torch's ChildFailedError; its failures
    name local ranks, this host's first being global rank ``rank_offset``). A rank that ended
    without a report and not by the teardown signal died first: the others failed because it
    went (a collective broke) or were torn down. Otherwise the earliest report of the job's own
    error is the cause; across hosts, reports of communication failures alone mean a peer went."""
    reports = {r["local_rank"]: r for r in (json.loads(p.read_text()) for p in folder.glob("rank-*.json"))}
    failures = sorted((f.local_rank, f) for f in exc.failures.values())
    died = [(local, f) for local, f in failures if local not in reports and f.exitcode != -TEARDOWN_SIGNAL]
    if died or not reports:
        local, failure = died[0] if died else failures[0]
        return RankDied(rank_offset + local, failure.exitcode, rank_pid(folder, local) or failure.pid)
    own = [r for r in reports.values() if not (across_hosts and r["communication"])]
    if not own:
        first = min(reports.values(), key=lambda r: r["time"])
        return PeerLost(first["local_rank"], first["message"], first["type"])
    first = min(own, key=lambda r: r["time"])
    return RankFailed(first["rank"], first["type"], first["message"], first["traceback"], first["code"])
