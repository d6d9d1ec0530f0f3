"""Loading models: every supported family, tokenizers without a pad token, LoRA references."""

from __future__ import annotations

import pytest
import torch
from core_specs import make_spec

from grpo_core.algorithm.logprobs import completion_logprobs
from grpo_core.io.model_loading import load_tokenizer
from grpo_core.run.components import build_components
from grpo_core.run.trainer import GRPOTrainer
from grpo_core.spec.run_spec import RunSpec


def with_lora(spec: RunSpec, **lora) -> RunSpec:
    data = spec.model_dump()
    data["model"]["lora"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], **lora}
    return RunSpec.model_validate(data)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_each_family_loads_and_trains_a_step(tiny_model_factory, tmp_path, family):
    trainer = GRPOTrainer(build_components(make_spec(tiny_model_factory(family)), device="cpu"), tmp_path)
    metrics = trainer.optimizer_step(trainer.make_experience())
    assert metrics["grad_norm"] > 0


def test_tokenizer_without_pad_token_pads_with_eos(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded.pad_token == reloaded.eos_token == "<eos>"
    assert reloaded.padding_side == "left"


def test_lora_reference_is_the_base_model_without_a_copy(tiny_model_dir, tmp_path):
    c = build_components(with_lora(make_spec(tiny_model_dir, beta=0.1)), device="cpu")
    assert c.models.uses_adapters and c.models.reference is None
    trainable = [n for n, p in c.models.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer = GRPOTrainer(c, tmp_path)
    exp = trainer.make_experience()
    for _ in range(3):
        trainer.optimizer_step(exp)
    # The adapters moved the policy; the reference (adapters disabled) is still the base model.
    r = exp.rollout
    with torch.no_grad():
        policy_logp, _ = completion_logprobs(
            c.models.policy, r.input_ids, r.attention_mask, r.completion_ids.size(1)
        )
        with c.models.reference_model() as ref:
            ref_logp, _ = completion_logprobs(ref, r.input_ids, r.attention_mask, r.completion_ids.size(1))
    torch.testing.assert_close(ref_logp, exp.ref_logprobs)
    assert not torch.allclose(policy_logp, ref_logp)


def test_lora_dropout_is_off_so_the_first_pass_is_on_policy(tiny_model_dir, tmp_path):
    """With mu = 2 the old log-probs are computed apart from the update's forward; any dropout
    left on in the update would make the first, on-policy ratio differ from 1."""
    spec = with_lora(make_spec(tiny_model_dir, beta=0.0, num_iterations=2, max_steps=1), dropout=0.3)
    c = build_components(spec, device="cpu")
    trainer = GRPOTrainer(c, tmp_path)
    exp = trainer.make_experience()
    metrics = trainer.optimizer_step(exp)
    assert metrics["clip_ratio/region_mean"] == 0.0
    # And directly: two train-mode forwards over the same batch agree exactly.
    r = exp.rollout
    width = r.completion_ids.size(1)
    with torch.no_grad():
        policy = c.models.policy
        twice = [completion_logprobs(policy, r.input_ids, r.attention_mask, width)[0] for _ in range(2)]
    assert c.models.policy.training and torch.equal(*twice)
