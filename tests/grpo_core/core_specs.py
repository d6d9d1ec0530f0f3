"""Spec builders for tests: small, fast jobs on the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_core.spec.run_spec import RunSpec

PROMPTS = [
    "Is the sum of two and three five?",
    "Please reply with a short answer.",
    "What is 2+3?",
    "Is it good?",
    "hello world",
    "Think about the number seven.",
    "one two three four",
    "Is the cat a dog?",
]


def spec_dict(model_dir: Path, **grpo: Any) -> dict[str, Any]:
    settings = dict(
        num_generations=4,
        prompts_per_step=2,
        max_prompt_length=32,
        max_completion_length=8,
        beta=0.04,
        learning_rate=3e-3,
        max_steps=4,
        seed=0,
        epsilon_high=0.28,
        # Not TRL's defaults (linear decay, checkpointing on): what these tests were written against.
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
    )
    settings.update(grpo)
    return {
        "name": "test-job",
        "model": {"source": f"path:{model_dir}"},
        "dataset": {"prompts": [{"prompt": p, "answer": "5"} for p in PROMPTS]},
        "rewards": [
            {"name": "contains", "args": {"text": "yes"}},
            {"name": "length_target", "weight": 0.5, "args": {"target": 12}},
        ],
        "grpo": settings,
        "checkpoint_every": 100,
        "log_completions_every": 2,
    }


def make_spec(model_dir: Path, **grpo: Any) -> RunSpec:
    return RunSpec.model_validate(spec_dict(model_dir, **grpo))
