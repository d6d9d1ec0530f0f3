"""The lean decoder against the model's own forward: same logits through prefill (left padding),
decode steps and dropped rows, for every family it claims; the families it must refuse; and the
sampling loop giving the same tokens through either decoder."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

import grpo_core.algorithm.rollout as rollout_module
from grpo_core.algorithm.decoders import LeanDecoder, ModelForwardDecoder, decoder_for, lean_decoder_supports
from grpo_core.algorithm.randomness import row_keys
from grpo_core.algorithm.rollout import PromptBatch, SamplingOptions, sample_completions

VOCAB = 97
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256, pad_token_id=0, eos_token_id=1)


def _model(config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    # Random biases and norm weights, so a projection's bias or a q/k norm the decoder skipped
    # would show in the logits (from_config initialises biases to 0 and norms to 1).
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


FAMILIES = {
    "llama-gqa": lambda: LlamaConfig(**COMMON, num_key_value_heads=2),
    "llama-rope-scaled": lambda: LlamaConfig(**COMMON, num_key_value_heads=4, rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "qwen2-bias": lambda: Qwen2Config(**COMMON, num_key_value_heads=2),
    "qwen3-qk-norm": lambda: Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=16),
    "mistral": lambda: MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=None),
}


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(2, VOCAB, (5, 9))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding of different widths
    mask[2, :1] = 0
    mask[4, :8] = 0  # a one-token prompt
    return ids.masked_fill(mask == 0, 0), mask


def _same_logits(lean: LeanDecoder, reference: ModelForwardDecoder, steps: int, drop_at: int) -> None:
    ids, mask = _prompts()
    ours, theirs = lean.prefill(ids, mask), reference.prefill(ids, mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for step in range(steps):
        token = theirs.argmax(-1)
        if step == drop_at:  # rows finish: both drop them from their caches
            rows = torch.tensor([0, 2, 4])
            assert lean.keep(rows) and reference.keep(rows)
            token = token[rows]
        ours, theirs = lean.step(token), reference.step(token)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"decode step {step}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lean_decoder_gives_the_model_forwards_logits(family):
    model = _model(FAMILIES[family]())
    assert lean_decoder_supports(model)
    with torch.inference_mode():
        _same_logits(LeanDecoder(model, 8), ModelForwardDecoder(model), steps=7, drop_at=3)


def test_lean_decoder_drives_lora_adapters():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(FAMILIES["qwen2-bias"]()), LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():  # a non-zero adapter, so skipping it would change the logits
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    model.eval()
    decoder = decoder_for(model, 6)
    assert isinstance(decoder, LeanDecoder)
    with torch.inference_mode():
        _same_logits(decoder, ModelForwardDecoder(model), steps=5, drop_at=2)


@pytest.mark.parametrize("config, why", [
    (lambda: GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4), "another architecture"),
    (lambda: MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=4), "sliding-window attention"),
    (lambda: Qwen2Config(**COMMON, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                         max_window_layers=0), "sliding-window layers"),
    (lambda: LlamaConfig(**COMMON, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                    "rope_theta": 10000.0}), "length-dependent rotary"),
])
def test_models_the_lean_decoder_cannot_match_use_their_own_forward(config, why):
    model = _model(config())
    assert not lean_decoder_supports(model), why
    assert isinstance(decoder_for(model, 4), ModelForwardDecoder)


@pytest.mark.parametrize("options", [
    SamplingOptions(12, temperature=0.9, top_k=20, top_p=0.95),
    SamplingOptions(12, repetition_penalty=1.3, min_p=0.05),
    SamplingOptions(12, greedy=True),
], ids=["sampled", "penalized", "greedy"])
def test_sampling_through_either_decoder_gives_the_same_tokens(monkeypatch, options):
    model = _model(FAMILIES["llama-gqa"]())
    ids, mask = _prompts()
    prompts, eos = PromptBatch(ids, mask, 0), torch.tensor([1, 5, 9, 48])  # frequent EOS: rows drop out
    keys = row_keys(3, torch.arange(5), 2)
    lean = sample_completions(model, prompts, 2, eos, 0, options, keys)
    monkeypatch.setattr(rollout_module, "decoder_for_groups", lambda model, *_: ModelForwardDecoder(model))
    reference = sample_completions(model, prompts, 2, eos, 0, options, keys)
    assert torch.equal(lean.completion_ids, reference.completion_ids)
    assert torch.equal(lean.completion_mask, reference.completion_mask)
    assert lean.completion_mask.sum(1).min() < lean.completion_ids.size(1), "no row stopped early"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_turn_resumed_from_kept_caches_gives_what_a_prefill_of_the_whole_context_gives(family) -> None:
    """Episodes keep each row's cache between turns (rows leaving the decode at different steps,
    their last sampled token not yet cached) and start the next turn from it with only the new
    tokens (that token, an observation of any length): the next-token logits equal those of a
    prefill of each row's whole context, left-padded as sampling would pad it."""
    model = _model(FAMILIES[family]())
    ids, mask = _prompts()
    first = LeanDecoder(model, 8)
    logits = first.prefill(ids, mask)
    first.keep_caches(5)
    contexts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    active = list(range(5))
    for step in range(4):
        token = logits.argmax(-1)
        for index, row in enumerate(active):
            contexts[row].append(int(token[index]))
        if step == 1:  # rows 1 and 3 end their turn here (they leave with their caches)
            keep = torch.tensor([i for i, row in enumerate(active) if row not in (1, 3)])
            first.keep(keep)
            active = [row for row in active if row not in (1, 3)]
            token = token[keep]
        if step == 3:
            break
        logits = first.step(token)
    kept = first.caches()
    observations = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14], [15]]
    blocks = []
    for row in range(5):
        blocks.append(contexts[row][kept[row].tokens:] + observations[row])
        contexts[row] += observations[row]
    resuming = LeanDecoder(model, 8)
    resumed = resuming.resume([kept[row] for row in range(5)], blocks, ids.device)
    width = max(len(c) for c in contexts)
    full = torch.zeros(5, width, dtype=torch.long)
    full_mask = torch.zeros(5, width, dtype=torch.long)
    for row, context in enumerate(contexts):
        full[row, width - len(context):] = torch.tensor(context)
        full_mask[row, width - len(context):] = 1
    prefilling = LeanDecoder(model, 8)
    torch.testing.assert_close(resumed, prefilling.prefill(full, full_mask), rtol=1e-5, atol=1e-5)
    token = resumed.argmax(-1)  # and the turn's decode goes on alike
    torch.testing.assert_close(resuming.step(token), prefilling.step(token), rtol=1e-5, atol=1e-5)
