"""An environment's episodes, each in a process of its own that holds its ``Environment()`` from
``reset`` to the episode's end: state lasts across turns and is never shared between episodes,
jobs or teams. The processes are forked, a batch of :data:`EPISODES_PER_SANDBOX` at a time, by
one sandboxed interpreter (:class:`~grpo_core.rewards.sandbox_session.SandboxSession`, running
:mod:`grpo_core.agents.environment_harness`) that has loaded the source once: starting a sandbox
costs tens of milliseconds of CPU (bwrap, two interpreters), a fork about one, and a step's
episodes number in the tens to hundreds. A batch's episodes share their sandbox's ``/tmp``; each
has its own memory. A turn's calls, all live episodes' together, run concurrently.

The team's code answers through the harness, which it can rewrite: every answer is checked here,
and only the answers asked for are taken. An environment that does not load, raises, answers
wrongly or runs over its time, memory or output limits is the job's fault: a GRPOError
``environment_error`` naming the call and the episode (an environment that cannot be trusted to
answer cannot be scored around).
"""

from __future__ import annotations

import json
import math
import numbers
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grpo_core.errors import GRPOError
from grpo_core.rewards.sandbox import Limits
from grpo_core.rewards.sandbox_session import SandboxSession, SessionFailed
from grpo_core.spec.environment_spec import EnvironmentSpec

EPISODES_PER_SANDBOX = 16  # episodes forked by one sandboxed interpreter
PARALLEL_SANDBOXES = 8  # sandboxes talked to at once (each call is a few milliseconds of their CPU)
OBSERVATION_BYTES = 64 * 2**10  # the most of one answer line read from a sandbox
_HARNESS = Path(__file__).with_name("environment_harness.py").read_text(encoding="utf-8")
ERROR_CODE = "environment_error"


@dataclass(frozen=True)
class EnvironmentSetup:
    """What running a job's environment needs: its source, turns, per-call time, and the limits
    of one episode (:meth:`sandbox_limits` makes a batch's sandbox of them)."""

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
            processes=spec.max_processes,
            output_bytes=OBSERVATION_BYTES + 512,
        )
        return cls(spec.source, spec.max_turns, spec.timeout_seconds, limits)

    def sandbox_limits(self, episodes: int) -> Limits:
        """A sandbox of ``episodes``: each episode's processes, the harness and the launcher; all
        of their memory (each process's address space) and the shared /tmp."""
        processes = episodes * self.limits.processes + 2
        return replace(
            self.limits,
            processes=processes,
            run_memory_bytes=(processes * self.limits.memory_bytes + self.limits.tmp_bytes),
        )


def environment_sandbox_bytes(spec: EnvironmentSpec, episodes: int) -> int:
    """The most memory ``episodes`` live episodes hold at once (what a pool's sandbox limit
    counts): their sandboxes, :data:`EPISODES_PER_SANDBOX` episodes each."""
    setup = EnvironmentSetup.of(spec)
    full, rest = divmod(episodes, EPISODES_PER_SANDBOX)
    sizes = [EPISODES_PER_SANDBOX] * full + ([rest] if rest else [])
    return sum(setup.sandbox_limits(size).cgroup_memory_bytes for size in sizes)


def environment_reward(
    completions: list[str], prompts: list[str], environment_reward: list[float], **_: Any
) -> list[float]:
    """The reward named 'environment' among a job's rewards: each episode's environment rewards,
    summed (the scorer passes them as the ``environment_reward`` column)."""
    return list(environment_reward)


@dataclass(frozen=True)
class StepResult:
    """What ``step`` returned, checked: the next observation, the turn's reward, whether it ended."""

    observation: str | None
    reward: float | None
    done: bool


