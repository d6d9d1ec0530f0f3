"""Rows a step's rewards could not score: a warning event that says why, or the job's end.

A reward that says why a row failed (a python grader's exception with its line) has its count,
first message and failing row reported in the step's ``reward_unscored`` warning; rows a service
answered without a score (a verifier's null) are counted as before. A reward that failed on
**every** row of a step ends the run ``reward_error`` at that step, before its update: its signal
is nothing, so each further step would only spend compute on advantages of 0 (TRL raises at once
on a reward function's exception). Counted over every rank, so all ranks stop together.
"""

from __future__ import annotations

import json

from grpo_core.algorithm.experience import Experience
from grpo_core.errors import RewardFailed
from grpo_core.parallel.distributed import Ranks
from grpo_core.rewards import RowFailure
from grpo_core.run.callbacks import TrainerCallback

__all__ = ["report_unscored_rows"]


def _failures_everywhere(exp: Experience, failed: dict[str, int], ranks: Ranks) -> dict[str, RowFailure]:
    """Each failing reward's failure with the count of every rank, the first rank's message and row."""
    found = ranks.gather_objects({name: exp.reward_failures.get(name) for name in failed})
    first = {name: next(part[name] for part in found if part[name] is not None) for name in failed}
    return {name: RowFailure(count, first[name].error, first[name].row) for name, count in failed.items()}


def report_unscored_rows(exp: Experience, reward_names: list[str], step: int, ranks: Ranks,
                         callbacks: TrainerCallback) -> float:
    """A ``reward_unscored`` warning for step ``step`` when rows went unscored; RewardFailed when
    a reward failed on every row the step scored. Returns the fraction of the step's rows left
    unscored (the ``grader_failures`` health rule's figure)."""
    per_reward = [float(exp.reward_failures[name].rows if name in exp.reward_failures else 0)
                  for name in reward_names]
    rows, unscored, *failed_counts = (int(x) for x in ranks.sum(
        [float(exp.reward_rows), float(sum(exp.reward_unscored.values())), *per_reward]))
    if not unscored:
        return 0.0
    failed = {name: count for name, count in zip(reward_names, failed_counts, strict=True) if count}
    failures = _failures_everywhere(exp, failed, ranks) if failed else {}
    names = sorted(exp.reward_unscored)
    data = {"step": step, "rows": unscored, "rewards": names}
    if not failures:
        message = f"step {step}: {unscored} row(s) the reward service could not score ({', '.join(names)})"
    else:
        data["errors"] = {name: {"rows": failure.rows, "error": failure.error, "row": failure.row}
                          for name, failure in failures.items()}
        message = f"step {step}: " + "; ".join(
            f"reward '{name}' failed on {failure.rows} of {rows} row(s): {failure.error}"
            for name, failure in failures.items())
    callbacks.on_event("reward_unscored", message + "; they were left unscorable", data)
    for name, failure in failures.items():
        if failure.rows >= rows:
            raise RewardFailed(name, f"reward '{name}' failed on every row of step {step} ({rows} rows): "
                                     f"{failure.error}; a failing row: {json.dumps(failure.row)}")
    return min(1.0, unscored / rows) if rows else 0.0
