"""Run bound rewards over a batch and check what they return.

Reward functions may come from plugins, so their output is not trusted: a wrong length, a string or
a bool is an error naming the reward (a bool usually means a forgotten ``float()`` and a silently
coerced 0/1 would hide it); inf and NaN become "not applicable" rather than poisoning the group
statistics. Each function gets its own copies of the inputs so one cannot alter what the next sees.

A reward bound with a time budget runs in a thread of its own and is waited for that long: a call
over budget leaves its rows unscorable (NaN, so advantage 0) and is reported, not raised; what to
do about repeated timeouts is the trainer's call. A thread cannot be killed, so a plugin that never
returns keeps spinning in the background (until the job ends); one stuck in C code holding the GIL
stops this thread too, and only the service's stall watchdog, in another process, ends it.

A reward backed by a service reports what went wrong there the same way, without raising: a call
that raises :class:`RewardUnavailable` leaves its rows unscorable and is named in ``unavailable``
with its message;
rows the service answered without a usable score come back as None in a :class:`PartlyScored`
and are counted in ``unscored``. A reward that says why each such row failed (a python grader's
exception, with its line) has the first of them kept in ``failures`` with the row it failed on, so
the trainer's warning, or the job's error when every row failed, shows what went wrong rather
than a count.
"""

from __future__ import annotations

import json
import math
import numbers
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_core.errors import RewardFailed, RewardTimeout, RewardUnavailable
from grpo_core.oom import out_of_memory_error
from grpo_core.rewards.reward_types import BoundReward
from grpo_core.rewards.shaping import shape_scores
from grpo_core.spec.prompt_rows import RESERVED_COLUMNS

# What score_completions adds to the dataset's columns for every reward.
SCORER_COLUMNS = RESERVED_COLUMNS - {"completions", "prompts"}

__all__ = ["RESERVED_COLUMNS", "SCORER_COLUMNS", "PartlyScored", "RowFailure", "Scores", "score_completions"]

_EXCERPT_CHARS = 200  # of each value of a failing row quoted in a warning or a job's error
_ROW_ERROR_CHARS = 500  # of a reward's message kept in a sample row's error


class PartlyScored(list):
    """A reward's values (a plain list to any other caller) with how many of its None values are
    rows a service failed to score rather than rows the reward does not apply to."""

    def __init__(self, values: list[float | None], unscored: int) -> None:
        super().__init__(values)
        self.unscored = unscored


@dataclass
class RowFailure:
    """A reward's failures in a call (or a step): on how many rows, the first one's message and
    that row (its prompt, completion and dataset columns, each cut to a readable length)."""

    rows: int
    error: str
    row: dict[str, Any]

    def merged(self, other: RowFailure | None) -> RowFailure:
        """Both counted, the first failure kept (``self`` came first)."""
        return self if other is None else RowFailure(self.rows + other.rows, self.error, self.row)


@dataclass
class Scores:
    matrix: list[list[float]]  # N x F: a row per completion, a column per reward, NaN = unscorable
    timed_out: list[str] = field(default_factory=list)  # rewards whose call went over its budget
    unavailable: dict[str, str] = field(default_factory=dict)  # reward -> why its service was unreachable
    unscored: dict[str, int] = field(default_factory=dict)  # reward -> rows its service could not score
    # reward -> row -> why it is unscored, where the reward says (a python grader's exception)
    problems: dict[str, dict[int, str]] = field(default_factory=dict)
    failures: dict[str, RowFailure] = field(default_factory=dict)  # reward -> its problems, summed up

    def row_errors(self, n: int) -> list[str | None]:
        """(N,) why each row went unscored, where a reward said ("reward 'NAME': why", one per
        failing reward), None for a row every reward scored or left without saying why: what a
        sample row shows beside its scores."""
        errors: list[list[str]] = [[] for _ in range(n)]
        for name, problems in self.problems.items():
            for row, problem in problems.items():
                errors[row].append(f"reward '{name}': {str(problem)[:_ROW_ERROR_CHARS]}")
        return ["; ".join(found) if found else None for found in errors]


