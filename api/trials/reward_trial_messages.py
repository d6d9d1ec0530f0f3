"""What the API and a worker say to each other about a dry run the API relays (sandboxed code
runs on a worker, :mod:`api.http.reward_trial_relay` and :mod:`worker.reward_trials`): the request
pushed onto the pool's list, and the answer pushed to the request's reply key. JSON both ways;
pure (no I/O). Two kinds share the list: a rewards dry run and an environment dry run.

A request: ``{kind, id, team_id, deadline, ...}`` with the kind's fields (rewards: ``pool, rewards,
samples, reward_timeout_seconds``; environment: ``pool, environment, item, actions``), the
deadline in wall-clock epoch seconds, after which nobody waits for the answer; a request without
a kind is a rewards dry run (as queued before environments existed). An answer: the kind's read
as ``{"result": ...}``, or ``{"error": [{"field", "message"}, ...]}`` for what fails as it would
fail a job, which the API answers as the same 422 naming its path.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from api.schemas.environment_trials import EnvironmentTrialRead, EnvironmentTrialRequest
from api.schemas.reward_trials import RewardTrialRead, RewardTrialRequest
from grpo_core.errors import SpecError
from grpo_core.spec.spec_file import InvalidSpec

__all__ = ["RelayedTrial", "TrialRead", "TrialRequest", "answer_of", "error_answer", "kind_of", "read_answer",
           "read_request", "request_message"]

# Per kind: its request, of a client's request what a worker needs (a spec's text was already
# turned into `rewards` or `environment`), and its answer.
_KINDS: dict[str, tuple[type[BaseModel], tuple[str, ...], type[BaseModel]]] = {
    "rewards": (RewardTrialRequest, ("rewards", "samples", "reward_timeout_seconds", "pool"),
                RewardTrialRead),
    "environment": (EnvironmentTrialRequest, ("environment", "item", "actions", "pool"),
                    EnvironmentTrialRead),
}
TrialRequest = RewardTrialRequest | EnvironmentTrialRequest
TrialRead = RewardTrialRead | EnvironmentTrialRead


def kind_of(request: TrialRequest) -> str:
    return "environment" if isinstance(request, EnvironmentTrialRequest) else "rewards"


@dataclass(frozen=True)
class RelayedTrial:
    id: str
    team_id: int
    deadline: float  # epoch seconds
    request: TrialRequest  # its pool is the request's pool (the default pool's name if unset)

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.deadline


def request_message(trial: RelayedTrial) -> str:
    kind = kind_of(trial.request)
    body = trial.request.model_dump(mode="json", include=set(_KINDS[kind][1]))
    return json.dumps({"kind": kind, "id": trial.id, "team_id": trial.team_id, "deadline": trial.deadline,
                       **body}, separators=(",", ":"))


def read_request(raw: bytes | str) -> RelayedTrial:
    """The request as the API sent it, validated again as a client's request would be (a worker
    trusts nothing it pops); :class:`ValueError` for one that is not a request."""
    try:
        data = json.loads(raw)
        schema, fields, _ = _KINDS[data.get("kind", "rewards")]
        request = schema.model_validate({key: data[key] for key in fields if key in data})
        return RelayedTrial(id=str(data["id"]), team_id=int(data["team_id"]),
                            deadline=float(data["deadline"]), request=request)
    except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"not a dry run request: {exc}") from None


def answer_of(read: TrialRead) -> str:
    return json.dumps({"result": read.model_dump(mode="json")}, separators=(",", ":"))


def error_answer(exc: InvalidSpec) -> str:
    """The first field's error (the 422's ``param``), with the others, as :class:`InvalidSpec` holds them."""
    return json.dumps({"error": [{"field": error.field, "message": error.reason} for error in exc.errors]},
                      separators=(",", ":"))


def read_answer(raw: bytes | str, request: TrialRequest) -> TrialRead:
    """The worker's answer to ``request``: its kind's read (the scores, the episode), or
    :class:`InvalidSpec` naming the fields it refused."""
    data: dict[str, Any] = json.loads(raw)
    if "error" in data:
        raise InvalidSpec([SpecError(error["field"], error["message"]) for error in data["error"]])
    return _KINDS[kind_of(request)][2].model_validate(data["result"])
