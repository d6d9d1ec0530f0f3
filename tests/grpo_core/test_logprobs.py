"""Chunked per-token log-probs (docs/grpo_reference.md, step 6) against the naive full log-softmax."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_core.algorithm.logprobs as logprobs_module
from grpo_core.algorithm.logprobs import (
    completion_logprobs,
    position_ids_from_mask,
    selective_log_softmax,
    selective_log_softmax_and_entropy,
)


def naive_logprobs(logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logps.gather(-1, index.unsqueeze(-1)).squeeze(-1)


def _logits_and_index(seed: int, shape: tuple[int, int, int], scale: float = 3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape, generator=gen) * scale
    index = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    return logits, index


@pytest.mark.parametrize("vocab", [5, 128, 1001, 32000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_fp32(vocab: int, temperature: float) -> None:
    logits, index = _logits_and_index(vocab, (3, 4, vocab))
    out = selective_log_softmax(logits, index, temperature)
    assert out.shape == index.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, naive_logprobs(logits, index, temperature), atol=1e-5, rtol=0)
    assert (out <= 0).all()


@pytest.mark.parametrize("vocab", [6, 97, 1000])
@pytest.mark.parametrize("rows_per_chunk", [0.5, 1, 3, 3.5])
def test_chunk_boundaries(monkeypatch: pytest.MonkeyPatch, vocab: int, rows_per_chunk: float) -> None:
    # 0.5 → less than one row per chunk (still one row), 3.5 → chunks that do not split V evenly;
    # 2·5 = 10 rows never divide into chunks of 3 either, so the last chunk is short.
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", int(rows_per_chunk * vocab))
    logits, index = _logits_and_index(vocab + 1, (2, 5, vocab))
    for temperature in (1.0, 0.7):
        logp, entropy = selective_log_softmax_and_entropy(logits, index, temperature)
        torch.testing.assert_close(logp, naive_logprobs(logits, index, temperature), atol=1e-5, rtol=0)
        probs = torch.softmax(logits / temperature, dim=-1)
        torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1), atol=1e-5, rtol=0)


def test_chunking_actually_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = 11
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", 3 * vocab)
    seen: list[int] = []
    real_chunk_pass = logprobs_module._chunk_logprobs_and_entropy

    def spy(chunk: torch.Tensor, *args):
        seen.append(chunk.numel() // chunk.shape[-1])  # tokens in this chunk
        return real_chunk_pass(chunk, *args)

    monkeypatch.setattr(logprobs_module, "_chunk_logprobs_and_entropy", spy)
    logits, index = _logits_and_index(0, (2, 5, vocab))
    selective_log_softmax(logits, index)
    # 5 positions per row, at most 3 tokens per chunk: each row splits into 3 + 2.
    assert seen == [3, 2, 3, 2]


def test_bf16_upcast_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = 32000
    logits, index = _logits_and_index(1, (2, 3, vocab))
    bf16 = logits.to(torch.bfloat16)
    reference = naive_logprobs(bf16.float(), index)
    out = selective_log_softmax(bf16, index)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)
    # A bf16 log_softmax (no upcast) is far off: the test would catch a missing upcast.
    bf16_naive = torch.log_softmax(bf16, dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1).float()
    assert (bf16_naive - reference).abs().max().item() > 1e-3
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", 2 * vocab)
    torch.testing.assert_close(
        selective_log_softmax(bf16, index, 0.7), naive_logprobs(bf16.float(), index, 0.7), atol=1e-5, rtol=0
    )


def test_bf16_large_magnitude_logits_are_finite() -> None:
    logits, index = _logits_and_index(2, (2, 4, 4096))
    big = (logits * 100).to(torch.bfloat16)  # |logits| in the hundreds
    out = selective_log_softmax(big, index)
    assert torch.isfinite(out).all()
    assert (out <= 0).all()
    torch.testing.assert_close(out, naive_logprobs(big.float(), index), atol=1e-4, rtol=1e-6)
    logp, entropy = selective_log_softmax_and_entropy(big, index)
    assert torch.isfinite(entropy).all() and (entropy >= -1e-5).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradient_matches_naive(monkeypatch: pytest.MonkeyPatch, temperature: float) -> None:
    vocab = 50
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", 4 * vocab)
    logits, index = _logits_and_index(3, (3, 5, vocab))
    weights = torch.randn(3, 5, generator=torch.Generator().manual_seed(7))
    ours = logits.clone().requires_grad_(True)
    (selective_log_softmax(ours, index, temperature) * weights).sum().backward()
    naive = logits.clone().requires_grad_(True)
    (naive_logprobs(naive, index, temperature) * weights).sum().backward()
    assert ours.grad is not None and ours.grad.abs().sum() > 0
    torch.testing.assert_close(ours.grad, naive.grad, atol=1e-5, rtol=0)


def test_entropy_is_minus_sum_p_log_p_and_carries_no_grad() -> None:
    logits, index = _logits_and_index(4, (2, 3, 300))
    logits.requires_grad_(True)
    logp, entropy = selective_log_softmax_and_entropy(logits, index, temperature=0.7)
    probs = torch.softmax(logits.detach() / 0.7, dim=-1)
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(logp.detach(), naive_logprobs(logits.detach(), index, 0.7), atol=1e-5, rtol=0)
    assert logp.requires_grad and not entropy.requires_grad
    assert selective_log_softmax_and_entropy(logits, index, with_entropy=False)[1] is None


def test_uniform_logits_give_log_v() -> None:
    vocab = 64
    out, entropy = selective_log_softmax_and_entropy(
        torch.zeros(2, 3, vocab), torch.zeros(2, 3, dtype=torch.long)
    )
    torch.testing.assert_close(out, torch.full((2, 3), -torch.log(torch.tensor(64.0)).item()))
    torch.testing.assert_close(entropy, torch.full((2, 3), torch.log(torch.tensor(64.0)).item()))


def test_non_positive_temperature_raises() -> None:
    logits, index = _logits_and_index(0, (1, 2, 4))
    with pytest.raises(ValueError, match="temperature"):
        selective_log_softmax(logits, index, temperature=0.0)


def test_position_ids_from_mask_hand_case() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 1, 2, 2]])
    assert torch.equal(position_ids_from_mask(mask), expected)


# llama has rotary positions, which a constant left-padding offset cannot change; gpt2 has absolute
# position embeddings, so only it catches positions that fail to skip the padding.
@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny_model(request: pytest.FixtureRequest, tiny_model_factory) -> torch.nn.Module:
    folder: Path = tiny_model_factory(request.param)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logprobs_left_padded_batch_matches_unpadded_rows(
    tiny_model: torch.nn.Module, temperature: float
) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab, pad = tiny_model.config.vocab_size, tiny_model.config.pad_token_id
    prompt_lengths, completion_lengths, t = [2, 5, 8], [4, 2, 3], 4  # row 1 and 2 end early
    prompts = [torch.randint(5, vocab, (p,), generator=gen) for p in prompt_lengths]
    completions = [torch.randint(5, vocab, (c,), generator=gen) for c in completion_lengths]
    p_max = max(prompt_lengths)
    input_ids = torch.full((3, p_max + t), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        input_ids[i, p_max - len(prompt) : p_max] = prompt
        input_ids[i, p_max : p_max + len(completion)] = completion
        attention_mask[i, p_max - len(prompt) : p_max + len(completion)] = 1

    with torch.no_grad():
        batched, entropy = completion_logprobs(
            tiny_model, input_ids, attention_mask, t, temperature, with_entropy=True
        )
        assert batched.shape == (3, t) and entropy is not None and entropy.shape == (3, t)
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row = torch.cat([prompt, completion]).unsqueeze(0)
            logits = tiny_model(input_ids=row).logits[0].float() / temperature
            # Logits at position j predict token j+1: completion tokens are predicted from len(prompt)-1 on.
            predicting = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
            expected = torch.log_softmax(predicting, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(batched[i, : len(completion)], expected, atol=1e-5, rtol=0)
    assert (batched[0] < 0).all()


def test_a_sliced_view_is_chunked_without_copying_the_whole_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training path passes ``logits[:, :-1]`` (non-contiguous); gradients must still match."""
    vocab = 13
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", 2 * vocab)
    full, index = _logits_and_index(4, (3, 6, vocab))
    full = full.clone().requires_grad_(True)
    view = full[:, :-1, :]
    ours = selective_log_softmax(view, index[:, :-1], temperature=0.7)
    (ours * torch.arange(ours.numel()).view_as(ours)).sum().backward()
    grad_ours = full.grad.clone()
    full.grad = None
    naive = naive_logprobs(full[:, :-1, :], index[:, :-1], 0.7)
    (naive * torch.arange(naive.numel()).view_as(naive)).sum().backward()
    torch.testing.assert_close(ours, naive, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad_ours, full.grad, atol=1e-5, rtol=1e-5)