class _Batch:
    """One sandbox and the episodes it forked: ``first + j`` is its episode ``j``."""

    def __init__(self, setup: EnvironmentSetup, first: int, count: int) -> None:
        self.setup, self.first = setup, first
        self.live = set(range(count))
        self.session = SandboxSession(_HARNESS, setup.sandbox_limits(count))
        try:
            self.session.send(json.dumps({"source": setup.source, "episodes": count}))
            loaded = self._answer(
                self.session.receive(time.monotonic() + setup.timeout_seconds), "start", first
            )
        except SessionFailed as exc:
            self.session.close()
            raise _failure(f"gave no answer to its start: {exc}", first) from None
        except BaseException:
            self.session.close()
            raise
        if "load_error" in loaded:
            self.session.close()
            raise _failure(f"does not load: {_text(loaded['load_error'])}", first)
        if loaded.get("ready") is not True:
            self.session.close()
            raise _failure("answered its start with something else than the harness's 'ready'", first)

    def ask(self, requests: dict[int, dict[str, Any]], call: str) -> dict[int, dict[str, Any]]:
        """Each episode's answer to its request (episodes numbered as the caller numbers them),
        all sent at once and waited for together, each within the call's time."""
        mine = {episode - self.first: request for episode, request in requests.items()}
        try:
            for index, request in mine.items():
                self.session.send(json.dumps({"e": index, **request}, default=str))
            deadline = time.monotonic() + self.setup.timeout_seconds
            answers: dict[int, dict[str, Any]] = {}
            while len(answers) < len(mine):
                waiting = min(set(mine) - set(answers))
                try:
                    answer = self._answer(self.session.receive(deadline), call, self.first + waiting)
                except SessionFailed as exc:
                    raise _failure(f"gave no answer to {call}: {exc}", self.first + waiting) from None
                index = answer.get("e")
                if isinstance(index, bool) or index not in mine or index in answers:
                    continue  # not an answer asked for (the team's code may write anything)
                if answer.get("ended") is True:
                    raise _failure(f"gave no answer to {call}: its process ended", self.first + index)
                if "error" in answer:
                    raise _failure(f"{call} raised {_text(answer['error'])}", self.first + index)
                answers[index] = answer
        except BaseException:
            self.close()
            raise
        return {self.first + index: answer for index, answer in answers.items()}

    def end(self, episode: int) -> None:
        """End one episode's process now (it is done); the sandbox with the batch's last one."""
        index = episode - self.first
        if index not in self.live:
            return
        self.live.discard(index)
        if not self.live:
            self.close()
            return
        try:
            self.session.send(json.dumps({"e": index, "op": "end"}))
        except SessionFailed:
            self.close()

    def close(self) -> None:
        self.live.clear()
        self.session.close()

    @staticmethod
    def _answer(line: str, call: str, episode: int) -> dict[str, Any]:
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            raise _failure(f"answered {call} with something that is no JSON object", episode)
        return answer


class EnvironmentEpisodes:
    """``len(items)`` episodes started and reset on their items (dataset rows); use as a context
    manager, which ends every sandbox. ``first_observations[i]``: what episode ``i``'s reset returned."""

    def __init__(self, setup: EnvironmentSetup, items: list[dict[str, Any]]) -> None:
        self.setup = setup
        self.first_observations: list[str | None] = [None] * len(items)
        self._batches: list[_Batch] = []
        self._lock = threading.Lock()
        starts = list(range(0, len(items), EPISODES_PER_SANDBOX))
        self._pool = ThreadPoolExecutor(
            max(1, min(PARALLEL_SANDBOXES, len(starts))), thread_name_prefix="env"
        )
        started = [self._pool.submit(self._start, first, items) for first in starts]
        try:
            for future in started:
                future.result()
        except BaseException:
            wait(started)  # every batch started is closed below, none after
            self.close()
            raise

    def __enter__(self) -> EnvironmentEpisodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, first: int, items: list[dict[str, Any]]) -> None:
        count = min(EPISODES_PER_SANDBOX, len(items) - first)
        batch = _Batch(self.setup, first, count)
        with self._lock:
            self._batches.append(batch)
        resets = {first + j: {"op": "reset", "item": items[first + j]} for j in range(count)}
        for episode, answer in batch.ask(resets, "reset").items():
            observation = answer.get("observation")
            if observation is not None and not isinstance(observation, str):
                raise _failure(f"reset returned {type(observation).__name__}, not a str or None", episode)
            self.first_observations[episode] = observation

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Each episode's ``step`` on its action, all of them concurrently."""

        def ask(batch: _Batch) -> dict[int, dict[str, Any]]:
            mine = {i: {"op": "step", "action": actions[i]} for i in actions if i - batch.first in batch.live}
            return batch.ask(mine, "step") if mine else {}

        results: dict[int, StepResult] = {}
        for answers in self._pool.map(ask, list(self._batches)):
            results.update({i: _step_result(answer, i) for i, answer in answers.items()})
        missing = sorted(set(actions) - set(results))
        if missing:
            raise ValueError(f"episodes {missing} have ended")
        return results

    def finish(self, episode: int) -> None:
        """End one episode's process now (it is done): its memory is not held for the others' turns."""
        for batch in self._batches:
            if batch.first <= episode < batch.first + EPISODES_PER_SANDBOX:
                batch.end(episode)

    def close(self) -> None:
        with self._lock:
            batches = list(self._batches)
        for batch in batches:
            batch.close()
        self._pool.shutdown(wait=True)


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
