"""The devices a worker owns, and how a job's child is confined to its own.

A worker owns N devices: the CUDA devices it sees or, where there is none, ``GRPO_WORKER_GPUS``
CPU slots. The scheduler gives each job indices ``0..N-1`` of them; the job's child maps those to
the worker's own view of CUDA (its ``CUDA_VISIBLE_DEVICES`` when set, else every GPU the driver
lists) and sets ``CUDA_VISIBLE_DEVICES`` before torch is imported, so CUDA inside the job sees only
its devices, renumbered from 0. Nothing here touches CUDA: the main process must never initialise
it (forked children would inherit a broken context), so the driver is asked through nvidia-smi.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache

from api.settings import Settings

CUDA_ENV = "CUDA_VISIBLE_DEVICES"


@cache  # asked once in the main process; forked children inherit the answer
def cuda_devices() -> tuple[str, ...]:
    """The CUDA devices this worker sees, as CUDA_VISIBLE_DEVICES names them; () without any."""
    if CUDA_ENV in os.environ:
        return tuple(name.strip() for name in os.environ[CUDA_ENV].split(",") if name.strip())
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in done.stdout.splitlines() if line.strip())


def device_count(settings: Settings) -> int:
    """N: the CUDA devices seen, else the configured number of CPU slots."""
    return len(cuda_devices()) or settings.worker_gpus


def confine(devices: list[int] | None) -> str | None:
    """In the job's child, before torch is imported: show CUDA only the job's ``devices`` (the
    scheduler's indices). Returns the value set; None leaves the environment alone (a job
    dispatched without devices has the whole worker). On a CPU worker the indices are set as
    they are, which CUDA-less torch ignores and the job's record shows."""
    if devices is None:
        return None
    seen = cuda_devices()
    if seen and max(devices, default=0) >= len(seen):
        raise ValueError(f"devices {devices} outside the {len(seen)} this worker sees")
    value = ",".join(seen[index] if seen else str(index) for index in devices)
    os.environ[CUDA_ENV] = value
    return value
