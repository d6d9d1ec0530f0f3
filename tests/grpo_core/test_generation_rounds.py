"""TRL's generation batching (steps_per_generation / generation_batch_size): one generation
round feeds several optimizer steps, the later ones off-policy, as in TRL."""

from __future__ import annotations

import pytest
from core_specs import make_spec
from pydantic import ValidationError
from run_records import assert_same_run

import grpo_core.algorithm.experience as experience_module
import grpo_core.algorithm.update as update_module
from grpo_core.run.callbacks import TrainerCallback
from grpo_core.run.components import build_components
from grpo_core.run.local_run import run_local
from grpo_core.run.trainer import GRPOTrainer
from grpo_core.spec.grpo_config import GRPOConfig


class _Records(TrainerCallback):
    def __init__(self) -> None:
        self.records: list[dict] = []

    def on_step(self, record):
        self.records.append(record)


def _train(spec, checkpoint_dir, monkeypatch):
    """Train ``spec``; return its records, how many times it generated, the prompts of each
    optimizer step's rows, and per micro-batch the largest |logprobs − old_logprobs| on a loss token."""
    calls, drift, prompts = [], [], []
    real_sample, real_loss = experience_module.sample_rows, update_module.micro_batch_loss

    def counting_sample(*args, **kwargs):
        calls.append(1)
        return real_sample(*args, **kwargs)

    def recording_loss(logprobs, old_logprobs, advantages, mask, *args, **kwargs):
        drift.append(float(((logprobs.detach() - old_logprobs).abs() * mask).max()))
        return real_loss(logprobs, old_logprobs, advantages, mask, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(experience_module, "sample_rows", counting_sample)
        patch.setattr(update_module, "micro_batch_loss", recording_loss)
        callbacks = _Records()
        trainer = GRPOTrainer(build_components(spec, device="cpu"), checkpoint_dir, callbacks)
        real_step = trainer.optimizer_step

        def recording_step(exp):
            prompts.append(exp.prompts)
            return real_step(exp)

        trainer.optimizer_step = recording_step
        trainer.train()
    return callbacks.records, len(calls), prompts, drift


def test_one_round_feeds_k_optimizer_steps_off_policy_after_the_first(tiny_model_dir, tmp_path, monkeypatch):
    b, g = 2, 4
    spec = make_spec(tiny_model_dir, max_steps=4, steps_per_generation=2, loss_type="grpo")
    records, generations, prompts, drift = _train(spec, tmp_path / "rounds", monkeypatch)
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # one record per optimizer step
    assert generations == 2
    assert [r["timing/generation"] > 0 for r in records] == [True, False, True, False]
    # Each step trains its own B prompts' groups: a round's two steps share none.
    for first, second in (prompts[0:2], prompts[2:4]):
        assert len(first) == len(second) == b * g
        assert not set(first) & set(second)
    # The round's first step is on-policy (ratio 1); the second sees a policy one update newer
    # than the one that generated its rows, whose log-probs it keeps as old_logprobs.
    assert drift[0] == 0.0 and drift[2] == 0.0  # exactly: one log-prob computation
    assert drift[1] > 1e-4 and drift[3] > 1e-4
    # The same prompt stream as generating every step: only when generation happens changes.
    _, every_step, plain_prompts, _ = _train(
        make_spec(tiny_model_dir, max_steps=4, loss_type="grpo"), tmp_path / "plain", monkeypatch
    )
    assert every_step == 4 and plain_prompts == prompts
    # Tokens are counted once, on the step that trains them.
    assert records[-1]["num_tokens"] > records[-2]["num_tokens"] > records[-3]["num_tokens"]


def test_iterations_replay_the_round_in_trl_order(tiny_model_dir, tmp_path, monkeypatch):
    """num_iterations=2 over a round of 2 steps: parts 0, 1, 0, 1 of one generation, as TRL
    replays its buffered generation batch."""
    spec = make_spec(tiny_model_dir, max_steps=4, steps_per_generation=2, num_iterations=2)
    records, generations, prompts, drift = _train(spec, tmp_path, monkeypatch)
    assert generations == 1
    assert prompts[0] == prompts[2] and prompts[1] == prompts[3] and not set(prompts[0]) & set(prompts[1])
    assert drift[0] == 0.0 and min(drift[1:]) > 1e-4
    assert records[0]["reward"] == records[2]["reward"]
    assert records[3]["num_tokens"] == records[1]["num_tokens"]  # a second pass brings no new tokens


def test_generation_batch_size_is_the_same_round(tiny_model_dir, tmp_path):
    """generation_batch_size = 2·B·G and steps_per_generation = 2·accumulation give one run."""
    by_steps = make_spec(tiny_model_dir, max_steps=3, steps_per_generation=4, gradient_accumulation_steps=2)
    by_size = make_spec(tiny_model_dir, max_steps=3, generation_batch_size=16, gradient_accumulation_steps=2)
    assert by_steps.grpo.round_steps == by_size.grpo.round_steps == 2
    run_local(by_steps, tmp_path, tmp_path / "steps", device="cpu", progress=False)
    run_local(by_size, tmp_path, tmp_path / "size", device="cpu", progress=False)
    assert_same_run(tmp_path / "steps", tmp_path / "size")


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        ({"steps_per_generation": 2, "generation_batch_size": 16}, "generation_batch_size", "not both"),
        ({"gradient_accumulation_steps": 2, "steps_per_generation": 3}, "steps_per_generation",
         "multiple of gradient_accumulation_steps"),
        ({"generation_batch_size": 12}, "generation_batch_size", "multiple of prompts_per_step"),
        ({"drop_zero_std_groups": True, "steps_per_generation": 2}, "steps_per_generation",
         "drop_zero_std_groups"),
        ({"drop_zero_std_groups": True, "generation_batch_size": 16}, "generation_batch_size",
         "drop_zero_std_groups"),
        ({"importance_sampling_level": "tokens"}, "importance_sampling_level", "sequence"),
    ],
)
def test_bad_batching_names_the_field(settings, field, message):
    with pytest.raises(ValidationError) as info:
        GRPOConfig(prompts_per_step=2, num_generations=4, **settings)
    error = info.value.errors()[0]
    assert error["loc"] == (field,) and message in error["msg"]


def test_round_steps_follow_trl_meaning():
    base = dict(prompts_per_step=2, num_generations=4, gradient_accumulation_steps=2)
    assert GRPOConfig(**base).round_steps == 1
    assert GRPOConfig(**base, steps_per_generation=2).round_steps == 1  # TRL's default
    assert GRPOConfig(**base, steps_per_generation=6).round_steps == 3
    assert GRPOConfig(**base, generation_batch_size=24).prompts_per_round == 6
    # One round per step, so dynamic sampling still fills it.
    assert GRPOConfig(**base, steps_per_generation=2, drop_zero_std_groups=True).round_steps == 1
