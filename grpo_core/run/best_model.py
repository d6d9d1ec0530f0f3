"""The best checkpoint and early stopping, with transformers' names and meanings.

``grpo.metric_for_best_model`` names an eval metric (``eval_reward``, ``eval_pass@k``, ...; the
``eval_`` prefix may be left out, as in transformers); at each eval point its value is compared
with the best so far (``grpo.greater_is_better``; a strictly better value is a new best, as
transformers' ``_determine_best_metric``), and a new best is checkpointed at once, so the best step
always has a checkpoint, which retention keeps. ``grpo.early_stopping_patience`` ends the run after
that many eval points in a row that did not improve on the best so far by more than
``grpo.early_stopping_threshold`` (transformers' ``EarlyStoppingCallback``: the comparison is with
the best *before* this eval point). ``grpo.load_best_model_at_end`` exports the best checkpoint's
weights as the final model.

Pure Python on plain numbers; its state is part of the checkpoint (:meth:`BestModel.state_dict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_core.spec.grpo_config import GRPOConfig


@dataclass(frozen=True)
class EvalVerdict:
    new_best: bool  # this eval point is the best so far: checkpoint it
    stop: bool  # early stopping's patience ran out at this eval point


class BestModel:
    """Tracks ``config.metric_for_best_model`` over the run's eval points."""

    def __init__(self, config: GRPOConfig, state: dict[str, Any] | None = None) -> None:
        self.metric: str = config.best_model_metric or ""
        self.greater_is_better = config.best_model_greater_is_better
        self.patience = config.early_stopping_patience
        self.threshold = config.early_stopping_threshold
        state = state or {}
        self.step: int | None = state.get("step")
        self.value: float | None = state.get("value")
        self.evals_without_improvement: int = state.get("evals_without_improvement", 0)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "value": self.value,
                "evals_without_improvement": self.evals_without_improvement}

    def summary(self) -> dict[str, Any] | None:
        """``{"step", "metric", "value"}`` of the best eval point so far; None before the first."""
        return None if self.step is None else {"step": self.step, "metric": self.metric, "value": self.value}

    def _better(self, value: float, than: float, by: float = 0.0) -> bool:
        return value > than + by if self.greater_is_better else value < than - by

    def observe(self, step: int, record: dict[str, Any]) -> EvalVerdict | None:
        """The verdict of eval point ``step`` (None: the record has no value of the metric, so this
        step was not an eval point). A non-finite value is never a best and never an improvement."""
        value = record.get(self.metric)
        if not isinstance(value, int | float):
            return None
        finite = math.isfinite(value)
        improved = finite and (self.value is None or self._better(value, self.value, self.threshold))
        self.evals_without_improvement = 0 if improved else self.evals_without_improvement + 1
        new_best = finite and step > 0 and (self.value is None or self._better(value, self.value))
        if new_best:
            self.step, self.value = step, float(value)
        stop = self.patience is not None and self.evals_without_improvement >= self.patience
        return EvalVerdict(new_best, stop)
