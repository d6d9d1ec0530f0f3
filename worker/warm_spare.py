"""A job process started before its job: the next attempt's process, already past its imports.

Three quarters of a fresh job process's first seconds are imports (torch, transformers, the
core: ~3-7 s of CPU), paid by every job, retry and resume between "dispatched" and its first
step. So the supervisor keeps one *spare*: ``python -m worker.job_process --warm``, started as
any job's process is (this process's child, in a session of its own, in an empty folder, with the
job environment, asking the kernel to die with this process), which does those imports and then
waits on its stdin for an attempt folder. An attempt takes the spare, hands it its folder and
working directory, and watches it exactly as it watches a fresh process; the next spare is started
once the attempt ends, while the worker waits for its next job.

Why a spare and not a fork server: a process forked from a long-lived server would be the server's
child, not the supervisor's, so the supervisor could neither wait for it nor read its exit status,
and "dies with its parent" would bind it to the server instead of the attempt that watches it.
The spare keeps every ownership rule as it is. It never touches CUDA (imports only), so the job
starts on a clean device either way.

A spare hands itself only to attempts in the thread that started it: the kernel's die-with-parent
signal follows the starting thread (:func:`grpo_core.run.lifetime.die_with_parent`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from worker.workdir import job_environment

log = logging.getLogger(__name__)


# The one variable a pool process sets for its job after its spare started: the job's devices
# (worker.devices.confine), handed over with the attempt. The spare has not touched CUDA, which
# reads it at its initialisation. Any other difference from the environment the spare started
# with (read at import by torch, transformers, the hub client) means a fresh process.
HANDED_OVER = ("CUDA_VISIBLE_DEVICES",)


@dataclass
class _Spare:
    process: subprocess.Popen
    thread: int
    environment: dict[str, str]
    # Its empty working directory until it gets an attempt's; it removes the folder itself once it
    # has left it (removed under a process still importing, every relative lookup there fails).
    folder: Path


_spare: _Spare | None = None
_lock = threading.Lock()


def start_job_process(attempt_folder: Path, workdir: Path, warm: bool) -> subprocess.Popen:
    """The attempt's process, running ``worker.job_process`` on ``attempt_folder`` in ``workdir``:
    the spare when there is a live one from this thread (and ``warm``), else a fresh process."""
    environment = job_environment()
    spare = _take(environment) if warm else None
    if spare is not None:
        try:
            call = {"folder": str(attempt_folder), "workdir": str(workdir),
                    "environment": {name: environment.get(name) for name in HANDED_OVER}}
            spare.process.stdin.write(json.dumps(call) + "\n")
            spare.process.stdin.close()
            log.info("job process %s: the warm spare takes %s", spare.process.pid, attempt_folder)
            return spare.process
        except OSError as exc:  # it died between the check and the write
            log.warning("the warm spare %s could not take the attempt (%s); starting a fresh process",
                        spare.process.pid, exc)
            _discard(spare)
    command = [sys.executable, "-m", "worker.job_process", str(attempt_folder), str(os.getpid())]
    return subprocess.Popen(command, start_new_session=True, cwd=workdir, env=environment)


def prepare_spare(warm: bool) -> None:
    """Start the next attempt's spare unless one is alive (a no-op unless ``warm``); it forks its
    rank server once past its imports, so the ranks of a job on several devices or hosts are forked
    past them too (:mod:`grpo_core.run.rank_server`)."""
    global _spare
    if not warm:
        return
    with _lock:
        if _spare is not None and _spare.process.poll() is None:
            return
        folder = Path(tempfile.mkdtemp(prefix="grpo-spare-"))
        environment = job_environment()
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.job_process", "--warm", str(os.getpid())],
            stdin=subprocess.PIPE, text=True, start_new_session=True, cwd=folder, env=environment)
        _spare = _Spare(process, threading.get_ident(), environment, folder)
        log.info("warm spare job process %s started", process.pid)


def drop_spare() -> None:
    """End the spare, if there is one."""
    global _spare
    with _lock:
        spare, _spare = _spare, None
    if spare is not None:
        _discard(spare)


def _take(environment: dict[str, str]) -> _Spare | None:
    global _spare
    with _lock:
        spare = _spare
        if spare is None or spare.thread != threading.get_ident():
            return None
        if _without_handed_over(spare.environment) != _without_handed_over(environment):
            log.info("the environment changed since the warm spare %s started; starting a fresh process",
                     spare.process.pid)
            return None
        _spare = None
    if spare.process.poll() is not None:
        log.warning("the warm spare %s had exited (%s); starting a fresh process", spare.process.pid,
                    spare.process.returncode)
        shutil.rmtree(spare.folder, ignore_errors=True)
        return None
    return spare


def _without_handed_over(environment: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in environment.items() if name not in HANDED_OVER}


def _discard(spare: _Spare) -> None:
    """End a spare that took no attempt: it holds nothing yet, so it is killed outright."""
    spare.process.kill()
    spare.process.wait()
    try:
        spare.process.stdin.close()
    except OSError:
        pass
    shutil.rmtree(spare.folder, ignore_errors=True)
