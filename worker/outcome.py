"""How one attempt at a job ended, as the job's process tells its supervisor. Torch-free: the
supervisor (the Celery pool process) reads it and never loads torch.

* :class:`Outcome`: the job's own ending (succeeded, failed with a code, cancelled, preempted).
* :class:`Fault`: the machine's fault (a rank process killed, the database away for longer than
  the retry budget). The job is not at fault: it goes back to the queue and resumes from its
  checkpoint, up to ``GRPO_MAX_ATTEMPTS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.lifecycle import JobStatus


@dataclass
class Outcome:
    status: JobStatus  # succeeded | failed | cancelled | preempted
    message: str
    error_code: str | None = None
    traceback: str | None = None
    step: int = 0


@dataclass
class Fault:
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    # The job's own code when the machine acted on the job's behaviour (the OOM killer): recorded
    # with the requeue, and the cause named if the attempts run out.
    code: str | None = None
