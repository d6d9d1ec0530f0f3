"""A run whose longest sequence (max_prompt_length + max_completion_length) is more than the
model's positions is refused before its first step, naming grpo.max_completion_length, whatever
the config calls its positions; the service checks the same rule at submit where it can read the
model's config.json (tests/api/test_model_size_checks.py)."""

from __future__ import annotations

import pytest
from core_specs import make_spec

from grpo_core.errors import SpecError
from grpo_core.run.components import build_components


@pytest.mark.parametrize("family", ["llama", "gpt2"])  # max_position_embeddings / n_positions: 1024
def test_more_tokens_than_positions_is_invalid_spec_before_the_first_step(tiny_model_factory, family):
    folder = tiny_model_factory(family)
    too_long = make_spec(folder, max_prompt_length=32, max_completion_length=993)
    with pytest.raises(SpecError) as info:
        build_components(too_long, device="cpu")
    assert info.value.code == "invalid_spec"
    assert info.value.field == "grpo.max_completion_length"
    assert "32" in info.value.reason and "993" in info.value.reason and "1024 positions" in info.value.reason
    assert "at most 992" in info.value.reason

    # Exactly the model's positions is accepted.
    fits = make_spec(folder, max_prompt_length=32, max_completion_length=992)
    assert build_components(fits, device="cpu").spec.grpo.max_completion_length == 992
