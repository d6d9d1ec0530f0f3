"""What the API and a worker say to each other about a rewards dry run the API relays (its
sandboxed rewards run on a worker, :mod:`api.http.reward_trial_relay` and
:mod:`worker.reward_trials`): the request pushed onto the pool's list, and the answer pushed to
the request's reply key. JSON both ways; pure (no I/O).

A request: ``{id, team_id, pool, rewards, samples, reward_timeout_seconds, deadline}``, the
deadline in wall-clock epoch seconds, after which nobody waits for the answer. An answer: the
:class:`RewardTrialRead` as ``{"result": ...}``, or ``{"error": [{"field", "message"}, ...]}`` for a
reward that fails as it would fail a job, which the API answers as the same 422 naming its path.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from api.schemas.reward_trials import RewardTrialRead, RewardTrialRequest
from grpo_core.errors import SpecError
from grpo_core.spec.spec_file import InvalidSpec

__all__ = ["RelayedTrial", "answer_of", "error_answer", "read_answer", "read_request", "request_message"]

# Of a client's request, what a worker needs (a spec's text was already turned into `rewards`).
_REQUEST_FIELDS = ("rewards", "samples", "reward_timeout_seconds", "pool")


@dataclass(frozen=True)
class RelayedTrial:
    id: str
    team_id: int
    deadline: float  # epoch seconds
    request: RewardTrialRequest  # its pool is the request's pool (the default pool's name if unset)

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.deadline


def request_message(trial: RelayedTrial) -> str:
    body = trial.request.model_dump(mode="json", include=set(_REQUEST_FIELDS))
    return json.dumps({"id": trial.id, "team_id": trial.team_id, "deadline": trial.deadline, **body},
                      separators=(",", ":"))


def read_request(raw: bytes | str) -> RelayedTrial:
    """The request as the API sent it, validated again as a client's request would be (a worker
    trusts nothing it pops); :class:`ValueError` for one that is not a request."""
    try:
        data = json.loads(raw)
        request = RewardTrialRequest.model_validate({key: data.get(key) for key in _REQUEST_FIELDS})
        return RelayedTrial(id=str(data["id"]), team_id=int(data["team_id"]),
                            deadline=float(data["deadline"]), request=request)
    except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"not a rewards dry run request: {exc}") from None


def answer_of(read: RewardTrialRead) -> str:
    return json.dumps({"result": read.model_dump(mode="json")}, separators=(",", ":"))


def error_answer(exc: InvalidSpec) -> str:
    """The first field's error (the 422's ``param``), with the others, as :class:`InvalidSpec` holds them."""
    return json.dumps({"error": [{"field": error.field, "message": error.reason} for error in exc.errors]},
                      separators=(",", ":"))


def read_answer(raw: bytes | str) -> RewardTrialRead:
    """The worker's answer: the scores, or :class:`InvalidSpec` naming the fields it refused."""
    data: dict[str, Any] = json.loads(raw)
    if "error" in data:
        raise InvalidSpec([SpecError(error["field"], error["message"]) for error in data["error"]])
    return RewardTrialRead.model_validate(data["result"])
