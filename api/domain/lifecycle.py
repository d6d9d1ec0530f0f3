"""The job state machine: every status, every allowed move between them, the event each move
records, and which user actions apply in which status (:data:`ACTIONS`). Pure (no I/O);
``api.store.jobs.transition`` is the one writer of ``jobs.status`` and consults :data:`RULES`
for every move it makes; the API serves the statuses and the actions table (``GET
/v1/lifecycle``, and each job read's ``actions``) so that no client keeps a copy.

::

    queued ──dispatch──► dispatched ──claim──► running ──succeed/fail──► succeeded | failed
      ▲  ▲                 │   │                │  │
      │  └─undispatch──────┘   │                │  └─request_cancel──► cancelling
      │                        │                │                       ├─stop_cancelled─► cancelled
      ├──requeue (lease expired, rank died)─────┤                       └─succeed/fail (ended first)
      │                                         ├─yield──► preempted ──dispatch──► dispatched
      │                                         ├─request_pause──► pausing ─stop_paused─► paused
      │                                         └─stop_paused (a health rule's pause)──────► paused
      ├─ queued | preempted | dispatched ──pause──► paused ──resume──► queued
      ├─ failed | cancelled ──retry──► queued (resumes from its last checkpoint)
      └─ queued | preempted | dispatched | paused ──cancel──► cancelled

A move names its *transition*, never a target status: two actors that race (a cancel and a
claim, a reaper and a late finish) each ask for their own transition, and the SQL guard on the
source statuses lets exactly one of them win.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    PAUSING = "pausing"
    PAUSED = "paused"


# Plain strings (the enum's values): what SQL stores, what the wire carries, and what SQL
# constraints and IN lists are built from.
JOB_STATUSES: tuple[str, ...] = tuple(status.value for status in JobStatus)
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")
# A job holds its GPUs from dispatch until it leaves these (quotas and fair share count them).
HOLDING_STATUSES = ("dispatched", "running", "cancelling", "pausing")
WAITING_STATUSES = ("queued", "preempted")
# A worker holds the job's lease: it renews it and may end the attempt.
ACTIVE_STATUSES = ("running", "cancelling", "pausing")
# Finished, for now: a paused job holds nothing and waits for no GPU until it is resumed.
RESTING_STATUSES = ("paused",)


class Transition(StrEnum):
    DISPATCH = "dispatch"  # the scheduler promised the job a worker's GPUs
    UNDISPATCH = "undispatch"  # the message to the worker could not be sent, or was not claimed in time
    CLAIM = "claim"  # the worker took it and starts an attempt
    SUCCEED = "succeed"
    FAIL = "fail"
    CANCEL = "cancel"  # cancelled before any attempt ran
    REQUEST_CANCEL = "request_cancel"  # a running job is asked to stop at its next step
    STOP_CANCELLED = "stop_cancelled"  # the attempt stopped for a cancel (or died while cancelling)
    YIELD = "yield"  # preempted: checkpointed and back in the queue
    REQUEUE = "requeue"  # lease expired or a rank died (the machine's fault): queued, resumes its checkpoint
    PAUSE = "pause"  # paused before any attempt runs (or between attempts)
    REQUEST_PAUSE = "request_pause"  # a running job is asked to checkpoint and stop at its next step
    # the attempt stopped for a pause, or a health rule paused it (or it died while pausing)
    STOP_PAUSED = "stop_paused"
    RESUME = "resume"  # a paused job goes back to the queue, to continue from its checkpoint
    RETRY = "retry"  # a failed or cancelled job goes back to the queue, to continue from its checkpoint


@dataclass(frozen=True)
class Rule:
    """``sources`` → ``target``, recording an event of type ``event`` at ``level`` whose data
    holds the job's ``record`` columns as the move left them (plus what the caller adds)."""

    sources: frozenset[JobStatus]
    target: JobStatus
    event: str
    level: str = "info"
    record: tuple[str, ...] = ()


