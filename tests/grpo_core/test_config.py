"""JobSpec / GRPOConfig validation: every bad value names its field and the allowed range."""

from __future__ import annotations

import pytest
from core_specs import spec_dict

from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.spec_file import InvalidSpec, parse_spec, with_changes


def errors_for(data) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(data)
    return {e.field: e.reason for e in info.value.errors}


@pytest.mark.parametrize(
    ("override", "field", "words"),
    [
        ({"num_generations": 1}, "grpo.num_generations", "greater than or equal to 2"),
        ({"temperature": 0}, "grpo.temperature", "greater than 0"),
        ({"loss_type": "ppo"}, "grpo.loss_type", "'grpo', 'bnpo', 'dr_grpo' or 'dapo'"),
        ({"scale_rewards": "sometimes"}, "grpo.scale_rewards", "'group', 'batch' or 'none'"),
        ({"epsilon": 0.3, "epsilon_high": 0.2}, "grpo.epsilon_high", "must be >= epsilon"),
        (
            {"prompts_per_step": 3, "num_generations": 3, "gradient_accumulation_steps": 2},
            "grpo.gradient_accumulation_steps",
            "must divide prompts_per_step*num_generations = 9",
        ),
        ({"delta": 0.5}, "grpo.delta", "greater than 1"),
        # At or below 1 + clip_high the cap would bind before the clip: never a dual clip.
        ({"delta": 1.28}, "grpo.delta", "must be > 1 + epsilon_high (1.28)"),
        ({"delta": 1.1, "epsilon_high": None}, "grpo.delta", "must be > 1 + epsilon_high (1.2)"),
        ({"top_p": 1.5}, "grpo.top_p", "less than or equal to 1"),
        ({"lr_scheduler_type": "step"}, "grpo.lr_scheduler_type",
         "'cosine', 'constant' or 'constant_with_warmup'"),
    ],
)
def test_bad_grpo_values_name_the_field(tmp_path, override, field, words):
    found = errors_for(spec_dict(tmp_path, **override))
    assert field in found, found
    assert words in found[field]


def test_unknown_fields_are_rejected_at_every_level(tmp_path):
    data = spec_dict(tmp_path, not_a_field=1)
    data["model"]["quantize"] = True
    data["extra"] = 1
    found = errors_for(data)
    assert {"grpo.not_a_field", "model.quantize", "extra"} <= set(found)


def test_sources_must_use_a_known_scheme(tmp_path):
    data = spec_dict(tmp_path)
    data["model"]["source"] = "s3://bucket/model"
    data["dataset"] = {"source": "hf:not a valid id"}
    found = errors_for(data)
    assert "model.source" in found and "dataset.source" in found


def test_dataset_needs_exactly_one_origin(tmp_path):
    data = spec_dict(tmp_path)
    data["dataset"]["source"] = "path:x.jsonl"
    assert "dataset" in errors_for(data)


def test_defaults_follow_trl_and_clip_high_falls_back_to_epsilon():
    config = GRPOConfig()
    assert (config.num_generations, config.beta, config.loss_type, config.scale_rewards) == (
        8,
        0.0,
        "dapo",
        "group",
    )
    assert config.clip_high == config.epsilon == 0.2
    assert GRPOConfig(epsilon_high=0.28).clip_high == 0.28


def test_delta_just_above_the_upper_clip_is_accepted(tmp_path):
    assert parse_spec(spec_dict(tmp_path, delta=1.29)).grpo.delta == 1.29
    assert GRPOConfig(epsilon=0.2, delta=1.21).delta == 1.21


def test_changes_are_applied_to_the_spec_and_validated_again(tmp_path):
    spec = parse_spec(spec_dict(tmp_path, max_steps=4, learning_rate=0.5))
    changed = with_changes(spec, {"grpo": {"max_steps": 2}, "checkpoint_every": 7})
    assert (changed.grpo.max_steps, changed.checkpoint_every) == (2, 7)
    # Only the named fields change; the rest of the section is kept.
    assert changed.grpo.learning_rate == 0.5 and changed.model_dump(exclude={"grpo", "checkpoint_every"}) == (
        spec.model_dump(exclude={"grpo", "checkpoint_every"})
    )
    assert spec.grpo.max_steps == 4, "the original spec is left alone"
    with pytest.raises(InvalidSpec) as info:
        with_changes(spec, {"grpo": {"max_steps": 0}})
    assert [e.field for e in info.value.errors] == ["grpo.max_steps"]


def test_each_gpu_gets_whole_groups_of_the_same_number_of_prompts(tmp_path):
    """A k-GPU job runs as k ranks over whole groups: prompts_per_step must split evenly."""
    data = {**spec_dict(tmp_path, prompts_per_step=6), "resources": {"gpus": 4}}
    found = errors_for(data)
    assert list(found) == ["grpo.prompts_per_step"]
    assert "divisible by resources.gpus (4)" in found["grpo.prompts_per_step"]
    for gpus in (1, 2, 3, 6):
        assert parse_spec({**data, "resources": {"gpus": gpus}}).resources.gpus == gpus
