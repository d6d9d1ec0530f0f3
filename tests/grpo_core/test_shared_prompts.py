"""Each prompt computed once per group, checked against the plain per-row computation: the
log-prob passes (log-probs, entropies and every gradient, for each family the lean path claims,
with LoRA and with activation checkpointing), the whole update for every loss type, a trainer run
with evaluation, and the decoder that prefills and caches each prompt once (logits through
decode steps and rows leaving, and the tokens sampled)."""

from __future__ import annotations

import pytest
import torch
from core_specs import make_spec
from test_decoders import FAMILIES, VOCAB, _model, _prompts
from test_evaluation import eval_spec
from test_trainer import comparable, gradients, run

import grpo_core.algorithm.shared_prompts as shared_prompts
from grpo_core.algorithm.decoders import LeanDecoder, ModelForwardDecoder
from grpo_core.algorithm.logprobs import completion_logprobs
from grpo_core.algorithm.randomness import row_keys
from grpo_core.algorithm.rollout import PromptBatch, Rollout, SamplingOptions, sample_completions
from grpo_core.algorithm.shared_prompt_decoder import SharedPromptDecoder, decoder_for_groups
from grpo_core.algorithm.shared_prompts import prompt_owners, rollout_logprobs, shares_prompts
from grpo_core.run.components import build_components
from grpo_core.run.trainer import GRPOTrainer

G = 3
EXACT = dict(rtol=1e-5, atol=1e-5)


def _rows(g: int = G) -> Rollout:
    """Five prompts of different lengths (left padding, a one-token prompt), each ``g`` times,
    with completions that end at different places (right padding)."""
    ids, mask = _prompts()
    torch.manual_seed(3)
    n, width = ids.size(0) * g, 7
    completion = torch.randint(2, VOCAB, (n, width))
    completion_mask = torch.ones_like(completion)
    for row, end in ((1, 3), (4, 1), (8, 5), (13, 2)):
        if row < n:
            completion_mask[row, end:] = 0
    completion = completion.masked_fill(completion_mask == 0, 0)
    return Rollout(ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0), completion, completion_mask,
                   torch.zeros(n, dtype=torch.bool))


def _logprobs_and_gradients(model, rows: Rollout, shared: bool):
    model.zero_grad(set_to_none=True)
    if shared:
        assert shares_prompts(model) and prompt_owners(rows.prompt_ids, rows.prompt_mask) is not None
        logp, entropy = rollout_logprobs(model, rows, 0.7, with_entropy=True)
    else:
        logp, entropy = completion_logprobs(model, rows.input_ids, rows.attention_mask,
                                            rows.completion_ids.size(1), 0.7, with_entropy=True)
    # Weights per token, so every position's gradient counts differently.
    weights = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)
    (logp * weights * rows.completion_mask).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    mask = rows.completion_mask.bool()
    return logp.detach()[mask], entropy[mask], grads


def _same_as_plain(model, rows: Rollout) -> None:
    shared, plain = (_logprobs_and_gradients(model, rows, flag) for flag in (True, False))
    torch.testing.assert_close(shared[0], plain[0], **EXACT)
    torch.testing.assert_close(shared[1], plain[1], **EXACT)
    assert shared[2].keys() == plain[2].keys() and plain[2]
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, **EXACT, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_prompt_once_gives_the_plain_forwards_logprobs_and_gradients(family) -> None:
    model = _model(FAMILIES[family]()).train()
    _same_as_plain(model, _rows())


def test_only_the_completions_real_tokens_reach_the_lm_head() -> None:
    model = _model(FAMILIES["llama-gqa"]())
    rows = _rows()
    seen: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0][..., 0].numel()))
    try:
        logp, entropy = rollout_logprobs(model, rows, with_entropy=True)
    finally:
        hook.remove()
    real = rows.completion_mask.bool()
    assert not real.all() and seen == [int(real.sum())]  # the padding never went through it
    assert (logp[~real] == 0).all() and (entropy[~real] == 0).all()
    assert (logp[real] < 0).all()


def test_with_lora_adapters_and_activation_checkpointing() -> None:
    from peft import LoraConfig, get_peft_model

    base = _model(FAMILIES["qwen2-bias"]())
    base.gradient_checkpointing_enable()
    adapters = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    model = get_peft_model(base, adapters)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    model.train()
    _same_as_plain(model, _rows())


def test_rows_without_a_shared_prompt_and_models_it_cannot_serve_take_the_plain_forward() -> None:
    rows = _rows(g=1)
    assert prompt_owners(rows.prompt_ids, rows.prompt_mask) is None
    model = _model(FAMILIES["llama-gqa"]())
    alone = rollout_logprobs(model, rows)[0]
    plain = completion_logprobs(model, rows.input_ids, rows.attention_mask, rows.completion_ids.size(1))[0]
    assert torch.equal(alone, plain)  # the model's forward itself, bit for bit
    config = FAMILIES["llama-gqa"]()
    config.attention_dropout = 0.1  # applied by the model's attention while it trains, not by ours
    dropping = _model(config)
    assert not shares_prompts(dropping.train()) and shares_prompts(dropping.eval())


