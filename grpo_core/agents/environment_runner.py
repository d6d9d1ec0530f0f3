"""An environment's episodes, each in a sandboxed interpreter of its own
(:class:`~grpo_core.rewards.sandbox_session.SandboxSession`) that holds its ``Environment()``
from ``reset`` to the episode's end: state lasts across turns and is never shared between
episodes, jobs or teams. A turn's calls, all live episodes' together, run concurrently.

The team's code answers through :mod:`grpo_core.agents.environment_harness`, which it can rewrite:
every answer is checked here. An environment that does not load, raises, answers wrongly or runs
over its time, memory or output limits is the job's fault: a GRPOError ``environment_error``
naming the call and the episode (an environment that cannot be trusted to answer cannot be
scored around).
"""

from __future__ import annotations

import json
import math
import numbers
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_core.errors import GRPOError
from grpo_core.rewards.sandbox import Limits
from grpo_core.rewards.sandbox_session import SandboxSession, SessionFailed
from grpo_core.spec.environment_spec import EnvironmentSpec

PARALLEL_EPISODES = 16  # calls in flight at once; each is a few milliseconds of a sandbox's CPU
OBSERVATION_BYTES = 64 * 2**10  # the most of one answer line read from an episode's sandbox
_HARNESS = Path(__file__).with_name("environment_harness.py").read_text(encoding="utf-8")
ERROR_CODE = "environment_error"


@dataclass(frozen=True)
class EnvironmentSetup:
    """What running a job's environment needs: its source, turns, per-call time and limits."""

    source: str
    max_turns: int
    timeout_seconds: float
    limits: Limits

    @classmethod
    def of(cls, spec: EnvironmentSpec) -> EnvironmentSetup:
        # CPU for the whole episode: every call may use its time; the wall clock is per call.
        cpu = math.ceil(spec.timeout_seconds * (spec.max_turns + 1)) + 1
        limits = Limits(
            wall_seconds=spec.timeout_seconds,
            cpu_seconds=cpu,
            memory_bytes=spec.memory_mb * 2**20,
            processes=spec.max_processes + 1,
            output_bytes=OBSERVATION_BYTES,
        )
        return cls(spec.source, spec.max_turns, spec.timeout_seconds, limits)


def environment_sandbox_bytes(spec: EnvironmentSpec, episodes: int) -> int:
    """The most memory ``episodes`` live episodes hold at once (what a pool's sandbox limit counts)."""
    return episodes * EnvironmentSetup.of(spec).limits.cgroup_memory_bytes


def environment_reward(completions: list[str], prompts: list[str], environment_reward: list[float],
                       **_: Any) -> list[float]:
    """The reward named 'environment' among a job's rewards: each episode's environment rewards,
    summed (the scorer passes them as the ``environment_reward`` column)."""
    return list(environment_reward)


@dataclass(frozen=True)
class StepResult:
    """What ``step`` returned, checked: the next observation, the turn's reward, whether it ended."""

    observation: str | None
    reward: float | None
    done: bool


class EnvironmentEpisodes:
    """``len(items)`` episodes started and reset on their items (dataset rows); use as a context
    manager, which ends every sandbox. ``first_observations[i]``: what episode ``i``'s reset returned."""

    def __init__(self, setup: EnvironmentSetup, items: list[dict[str, Any]]) -> None:
        self.setup = setup
        self.sessions: list[SandboxSession | None] = [None] * len(items)
        self._pool = ThreadPoolExecutor(max(1, min(PARALLEL_EPISODES, len(items))), thread_name_prefix="env")
        try:
            self.first_observations = list(self._pool.map(self._start, range(len(items)), items))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> EnvironmentEpisodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Each episode's ``step`` on its action, all of them concurrently."""
        episodes = list(actions)
        results = self._pool.map(
            lambda i: _step_result(self._ask(i, {"op": "step", "action": actions[i]}), i), episodes
        )
        return dict(zip(episodes, results, strict=True))

    def finish(self, episode: int) -> None:
        """End one episode's sandbox now (it is done): its memory is not held for the others' turns."""
        session, self.sessions[episode] = self.sessions[episode], None
        if session is not None:
            session.close()

    def close(self) -> None:
        for episode in range(len(self.sessions)):
            self.finish(episode)
        self._pool.shutdown(wait=True)

    def _start(self, episode: int, item: dict[str, Any]) -> str | None:
        self.sessions[episode] = SandboxSession(_HARNESS, self.setup.limits)
        loaded = self._ask(episode, {"source": self.setup.source}, call="start")
        if "load_error" in loaded:
            raise _failure(f"does not load: {_text(loaded['load_error'])}", episode)
        if loaded.get("ready") is not True:
            raise _failure("answered its start with something else than the harness's 'ready'", episode)
        answer = self._ask(episode, {"op": "reset", "item": item}, call="reset")
        observation = answer.get("observation")
        if observation is not None and not isinstance(observation, str):
            raise _failure(f"reset returned {type(observation).__name__}, not a str or None", episode)
        return observation

    def _ask(self, episode: int, request: dict[str, Any], call: str = "step") -> dict[str, Any]:
        session = self.sessions[episode]
        if session is None:
            raise ValueError(f"episode {episode} has ended")
        try:
            line = session.ask(json.dumps(request, default=str), self.setup.timeout_seconds)
        except SessionFailed as exc:
            raise _failure(f"gave no answer to {call}: {exc}", episode) from None
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            raise _failure(f"answered {call} with something that is no JSON object", episode)
        if "error" in answer:
            raise _failure(f"{call} raised {_text(answer['error'])}", episode)
        return answer


def _step_result(answer: dict[str, Any], episode: int) -> StepResult:
    result = answer.get("result")
    if not isinstance(result, dict):
        raise _failure(
            f"step returned {type(result).__name__}, not a dict with observation, reward and done", episode
        )
    observation, reward, done = result.get("observation"), result.get("reward"), result.get("done", False)
    if observation is not None and not isinstance(observation, str):
        raise _failure(f"step's observation is {type(observation).__name__}, not a str or None", episode)
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not _finite(reward)
    ):
        raise _failure(f"step's reward is {_text(repr(reward))}, not a finite number or None", episode)
    if not isinstance(done, bool):
        raise _failure(f"step's done is {type(done).__name__}, not a bool", episode)
    return StepResult(observation, None if reward is None else float(reward), done)


def _finite(value: numbers.Real) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


def _text(value: Any) -> str:
    return str(value)[:500]


def _failure(message: str, episode: int) -> GRPOError:
    return GRPOError(f"the environment {message} (episode {episode} of the batch)", code=ERROR_CODE)