S = JobStatus
RULES: dict[Transition, Rule] = {
    Transition.DISPATCH: Rule(frozenset(map(S, WAITING_STATUSES)), S.DISPATCHED, "dispatched",
                              record=("pool", "worker_id", "gpus")),
    Transition.UNDISPATCH: Rule(frozenset({S.DISPATCHED}), S.QUEUED, "dispatch_failed", "warning"),
    Transition.CLAIM: Rule(frozenset({S.DISPATCHED}), S.RUNNING, "running", record=("worker_id", "attempt")),
    Transition.SUCCEED: Rule(frozenset(map(S, ACTIVE_STATUSES)), S.SUCCEEDED, "succeeded"),
    Transition.FAIL: Rule(frozenset(map(S, ACTIVE_STATUSES)), S.FAILED, "failed", "error"),
    Transition.CANCEL: Rule(frozenset({*map(S, WAITING_STATUSES), S.DISPATCHED, S.PAUSED}), S.CANCELLED,
                            "cancelled"),
    Transition.REQUEST_CANCEL: Rule(frozenset({S.RUNNING, S.PAUSING}), S.CANCELLING, "cancel_requested"),
    Transition.STOP_CANCELLED: Rule(frozenset(map(S, ACTIVE_STATUSES)), S.CANCELLED, "cancelled"),
    Transition.YIELD: Rule(frozenset({S.RUNNING}), S.PREEMPTED, "preempted", "warning"),
    Transition.REQUEUE: Rule(frozenset({S.DISPATCHED, S.RUNNING}), S.QUEUED, "requeued", "warning"),
    Transition.PAUSE: Rule(frozenset({*map(S, WAITING_STATUSES), S.DISPATCHED}), S.PAUSED, "paused"),
    Transition.REQUEST_PAUSE: Rule(frozenset({S.RUNNING}), S.PAUSING, "pause_requested"),
    # From running too: a health rule whose action is pause ends the attempt by itself.
    Transition.STOP_PAUSED: Rule(frozenset({S.RUNNING, S.PAUSING}), S.PAUSED, "paused",
                                 record=("last_step",)),
    Transition.RESUME: Rule(frozenset({S.PAUSED}), S.QUEUED, "unpaused"),
    Transition.RETRY: Rule(frozenset({S.FAILED, S.CANCELLED}), S.QUEUED, "retried"),
}
# How an attempt that ran ends, by the outcome the worker reports (a preempted one yields instead).
ENDINGS: dict[JobStatus, Transition] = {
    S.SUCCEEDED: Transition.SUCCEED,
    S.FAILED: Transition.FAIL,
    S.CANCELLED: Transition.STOP_CANCELLED,
    S.PAUSED: Transition.STOP_PAUSED,
}
del S


class StopRequest(StrEnum):
    """What a running job may be asked to do, strongest first: a cancel wins over a pause, and a
    pause over a preemption (a job being paused must not be requeued by a preemption that came
    first, nor a cancelled one paused). The one ranking for the lease renewal, the job process's
    own check before each step and the attempt's stop file."""

    CANCEL = "cancel"
    PAUSE = "pause"
    PREEMPT = "preempt"


_STOP_STRENGTH = {StopRequest.PREEMPT: 0, StopRequest.PAUSE: 1, StopRequest.CANCEL: 2}


def stop_requested(*, cancel_requested: bool, status: str, preempt_requested: bool) -> StopRequest | None:
    """The strongest stop a job's row asks for (a pause is its ``pausing`` status), or None."""
    if cancel_requested:
        return StopRequest.CANCEL
    if status == JobStatus.PAUSING:
        return StopRequest.PAUSE
    return StopRequest.PREEMPT if preempt_requested else None


def stronger_stop(current: str | None, new: str | None) -> StopRequest | None:
    """The one of two stop requests that wins (None: no request)."""
    requests = [StopRequest(request) for request in (current, new) if request is not None]
    return max(requests, key=_STOP_STRENGTH.__getitem__, default=None)