@pytest.fixture
def plain_only(monkeypatch):
    def off() -> None:
        monkeypatch.setattr(shared_prompts, "shares_prompts", lambda model: False)
    return off


@pytest.mark.parametrize("loss_type, level", [("grpo", "token"), ("bnpo", "token"), ("dr_grpo", "token"),
                                              ("dapo", "token"), ("grpo", "sequence")])
def test_the_update_is_the_plain_ones_for_every_loss_type(tiny_model_dir, tmp_path, plain_only,
                                                         loss_type, level) -> None:
    spec = make_spec(tiny_model_dir, loss_type=loss_type, importance_sampling_level=level, num_generations=4,
                     prompts_per_step=2, max_completion_length=10, num_iterations=2, beta=0.04,
                     gradient_accumulation_steps=2)
    c = build_components(spec, device="cpu")
    exp = GRPOTrainer(c, tmp_path).make_experience()
    exp.old_logprobs = exp.old_logprobs + 0.3 * torch.randn_like(exp.old_logprobs)  # the ratio moves
    shared = gradients(c, exp)
    plain_only()
    plain = gradients(c, exp)
    for a, b in zip(shared, plain, strict=True):
        torch.testing.assert_close(a, b, **EXACT)


def test_a_training_run_with_evaluation_records_what_the_plain_run_records(tiny_model_dir, tmp_path,
                                                                          plain_only) -> None:
    spec = eval_spec(tiny_model_dir, max_steps=2, eval_steps=1, beta=0.04, num_iterations=2)
    _, shared, _ = run(spec, tmp_path / "shared")
    plain_only()
    _, plain, _ = run(spec, tmp_path / "plain")
    assert any(key.startswith("eval") for record in plain.records for key in record)
    assert len(shared.records) == len(plain.records) >= 2
    for ours, theirs in zip(shared.records, plain.records, strict=True):
        ours, theirs = comparable(ours), comparable(theirs)
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            if isinstance(value, float):
                assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
            else:
                assert ours[key] == value, key


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_shared_prompt_decoder_gives_the_model_forwards_logits(family) -> None:
    model = _model(FAMILIES[family]())
    ids, mask = _prompts()
    ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
    ours, reference = decoder_for_groups(model, 8, G), ModelForwardDecoder(model)
    assert isinstance(ours, SharedPromptDecoder)
    with torch.inference_mode():
        mine, theirs = ours.prefill(ids, mask), reference.prefill(ids, mask)
        torch.testing.assert_close(mine, theirs, **EXACT)
        # Rows leave at different steps; at step 3 every row of prompt 1 has left.
        leaving = {1: [0, 4, 14], 3: [3, 5, 7], 5: [1]}
        rows = list(range(ids.size(0)))
        for step in range(7):
            token = theirs.argmax(-1)
            if step in leaving:
                keep = torch.tensor([i for i, row in enumerate(rows) if row not in leaving[step]])
                assert ours.keep(keep) and reference.keep(keep)
                rows = [rows[i] for i in keep.tolist()]
                token = token[keep]
            mine, theirs = ours.step(token), reference.step(token)
            torch.testing.assert_close(mine, theirs, **EXACT, msg=f"decode step {step}")
    assert ours.prompt_valid.size(0) == 4  # prompt 1's cache left with its last row


@pytest.mark.parametrize("options", [
    SamplingOptions(12, temperature=0.9, top_k=20, top_p=0.95),
    SamplingOptions(12, repetition_penalty=1.3, min_p=0.05),
    SamplingOptions(12, greedy=True),
], ids=["sampled", "penalized", "greedy"])
def test_sampling_with_shared_prompt_caches_gives_the_lean_decoders_tokens(monkeypatch, options) -> None:
    import grpo_core.algorithm.rollout as rollout_module

    model = _model(FAMILIES["qwen3-qk-norm"]())
    ids, mask = _prompts()
    prompts, eos = PromptBatch(ids, mask, 0), torch.tensor([1, 5, 9, 48])  # frequent EOS: rows drop out
    keys = row_keys(3, torch.arange(5), 4)
    shared = sample_completions(model, prompts, 4, eos, 0, options, keys)
    monkeypatch.setattr(rollout_module, "decoder_for_groups", lambda model, new, _: LeanDecoder(model, new))
    lean = sample_completions(model, prompts, 4, eos, 0, options, keys)
    assert torch.equal(shared.completion_ids, lean.completion_ids)
    assert torch.equal(shared.completion_mask, lean.completion_mask)
    assert shared.completion_mask.sum(1).min() < shared.completion_ids.size(1), "no row stopped early"
