"""Errors raised by the core.

Each carries a stable machine-readable ``code`` so callers (the CLI, the worker, the API) can
map them to exit codes, job error records or HTTP statuses without parsing messages.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

TRACEBACK_LINES = 30


def traceback_tail(lines: int = TRACEBACK_LINES) -> str:
    """The last ``lines`` lines of the exception being handled: what a job's error record keeps."""
    return "\n".join(traceback.format_exc().rstrip().splitlines()[-lines:])


class GRPOError(Exception):
    """Base class: ``code`` is stable, ``message`` is for people."""

    code = "grpo_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class SpecError(GRPOError):
    """Bad user input, found before any training starts.

    ``field`` is the dotted path of the offending field (``grpo.num_generations``,
    ``rewards.0.args.field``) so a caller can point at it.
    """

    code = "invalid_spec"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


@dataclass(frozen=True)
class SpecWarning:
    """A field of a spec that was accepted but acts as if it were not there (a TRL field set to a
    value that asks for nothing), or asks for a size rarely meant. ``field`` is its dotted path,
    like :attr:`SpecError.field`."""

    field: str
    message: str
    # The warning event a service records at submit: most warnings are fields that change
    # nothing; a few are sizes a run can take but that are rarely meant (grpo_core.spec.size_checks).
    event: str = "spec_field_ignored"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SourceUnavailable(SpecError):
    """A model, tokenizer or dataset source the spec names validly but that cannot be reached or
    read when the job loads it: the hub unreachable (offline, a network failure), a folder or file
    that was there at submit and is gone. Not the spec's fault, so its code is its own; still a
    SpecError (``field`` names the source) for callers that point at the field."""

    code = "source_unavailable"


class NonFiniteLossError(GRPOError):
    """The loss became NaN or inf; the step was not applied."""

    code = "non_finite_loss"


class RewardFailed(GRPOError):
    """A reward raised or returned something unusable: the job's own fault. ``reward`` is its
    metric name, so a caller (the dry run) can point at it."""

    code = "reward_error"

    def __init__(self, reward: str, message: str) -> None:
        super().__init__(message)
        self.reward = reward


class RewardTimeout(GRPOError):
    """A reward went over its time budget (``reward_timeout_seconds``) too often to train on."""

    code = "reward_timeout"


class RewardUnavailable(GRPOError):
    """A reward's service (a verifier) could not be reached within a call's budget; the call's
    rows are unscorable. Too many such steps in a row fail the job with this code."""

    code = "reward_unavailable"


class EnvironmentUnavailable(GRPOError):
    """An environment server (registered by an admin) could not be reached or dropped an episode:
    the infrastructure's fault, not the job's, so the attempt ends and the job resumes from its
    checkpoint once the server is back."""

    code = "environment_unavailable"
