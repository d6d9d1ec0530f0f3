"""The job's process: ``python -m worker.job_process FOLDER PARENT_PID``, started by
:mod:`worker.supervisor` for one attempt. It trains (in this process, or on one rank per device
for a job holding several) and leaves how the attempt ended in FOLDER (:mod:`worker.attempt_files`).

It reports every step to SQL and Redis itself, but neither renews the lease nor decides to stop:
its supervisor does both, from a process this one cannot stall (a reward stuck in a regex holds
this interpreter's GIL, not the supervisor's). A stop request arrives as a file, checked before
each step; the trainer then checkpoints and returns.

A supervisor that stops answering (its process frozen, while this one, in a session of its own,
runs on) no longer renews the lease, so another worker will take the job over: this process then
ends itself once a lease passed with no beat from it (:func:`watch_supervisor`), publishing nothing
more; its writes are fenced meanwhile anyway (:mod:`worker.fencing`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from grpo_core.run.lifetime import die_with_parent

# The exit status of a job's process that ended itself for want of its supervisor (EX_TEMPFAIL).
UNSUPERVISED_EXIT = 75


def main(folder: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)  # first: the imports below take seconds
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s job-process %(message)s")
    attempt(folder)


def warm(parent_pid: int) -> None:
    """The supervisor's spare (:mod:`worker.warm_spare`): import what every attempt imports, fork
    the server its ranks will be forked from, then wait for an attempt on stdin (one JSON line: its
    folder, its working directory and the job's devices) and run it. A closed stdin ends it without
    an attempt."""
    die_with_parent(parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s job-process %(message)s")
    warm_imports()
    from grpo_core.run import rank_server

    # Forked past the imports above, before anything computes: it costs a fork, not the ~2 s of
    # imports a fresh server pays, so every spare has one, for a multi-device job and for its share
    # of a job spanning hosts alike.
    rank_server.address(["worker.ranks"], fork=True)
    line = sys.stdin.readline()
    waiting_in = os.getcwd()
    if line:
        call = json.loads(line)
        os.chdir(call["workdir"])
        sys.path[0] = call["workdir"]  # as ``-m`` would have set it, started there
        for name, value in call["environment"].items():  # the job's devices, before CUDA reads them
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    os.rmdir(waiting_in)  # the empty folder the supervisor made for the wait
    if line:
        attempt(call["folder"])


def warm_imports() -> None:
    """Everything an attempt imports before its first step, without touching a device: torch,
    transformers and the classes it loads lazily for the model families, the core's trainer."""
    import torch
    import transformers
    from transformers.models.llama import modeling_llama  # noqa: F401
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401

    import worker.attempt  # noqa: F401

    transformers.AutoModelForCausalLM, transformers.AutoTokenizer  # noqa: B018 (resolve the lazy names)
    if torch.cuda.is_initialized():
        # CUDA read CUDA_VISIBLE_DEVICES already: the job's devices could not be handed over.
        raise RuntimeError("the warm imports initialised CUDA; a spare must not touch a device")


def attempt(folder: str) -> None:
    from worker.attempt import run_attempt
    from worker.attempt_files import AttemptFiles

    files = AttemptFiles(Path(folder))
    job, settings, worker_id, part = files.read_call()
    threading.Thread(target=watch_supervisor, args=(files, settings.lease_seconds), daemon=True,
                     name="grpo-supervisor-watch").start()
    files.write_outcome(run_attempt(job, settings, worker_id, files, part))


def watch_supervisor(files, lease_seconds: float) -> None:
    """End this process (its ranks die with it) once no beat of the supervisor's lease thread
    (:meth:`worker.attempt_files.AttemptFiles.mark_supervised`) was seen for ``lease_seconds``:
    by then the lease has expired and the job may belong to another attempt. Measured on this
    process's monotonic clock from the last change it saw, so no clock is compared with another."""
    seen, since = files.supervised(), time.monotonic()
    while True:
        time.sleep(min(1.0, lease_seconds / 4))
        beat = files.supervised()
        if beat != seen:
            seen, since = beat, time.monotonic()
        elif time.monotonic() - since >= lease_seconds:
            logging.getLogger(__name__).error(
                "no beat from the supervisor for %.0f s (its process is frozen or gone): the lease has "
                "expired, so this process ends without writing more", lease_seconds)
            os._exit(UNSUPERVISED_EXIT)


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        warm(int(sys.argv[2]))
    else:
        main(sys.argv[1], int(sys.argv[2]))