class Action(StrEnum):
    """What a user may do to a job: each job read lists the ones that apply in its status
    (``JobRead.actions``), so a client offers exactly those and keeps no table of its own. The
    value is the name a client calls: ``POST /v1/jobs/{id}/{action}`` for the moves and ``clone``;
    ``set_priority`` is the job's PATCH, ``download_model`` its ``GET .../model``, ``delete`` its
    ``DELETE``."""

    CANCEL = "cancel"
    PAUSE = "pause"
    RESUME = "resume"
    RETRY = "retry"
    SET_PRIORITY = "set_priority"
    CLONE = "clone"
    DOWNLOAD_MODEL = "download_model"
    DELETE = "delete"  # DELETE /v1/jobs/{id}: its rows and artifacts


# The moves each moving action makes, tried in this order: where it applies is where one of
# them may start, so the store's 409s and the actions a job read offers are the same rules.
ACTION_MOVES: dict[Action, tuple[Transition, ...]] = {
    Action.CANCEL: (Transition.CANCEL, Transition.REQUEST_CANCEL),
    Action.PAUSE: (Transition.PAUSE, Transition.REQUEST_PAUSE),
    Action.RESUME: (Transition.RESUME,),
    Action.RETRY: (Transition.RETRY,),
}
# Asked again while its move is under way (or done, for a pause), a moving action changes
# nothing and is no error: the answer is the job as it is, not a 409. Not offered there.
ALREADY_ASKED: dict[Action, frozenset[str]] = {
    Action.CANCEL: frozenset({JobStatus.CANCELLING}),
    Action.PAUSE: frozenset({JobStatus.PAUSING, JobStatus.PAUSED}),
}


def _statuses_where_moves_start(action: Action) -> tuple[str, ...]:
    sources = {source for move in ACTION_MOVES[action] for source in RULES[move].sources}
    return tuple(status for status in JOB_STATUSES if status in sources)


# Action -> the statuses where it applies, in JOB_STATUSES order: the one table the API serves
# (``GET /v1/lifecycle``) and every job read's ``actions`` come from.
ACTIONS: dict[Action, tuple[str, ...]] = {
    **{action: _statuses_where_moves_start(action) for action in ACTION_MOVES},
    # A finished job's class no longer decides anything.
    Action.SET_PRIORITY: tuple(status for status in JOB_STATUSES if status not in TERMINAL_STATUSES),
    Action.CLONE: JOB_STATUSES,  # a new job from this one's spec, whatever became of this one
    # The worker writes the final model as the last thing before the job succeeds. (The download
    # route serves whatever final model there is; clients offer it once the job has one.)
    Action.DOWNLOAD_MODEL: (JobStatus.SUCCEEDED.value,),
    # No worker writes a finished job's artifacts any more (a retry would: retry it or delete it).
    Action.DELETE: TERMINAL_STATUSES,
}


def actions_for(status: str) -> list[str]:
    """The actions that apply to a job in ``status``, in :class:`Action` order."""
    return [action.value for action, statuses in ACTIONS.items() if status in statuses]


def applies(action: Action, status: str) -> bool:
    return status in ACTIONS[Action(action)]


class TransitionRefused(Exception):  # noqa: N818 - names the condition
    """A move the state machine does not allow from the job's current status."""


def rule(transition: Transition) -> Rule:
    return RULES[Transition(transition)]


def allowed(status: str, transition: Transition) -> bool:
    return JobStatus(status) in rule(transition).sources


def target(status: str, transition: Transition) -> JobStatus:
    """Where ``transition`` takes a job in ``status``; :class:`TransitionRefused` if it may not."""
    if not allowed(status, transition):
        raise TransitionRefused(f"a {status} job cannot {transition.value}")
    return rule(transition).target
