"""How much memory a job's processes may use together, and how much they use.

The limit is the job's pool's ``job_memory_bytes`` (set by admins), else the job's share of this
worker's memory: ``GRPO_POOL_JOB_MEMORY_FRACTION`` of it times the job's share of the worker's
devices, so jobs packed onto one worker cannot starve each other. The supervisor compares it
with what the job's process tree holds privately (resident minus shared file pages: the
libraries every Python process maps are not the job's to pay for) and ends the job as
``out_of_memory`` beyond it, before the kernel's OOM killer picks a victim, which could be
another team's job or the worker itself.
"""

from __future__ import annotations

import psutil

from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store.db import session_scope
from api.store.pools import admission
from worker.devices import device_count


def job_memory_limit(job: JobRead, settings: Settings, devices_here: int | None = None) -> int:
    """``devices_here``: how many of this worker's devices the job holds, for a gang's host (its
    share, not the job's whole count); None: all the job's GPUs are here."""
    with session_scope(settings.database_url) as session:
        found = admission(session, job.pool)
    if found is not None and found[1].job_memory_bytes is not None:
        return found[1].job_memory_bytes
    held = job.gpus if devices_here is None else devices_here
    share = min(1.0, max(1, held) / max(1, device_count(settings)))
    return int(psutil.virtual_memory().total * settings.pool_job_memory_fraction * share)


def private_bytes(pid: int) -> int:
    """Resident, not shared, bytes of ``pid`` and all its descendants (0 once it is gone)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in tree:
        try:
            info = process.memory_info()
        except psutil.NoSuchProcess:  # ended meanwhile: it holds nothing
            continue
        total += max(0, info.rss - info.shared)
    return total


def gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
