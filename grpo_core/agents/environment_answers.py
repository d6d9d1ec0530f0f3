"""An environment's answers as the episodes take them, checked: whatever ran the environment (a
sandboxed Environment class, a registered server) answered as untrusted text or JSON, and only a
well-formed observation, reward and done go on. A wrong answer is the job's fault: a GRPOError
``environment_error`` naming the call and the episode."""

from __future__ import annotations

import json
import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Self

from grpo_core.errors import GRPOError

ERROR_CODE = "environment_error"


@dataclass(frozen=True)
class StepResult:
    """What ``step`` returned, checked: the next observation, the turn's reward, whether it ended."""

    observation: str | None
    reward: float | None
    done: bool


class Episodes(ABC):
    """A step's episodes of one environment, however it runs; use as a context manager, which
    ends them all. ``first_observations[i]``: what episode ``i``'s reset gave (None: nothing)."""

    first_observations: list[str | None]

    @abstractmethod
    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Each episode's ``step`` on its action (episodes by index), all of them concurrently."""

    @abstractmethod
    def finish(self, episode: int) -> None:
        """End one episode now (it is done): what it holds is not held for the others' turns."""

    @abstractmethod
    def close(self) -> None:
        """End every episode."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_object(text: str | bytes, call: str, episode: int) -> dict[str, Any]:
    """An answer's text as a JSON object, or the job's ``environment_error`` saying it is none."""
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):
        answer = None
    if not isinstance(answer, dict):
        raise failure(f"answered {call} with something that is no JSON object", episode)
    return answer


def step_result(answer: dict[str, Any], episode: int) -> StepResult:
    result = answer.get("result")
    if not isinstance(result, dict):
        raise failure(
            f"step returned {type(result).__name__}, not a dict with observation, reward and done", episode
        )
    observation, reward, done = result.get("observation"), result.get("reward"), result.get("done", False)
    if observation is not None and not isinstance(observation, str):
        raise failure(f"step's observation is {type(observation).__name__}, not a str or None", episode)
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not _finite(reward)
    ):
        raise failure(f"step's reward is {answer_text(repr(reward))}, not a finite number or None", episode)
    if not isinstance(done, bool):
        raise failure(f"step's done is {type(done).__name__}, not a bool", episode)
    return StepResult(observation, None if reward is None else float(reward), done)


def _finite(value: numbers.Real) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


def answer_text(value: Any) -> str:
    return str(value)[:500]


def failure(message: str, episode: int) -> GRPOError:
    return GRPOError(f"the environment {message} (episode {episode} of the batch)", code=ERROR_CODE)
