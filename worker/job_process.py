"""The job's process: ``python -m worker.job_process FOLDER PARENT_PID``, started by
:mod:`worker.supervisor` for one attempt. It trains (in this process, or on one rank per device
for a job holding several) and leaves how the attempt ended in FOLDER (:mod:`worker.attempt_files`).

It reports every step to SQL and Redis itself, but neither renews the lease nor decides to stop:
its supervisor does both, from a process this one cannot stall (a reward stuck in a regex holds
this interpreter's GIL, not the supervisor's). A stop request arrives as a file, checked before
each step; the trainer then checkpoints and returns.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from grpo_core.run.lifetime import die_with_parent


def main(folder: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)  # first: the imports below take seconds
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s job-process %(message)s")
    from worker.attempt import run_attempt
    from worker.attempt_files import AttemptFiles

    files = AttemptFiles(Path(folder))
    job, settings, worker_id, part = files.read_call()
    files.write_outcome(run_attempt(job, settings, worker_id, files, part))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
