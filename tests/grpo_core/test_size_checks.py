"""Sizes checked against the model and the data by the core: a run whose longest sequence
(max_prompt_length + max_completion_length) is more than the model's positions is refused before
its first step, naming grpo.max_completion_length, whatever the config calls its positions; a
round drawing more prompts than a loaded dataset's rows is a warning event when training starts.
The service checks both at submit where it can (tests/api/test_model_size_checks.py)."""

from __future__ import annotations

import json

import pytest
from core_specs import make_spec, spec_dict

from grpo_core.errors import SpecError
from grpo_core.run.callbacks import WARNING_EVENTS, TrainerCallback
from grpo_core.run.components import build_components
from grpo_core.run.trainer import GRPOTrainer
from grpo_core.spec.run_spec import RunSpec


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


class _Events(TrainerCallback):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict]] = []

    def on_event(self, type, message, data):  # noqa: A002
        self.events.append((type, message, data))


def test_a_step_over_a_loaded_datasets_rows_is_a_warning_event_at_the_start(tiny_model_dir, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Is {n} yes?"}) + "\n" for n in range(3)))
    body = spec_dict(tiny_model_dir, prompts_per_step=4, max_steps=1)
    spec = RunSpec.model_validate({**body, "dataset": {"source": f"path:{rows}"}})
    assert spec.warnings() == []  # a file's rows are not counted until the run loads them
    callbacks = _Events()
    GRPOTrainer(build_components(spec, device="cpu"), tmp_path / "run", callbacks).train()

    [(kind, message, data)] = [event for event in callbacks.events if event[0] in WARNING_EVENTS]
    assert kind == "prompts_over_dataset" and data == {"field": "grpo.prompts_per_step", "rows": 3}
    assert message.startswith("grpo.prompts_per_step: 4 prompts a step, but the dataset has 3 rows")
    assert [event[0] for event in callbacks.events][:2] == ["started", "prompts_over_dataset"]
