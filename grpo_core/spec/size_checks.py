"""Sizes checked against the model and the data, torch-free: one rule each for the service at
submit and for the core when it has loaded the model and the rows.

Positions: a row is at most ``max_prompt_length`` prompt tokens (longer prompts are cut) and
``max_completion_length`` completion tokens. Past its positions (read from the model's
``config.json``: the service reads the file, never the model) a model with learned position
embeddings fails (an index out of range) and a rotary one samples from positions it never saw;
either way the job could only waste its GPUs, so it is refused before it runs.

Rows: a generation round drawing more prompts than the dataset holds repeats each prompt within
the round (1,000 prompts a step of 200 rows: 8,000 completions of 200 prompts). Legal, and what
a small dataset with a large batch asks for, but rarely meant: a warning, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_core.errors import SpecError, SpecWarning
from grpo_core.spec.grpo_config import GRPOConfig

# The names config.json files give a model's context length, in the order they are looked for
# (Llama/Qwen/Mistral, GPT-2, then a few families' own spellings).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_positions(config: Mapping[str, Any]) -> tuple[str, int] | None:
    """``(key, positions)`` from a model's config (a multimodal model's ``text_config`` when the
    top level names none); None when it names none."""
    text = config.get("text_config")
    for section in (config, text if isinstance(text, Mapping) else {}):
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return key, value
    return None


def positions_problem(max_prompt_length: int, max_completion_length: int,
                      config: Mapping[str, Any]) -> SpecError | None:
    """The error naming ``grpo.max_completion_length`` when a prompt of ``max_prompt_length``
    tokens and a completion of ``max_completion_length`` tokens are more than the model's
    positions; None when they fit or the config names no positions."""
    found = model_positions(config)
    if found is None:
        return None
    key, positions = found
    needed = max_prompt_length + max_completion_length
    if needed <= positions:
        return None
    room = positions - max_prompt_length
    advice = (f"at most {room} with this max_prompt_length" if room > 0
              else "lower max_prompt_length too")
    return SpecError("grpo.max_completion_length", (
        f"max_prompt_length ({max_prompt_length}) + max_completion_length ({max_completion_length}) = "
        f"{needed} tokens, more than the model's {positions} positions ({key} in its config.json): "
        f"{advice}"))


PROMPTS_OVER_ROWS = "prompts_over_dataset"  # the warning's event type


def prompts_over_rows(config: GRPOConfig, rows: int, dataset: str = "dataset") -> SpecWarning | None:
    """A warning naming the batch field when a generation round draws more prompts than the
    ``rows`` of ``dataset``; None when it does not. The field is ``grpo.prompts_per_step`` when a
    step alone is too many, else the TRL field that made the round larger."""
    drawn = config.prompts_per_round
    if drawn <= rows:
        return None
    if config.prompts_per_step > rows:
        field, what = "grpo.prompts_per_step", f"{drawn} prompts a step"
    else:
        name = "generation_batch_size" if "generation_batch_size" in config.model_fields_set else \
            "steps_per_generation"
        field, what = f"grpo.{name}", f"{drawn} prompts a generation round ({config.round_steps} steps)"
    return SpecWarning(field, (
        f"{what}, but the {dataset} has {rows} rows: each prompt is drawn about {drawn / rows:.1f} "
        f"times a round ({drawn * config.num_generations} completions); lower it to at most {rows} "
        "for each prompt once a round"), event=PROMPTS_OVER_ROWS)
