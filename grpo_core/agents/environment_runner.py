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
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from grpo_core.agents.environment_answers import (
    Episodes,
    StepResult,
    answer_text,
    failure,
    json_object,
    step_result,
)
from grpo_core.agents.environment_server import ServerEpisodes
from grpo_core.agents.environment_setup import EnvironmentSetup
from grpo_core.rewards.sandbox_session import SandboxSession, SessionFailed
from grpo_core.spec.environment_spec import EnvironmentSpec

EPISODES_PER_SANDBOX = 16  # episodes forked by one sandboxed interpreter
PARALLEL_SANDBOXES = 8  # sandboxes talked to at once (each call is a few milliseconds of their CPU)
_HARNESS = Path(__file__).with_name("environment_harness.py").read_text(encoding="utf-8")


def environment_sandbox_bytes(spec: EnvironmentSpec, episodes: int) -> int:
    """The most memory ``episodes`` live episodes hold at once (what a pool's sandbox limit
    counts): their sandboxes, :data:`EPISODES_PER_SANDBOX` episodes each."""
    setup = EnvironmentSetup.of(spec)
    full, rest = divmod(episodes, EPISODES_PER_SANDBOX)
    sizes = [EPISODES_PER_SANDBOX] * full + ([rest] if rest else [])
    return sum(setup.sandbox_limits(size).cgroup_memory_bytes for size in sizes)


def open_episodes(
    setup: EnvironmentSetup, items: list[dict[str, Any]]
) -> Episodes:
    """``len(items)`` episodes of the setup's environment, started and reset on their items: in
    the sandbox (an Environment class) or as sessions of its registered server."""
    if setup.server is not None:
        return ServerEpisodes(setup, items)
    return EnvironmentEpisodes(setup, items)


def environment_reward(
    completions: list[str], prompts: list[str], environment_reward: list[float], **_: Any
) -> list[float]:
    """The reward named 'environment' among a job's rewards: each episode's environment rewards,
    summed (the scorer passes them as the ``environment_reward`` column)."""
    return list(environment_reward)


class _Batch:
    """One sandbox and the episodes it forked: ``first + j`` is its episode ``j``."""

    def __init__(self, setup: EnvironmentSetup, first: int, count: int) -> None:
        self.setup, self.first = setup, first
        self.live = set(range(count))
        self.session = SandboxSession(_HARNESS, setup.sandbox_limits(count))
        try:
            self.session.send(json.dumps({"source": setup.source, "episodes": count}))
            loaded = json_object(
                self.session.receive(time.monotonic() + setup.timeout_seconds), "start", first
            )
        except SessionFailed as exc:
            self.session.close()
            raise failure(f"gave no answer to its start: {exc}", first) from None
        except BaseException:
            self.session.close()
            raise
        if "load_error" in loaded:
            self.session.close()
            raise failure(f"does not load: {answer_text(loaded['load_error'])}", first)
        if loaded.get("ready") is not True:
            self.session.close()
            raise failure("answered its start with something else than the harness's 'ready'", first)

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
                    answer = json_object(self.session.receive(deadline), call, self.first + waiting)
                except SessionFailed as exc:
                    raise failure(f"gave no answer to {call}: {exc}", self.first + waiting) from None
                index = answer.get("e")
                if isinstance(index, bool) or index not in mine or index in answers:
                    continue  # not an answer asked for (the team's code may write anything)
                if answer.get("ended") is True:
                    raise failure(f"gave no answer to {call}: its process ended", self.first + index)
                if "error" in answer:
                    raise failure(f"{call} raised {answer_text(answer['error'])}", self.first + index)
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



class EnvironmentEpisodes(Episodes):
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

    def _start(self, first: int, items: list[dict[str, Any]]) -> None:
        count = min(EPISODES_PER_SANDBOX, len(items) - first)
        batch = _Batch(self.setup, first, count)
        with self._lock:
            self._batches.append(batch)
        resets = {first + j: {"op": "reset", "item": items[first + j]} for j in range(count)}
        for episode, answer in batch.ask(resets, "reset").items():
            observation = answer.get("observation")
            if observation is not None and not isinstance(observation, str):
                raise failure(f"reset returned {type(observation).__name__}, not a str or None", episode)
            self.first_observations[episode] = observation

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Each episode's ``step`` on its action, all of them concurrently."""

        def ask(batch: _Batch) -> dict[int, dict[str, Any]]:
            mine = {i: {"op": "step", "action": actions[i]} for i in actions if i - batch.first in batch.live}
            return batch.ask(mine, "step") if mine else {}

        results: dict[int, StepResult] = {}
        for answers in self._pool.map(ask, list(self._batches)):
            results.update({i: step_result(answer, i) for i, answer in answers.items()})
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
