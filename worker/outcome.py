"""How one attempt at a job ended, as the job's process tells its supervisor. Torch-free: the
supervisor (the Celery pool process) reads it and never loads torch.

* :class:`Outcome`: the job's own ending (succeeded, failed with a code, cancelled, preempted).
* :class:`Fault`: the machine's fault (a rank process killed, the database away for longer than
  the retry budget). The job is not at fault: it goes back to the queue and resumes from its
  checkpoint, up to ``GRPO_MAX_ATTEMPTS``.
* :class:`PartDone`: a gang host's part ended cleanly; node 0 tells the job's ending.

A stop the job was asked for ends as one status whoever ends it, the job at a step or its
supervisor killing a process that did not stop in time: :func:`outcome_for_stop`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.domain.lifecycle import JobStatus, StopRequest


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


@dataclass
class PartDone:
    """A gang's host other than node 0 whose ranks all returned: its part of the attempt is over.
    The job's outcome is node 0's to record (its rank 0 reports); this host records nothing of it."""


# A Fault's code when this host's ranks failed only because a rank on another host of the gang
# went away: that host's own record (its rank's error, its fault) is the cause, so this one waits
# a moment for it before it requeues the job as a lost host.
PEER_LOST = "peer_lost"
# The attempt no longer owns its job (another attempt does, or it was requeued): nothing to record.
LEASE_LOST = "lease_lost"


# A cancel ends the job; a pause rests it until resumed and a preemption puts it back in the
# queue, both to resume from its last checkpoint.
STATUS_AFTER_STOP = {StopRequest.CANCEL: JobStatus.CANCELLED, StopRequest.PAUSE: JobStatus.PAUSED,
                     StopRequest.PREEMPT: JobStatus.PREEMPTED}


def outcome_for_stop(stop: StopRequest, step: int, killed: str | None = None) -> Outcome:
    """The outcome of an attempt that ended because it was asked to ``stop``: by itself at
    ``step``, or, with ``killed`` (why and when), its process killed for not stopping in time."""
    status = STATUS_AFTER_STOP[StopRequest(stop)]
    message = f"{status.value}: {killed}" if killed else f"{status.value} at step {step}"
    return Outcome(status, message, step=step)
