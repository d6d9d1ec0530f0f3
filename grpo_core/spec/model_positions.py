"""Whether a run's longest sequence fits the model's positions, from the model's ``config.json``
read as JSON: one rule for the service at submit (which reads the file, never the model) and for
the core before the first step (the loaded model's config). Torch-free.

A row is at most ``max_prompt_length`` prompt tokens (longer prompts are cut) and
``max_completion_length`` completion tokens. Past its positions a model with learned position
embeddings fails (an index out of range) and a rotary one samples from positions it never saw;
either way the job could only waste its GPUs, so it is refused before it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_core.errors import SpecError

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
