"""Loading models: every supported family, tokenizers without a pad token, LoRA references."""

from __future__ import annotations

import pytest
import torch
from core_specs import make_spec

from grpo_core.components import build_components
from grpo_core.experience import make_experience
from grpo_core.models import load_tokenizer
from grpo_core.spec import JobSpec
from grpo_core.update import optimizer_step


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_each_family_loads_and_trains_a_step(tiny_model_factory, family):
    c = build_components(make_spec(tiny_model_factory(family)), device="cpu")
    metrics = optimizer_step(c, make_experience(c))
    assert metrics["grad_norm"] > 0


def test_tokenizer_without_pad_token_pads_with_eos(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded.pad_token == reloaded.eos_token == "<eos>"
    assert reloaded.padding_side == "left"


def test_lora_reference_is_the_base_model_without_a_copy(tiny_model_dir):
    data = make_spec(tiny_model_dir, beta=0.1).model_dump()
    data["model"]["lora"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    c = build_components(JobSpec.model_validate(data), device="cpu")
    assert c.models.uses_adapters and c.models.reference is None
    trainable = [n for n, p in c.models.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    exp = make_experience(c)
    for _ in range(3):
        optimizer_step(c, exp)
    # The adapters moved the policy; the reference (adapters disabled) is still the base model.
    from grpo_core.logprobs import completion_logprobs

    r = exp.rollout
    with torch.no_grad():
        policy_logp, _ = completion_logprobs(
            c.models.policy, r.input_ids, r.attention_mask, r.completion_ids.size(1)
        )
        with c.models.reference_model() as ref:
            ref_logp, _ = completion_logprobs(ref, r.input_ids, r.attention_mask, r.completion_ids.size(1))
    torch.testing.assert_close(ref_logp, exp.ref_logprobs)
    assert not torch.allclose(policy_logp, ref_logp)