def _call_within(fn: Callable[..., Any], timeout: float | None, name: str, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or :class:`RewardTimeout` when it has not returned in ``timeout``."""
    if timeout is None:
        return fn(*args, **kwargs)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread, which decides
            result["error"] = exc

    # A daemon: a reward that never returns must not keep the job's process alive at exit.
    thread = threading.Thread(target=run, name=f"reward-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise RewardTimeout(f"reward '{name}' did not return within {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _check_inputs(n: int, prompts: list[str], columns: dict[str, list[Any]]) -> None:
    """Caller mistakes (misaligned batches) are ValueErrors: no reward is at fault."""
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions; repeat each prompt per completion")
    for name, values in columns.items():
        if name in RESERVED_COLUMNS:
            raise ValueError(f"column '{name}' clashes with the reward function argument of that name")
        if len(values) != n:
            raise ValueError(f"column '{name}' has {len(values)} values for {n} completions")


def _to_score(name: str, index: int, value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardFailed(name, f"reward '{name}' returned {type(value).__name__} {value!r:.40} at index "
                                 f"{index}; expected a number or None")
    try:
        score = float(value)
    except OverflowError:  # an int too large for a float is as unusable as inf
        return math.nan
    return score if math.isfinite(score) else math.nan


def _checked(name: str, values: Any, n: int) -> list[float]:
    if not isinstance(values, Sequence) and callable(getattr(values, "tolist", None)):
        values = values.tolist()  # numpy arrays and tensors from plugins; no import needed
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise RewardFailed(name, f"reward '{name}' returned {type(values).__name__}, "
                                 f"not a list of {n} values")
    if len(values) != n:
        message = f"reward '{name}' returned {len(values)} values for {n} completions"
        raise RewardFailed(name, message)
    return [_to_score(name, index, value) for index, value in enumerate(values)]


def _cut(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"


def _excerpt(index: int, completions: list[str], prompts: list[str],
             columns: dict[str, list[Any]]) -> dict[str, Any]:
    """Row ``index`` as a failure quotes it: prompt, completion and the dataset's columns."""
    row = {"prompt": prompts[index], "completion": completions[index],
           **{name: values[index] for name, values in columns.items() if name not in SCORER_COLUMNS}}
    return {name: _cut(value) for name, value in row.items()}


def _aligned(values: list[Any] | None, n: int, what: str) -> list[Any]:
    """``values`` as a column of ``n`` (all None when not given)."""
    if values is None:
        return [None] * n
    if len(values) != n:
        raise ValueError(f"{len(values)} {what} for {n} completions")
    return list(values)


def score_completions(
    rewards: list[BoundReward],
    completions: list[str],
    prompts: list[str],
    columns: dict[str, list[Any]],
    raw_completions: list[str] | None = None,
    prompt_messages: list[Any] | None = None,
    completion_messages: list[Any] | None = None,
    environment_rewards: list[float] | None = None,
) -> Scores:
    """An N x F matrix (row per completion, column per reward), clipped and gated as each reward
    asks (:mod:`grpo_core.rewards.shaping`); NaN where a reward returned None or went over its
    budget (those rewards are named in ``timed_out``).

    ``completions`` are the answers rewards score, ``raw_completions`` the whole texts (reasoning
    included; the answers when not given) for format rewards, ``columns`` every dataset column
    aligned with the completions, ``prompt_messages`` each row's prompt as chat messages (None for
    a string prompt; all None when not given), ``completion_messages`` a multi-turn episode's
    messages after its prompt (the model's turns, tool results, observations; None for a
    single-turn row) and ``environment_reward`` its environment's rewards summed (what the reward
    named 'environment' returns). All of them are passed to every reward as keywords.
    """
    n = len(completions)
    _check_inputs(n, prompts, columns)
    raw = list(completions) if raw_completions is None else list(raw_completions)
    if len(raw) != n:
        raise ValueError(f"{len(raw)} raw completions for {n} completions")
    messages = _aligned(prompt_messages, n, "prompt messages")
    columns = {**columns, "raw_completions": raw, "prompt_messages": messages,
               "completion_messages": _aligned(completion_messages, n, "completion messages"),
               "environment_reward": _aligned(environment_rewards, n, "environment rewards")}
    scores = Scores([[math.nan] * len(rewards) for _ in range(n)])
    for j, reward in enumerate(rewards):
        try:
            values = _call_within(reward.fn, reward.timeout_seconds, reward.name, list(completions),
                                  list(prompts), **{k: list(v) for k, v in columns.items()})
        except RewardTimeout:
            scores.timed_out.append(reward.name)
            continue
        except RewardUnavailable as exc:
            scores.unavailable[reward.name] = exc.message
            continue
        except Exception as exc:
            # A reward that runs a model may run out of memory: the job's size, not the reward's bug.
            raise out_of_memory_error(exc) or RewardFailed(
                reward.name, f"reward '{reward.name}' raised {type(exc).__name__}: {exc}") from exc
        for row, score in enumerate(_checked(reward.name, values, n)):
            scores.matrix[row][j] = score
        if getattr(values, "unscored", 0):
            scores.unscored[reward.name] = values.unscored
        if problems := getattr(values, "problems", None):
            scores.problems[reward.name] = dict(problems)
            first = min(problems)
            scores.failures[reward.name] = RowFailure(len(problems), str(problems[first]),
                                                      _excerpt(first, completions, prompts, columns))
    scores.matrix = shape_scores(scores.matrix, rewards)
    return scores
