"""How the trainer reports: callbacks, so the loop knows nothing of where records go
(a JSONL file for ``grpo train``, SQL + Redis in the service's worker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_core.spec.size_checks import PROMPTS_OVER_ROWS

# A health rule tripped (grpo_core.run.health); the best eval point so far was checkpointed
# (grpo_core.run.best_model).
ALERT_EVENT, BEST_CHECKPOINT_EVENT = "alert", "best_checkpoint"
# Events that say something went wrong without ending the run (a reporter may flag them).
# ``checkpoint_upload_retry``: the service's worker could not store a checkpoint yet.
WARNING_EVENTS = frozenset({"reward_timeout", "reward_unavailable", "reward_unscored",
                            "checkpoint_upload_retry", PROMPTS_OVER_ROWS, ALERT_EVENT})


class TrainerCallback:
    """Override what you need; every hook is a no-op by default."""

    def on_step(self, record: dict[str, Any]) -> None:
        """One metrics record per optimizer step (docs/architecture.md §5 names)."""

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        """Lifecycle events: ``started``, ``resumed``, ``checkpoint``, ``stopped``, ``finished``, ..."""

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Sample completions with their per-function rewards and advantage."""

    def before_checkpoint(self, step: int, estimated_bytes: int) -> None:
        """A checkpoint of ``step``, about ``estimated_bytes`` large, is about to be written; raise
        a :class:`~grpo_core.errors.GRPOError` to refuse it (and end the run) before anything is
        written, e.g. over a disk quota."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        """A complete checkpoint now exists at ``path``."""

    def on_checkpoints_removed(self, steps: list[int]) -> None:
        """Retention deleted the checkpoints of these steps (``checkpoint_keep_last``)."""

    def should_stop(self) -> bool:
        """Asked once per step; True ends the run after a checkpoint (cancel, preemption)."""
        return False


class CallbackList(TrainerCallback):
    """Fans each hook out to several callbacks, in order."""

    def __init__(self, callbacks: list[TrainerCallback] | None = None) -> None:
        self.callbacks = list(callbacks or [])

    def on_step(self, record: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_step(record)

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        for cb in self.callbacks:
            cb.on_event(type, message, data)

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for cb in self.callbacks:
            cb.on_samples(step, rows)

    def before_checkpoint(self, step: int, estimated_bytes: int) -> None:
        for cb in self.callbacks:
            cb.before_checkpoint(step, estimated_bytes)

    def on_checkpoint(self, step: int, path: Path) -> None:
        for cb in self.callbacks:
            cb.on_checkpoint(step, path)

    def on_checkpoints_removed(self, steps: list[int]) -> None:
        for cb in self.callbacks:
            cb.on_checkpoints_removed(steps)

    def should_stop(self) -> bool:
        return any(cb.should_stop() for cb in self.callbacks)
