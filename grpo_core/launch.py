"""``grpo train --nproc-per-node k``: one job trained by k data-parallel ranks on this machine.

The ranks are started by torch's own elastic launcher (what ``torchrun --standalone`` runs), which
also takes the whole group down when one rank fails, so a run is never left half-running. Each
rank joins a gloo (CPU) or NCCL (CUDA) process group and runs :func:`run_local` with its
:class:`Ranks`; the result equals the 1-process run's (``grpo_core.distributed``).
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from grpo_core.distributed import Ranks
from grpo_core.errors import GRPOError, SpecError
from grpo_core.local_run import run_local
from grpo_core.placement import pick_device
from grpo_core.spec import JobSpec
from grpo_core.trainer import TrainResult


def check_data_parallel(spec: JobSpec, nproc: int) -> None:
    """Refuse, before any process starts, what k ranks cannot yet train exactly like one."""
    if spec.grpo.prompts_per_step % nproc:
        raise SpecError(
            "grpo.prompts_per_step",
            f"must be divisible by the number of ranks ({nproc}): each rank trains on whole groups",
        )


def run_data_parallel(
    spec: JobSpec,
    spec_dir: Path,
    output_dir: Path,
    nproc: int,
    resume: bool = False,
    device: str | None = None,
    progress: bool = True,
    hang_timeout: timedelta = timedelta(minutes=30),
) -> TrainResult:
    """Train ``spec`` on ``nproc`` ranks; returns rank 0's result. A rank's failure raises
    :class:`GRPOError` carrying that rank's error; so does a rank that waits longer than
    ``hang_timeout`` on the others (at the rendezvous or in a collective)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_data_parallel(spec, nproc)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"grpo-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # a free port, as torchrun --standalone picks
        max_restarts=0,  # a failed rank fails the attempt; retrying is the service's decision
        rdzv_timeout=int(hang_timeout.total_seconds()),
    )
    try:
        results = elastic_launch(config, _rank_main)(
            spec, spec_dir, output_dir, resume, device, progress, hang_timeout
        )
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise GRPOError(f"rank {rank} failed: {failure.message}", code="rank_failed") from exc
    return results[0]


def _rank_main(
    spec: JobSpec,
    spec_dir: Path,
    output_dir: Path,
    resume: bool,
    device: str | None,
    progress: bool,
    hang_timeout: timedelta,
) -> TrainResult:
    """One rank, in a process the launcher started (rank and rendezvous in its environment)."""
    cuda = pick_device(device).type == "cuda"
    local_rank = int(os.environ["LOCAL_RANK"])
    comm_device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(comm_device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=hang_timeout)
    try:
        ranks = Ranks(dist.get_rank(), dist.get_world_size(), comm_device)
        return run_local(spec, spec_dir, output_dir, resume, device, progress, ranks)
    finally:
        dist.destroy_process_group()
