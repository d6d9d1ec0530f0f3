"""A job over its memory limit on a real worker, scheduler, Postgres and Redis: the supervisor
ends its processes and the job fails ``out_of_memory`` with the figures, instead of the kernel's
OOM killer choosing a victim among every team's jobs; the worker runs the next job."""

from __future__ import annotations

import subprocess
import sys

from api.schemas.admin import PoolLimits
from api.store.db import session_scope
from api.store.pools import ensure_pool, set_limits
from worker.memory import private_bytes

SMALLEST_LIMIT = 64 * 2**20  # below what a Python process with torch loaded holds privately


def test_a_job_over_its_pools_memory_limit_fails_out_of_memory_and_frees_the_worker(
        processes, submit, tiny_spec, finished, wait_for, pool, database_url, wait_worker_ready):
    with session_scope(database_url) as session:
        ensure_pool(session, pool)
        set_limits(session, pool, PoolLimits(job_memory_bytes=SMALLEST_LIMIT))
    processes.worker(pool)
    wait_worker_ready(pool, processes)
    processes.scheduler()
    greedy = submit(tiny_spec("greedy", pool=pool))
    failed = wait_for(lambda: finished(greedy), 90, "the job over its limit to end", processes)
    assert (failed.status, failed.error.code) == ("failed", "out_of_memory"), failed.error
    assert "over its memory limit of 0.06 GiB" in failed.error.message

    with session_scope(database_url) as session:
        set_limits(session, pool, PoolLimits())  # the default: a share of the worker's memory
    fits = submit(tiny_spec("fits", pool=pool, grpo={"max_steps": 2}))
    done = wait_for(lambda: finished(fits), 120, "the next job to run", processes)
    assert done.status == "succeeded", done.error


def test_private_bytes_count_a_process_and_its_descendants():
    # A child that allocates 200 MB and reports; its parent holds little.
    child = ("import sys; block = bytearray(200 * 2**20); block[::4096] = b'x' * len(block[::4096]); "
             "print('ready', flush=True); sys.stdin.read()")
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])",
         child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline() == "ready\n"
        assert private_bytes(parent.pid) >= 200 * 2**20
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
    assert private_bytes(parent.pid) == 0  # gone
