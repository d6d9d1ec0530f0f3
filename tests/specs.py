"""The one JobSpec factory of the service's tests and benchmarks: a valid spec body for the
tiny random-init model, which a models root holds as ``tiny`` (``grpo_core.io.tiny_models``).

Its defaults train for a few seconds on one CPU core (two prompts x two completions of at most
8 tokens per step); callers name only what they change. A plain module, not a fixture, so the
benchmarks reach it too (``benchmarks/_service_stack.py`` puts ``tests/`` on their path).
"""

from __future__ import annotations

import copy
from typing import Any

PROMPTS = [{"prompt": "Is it yes?"}, {"prompt": "What is 2+3?"}, {"prompt": "hello world"},
           {"prompt": "Think about the number seven."}]


def tiny_spec(name: str = "tiny", *, max_steps: int = 4, pool: str | None = None,
              **fields: Any) -> dict[str, Any]:
    """A JobSpec body. ``grpo`` is merged into the defaults (``grpo={"max_steps": 0}`` changes
    one field); any other field replaces its default whole; ``pool`` sets ``resources.pool``
    (a ``resources`` field, if given, wins)."""
    # The tests were written against these (TRL's defaults differ: beta 0, linear decay, gradient
    # checkpointing on); they keep a reference model and a constant rate.
    grpo = {"num_generations": 2, "prompts_per_step": 2, "max_completion_length": 8,
            "max_steps": max_steps, "learning_rate": 1e-3, "seed": 0, "beta": 0.04,
            "lr_scheduler_type": "constant", "gradient_checkpointing": False, **fields.pop("grpo", {})}
    spec: dict[str, Any] = {"name": name, "model": {"source": "path:tiny"}, "dataset": {"prompts": PROMPTS},
                            "rewards": [{"name": "contains", "args": {"text": "yes"}}], "grpo": grpo,
                            "checkpoint_every": 2, "log_completions_every": 2}
    if pool is not None:
        spec["resources"] = {"pool": pool}
    return copy.deepcopy({**spec, **fields})  # nothing a caller changes leaks into the next spec
