"""Sampling filters (temperature, top-k, top-p) on hand-computed cases and sampled frequencies."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_core.algorithm.randomness import row_keys, token_uniforms
from grpo_core.algorithm.sampling import apply_top_k, apply_top_p, sample_next_token


def _kept(logits: torch.Tensor) -> list[list[bool]]:
    return torch.isfinite(logits).tolist()


def test_top_k_keeps_exactly_k() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
    out = apply_top_k(logits, 2)
    assert _kept(out) == [[False, True, False, True, False], [True, True, False, False, False]]
    assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])  # kept logits unchanged


def test_top_k_keeps_ties_at_threshold() -> None:
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]])
    assert _kept(apply_top_k(logits, 2)) == [[False, True, True, True, False]]
    assert _kept(apply_top_k(logits, 1)) == [[False, True, True, True, False]]


@pytest.mark.parametrize("k", [0, -1, 5, 9])
def test_top_k_disabled(k: int) -> None:
    logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(apply_top_k(logits, k), logits)


PROBS = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.8, [True, True, False, False]),  # 0.5 + 0.3 reaches 0.8 exactly
        (0.79, [True, True, False, False]),
        (0.81, [True, True, True, False]),
        (0.5, [True, False, False, False]),
        (0.96, [True, True, True, True]),
        (1e-6, [True, False, False, False]),  # the top token is always kept
        (1.0, [True, True, True, True]),
    ],
)
def test_top_p_hand_case(top_p: float, expected: list[bool]) -> None:
    # fp32, the dtype sample_next_token filters in. The order is shuffled to check un-sorting.
    order = [2, 0, 3, 1]
    logits = torch.tensor([[PROBS[i] for i in order]], dtype=torch.float32).log()
    out = apply_top_p(logits, top_p)
    assert _kept(out) == [[expected[i] for i in order]]
    assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])


def test_top_p_is_per_row() -> None:
    logits = torch.tensor([PROBS, [0.25, 0.25, 0.25, 0.25]]).log()
    assert _kept(apply_top_p(logits, 0.6)) == [[True, True, False, False], [True, True, True, False]]


def test_greedy_is_argmax() -> None:
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sample_next_token(logits, temperature=0.3, greedy=True), logits.argmax(dim=-1))
    assert torch.equal(
        sample_next_token(logits, temperature=5.0, top_k=3, top_p=0.1, greedy=True), logits.argmax(dim=-1)
    )


def _frequencies(logits: torch.Tensor, draws: int, **kwargs) -> torch.Tensor:
    uniforms = token_uniforms(row_keys(1234, torch.arange(draws), 1), 0)
    tokens = sample_next_token(logits.expand(draws, -1), uniforms=uniforms, **kwargs)
    assert tokens.shape == (draws,)
    return torch.bincount(tokens, minlength=logits.size(-1)).double()


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, "sampled a token with zero probability"
    return float((((counts - expected) ** 2)[support] / expected[support]).sum())


# 99.9th percentiles of chi-square with 5, 3 and 2 degrees of freedom: a deterministic seed, loose bound.
CHI2_DF5 = 20.52
CHI2_DF3 = 16.27
CHI2_DF2 = 13.82


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_sampling_frequencies_follow_tempered_softmax(temperature: float) -> None:
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0, -1.0]])
    probs = torch.softmax(logits[0] / temperature, dim=-1)
    counts = _frequencies(logits, 40000, temperature=temperature)
    assert _chi_square(counts, probs) < CHI2_DF5
    # And clearly not another temperature's distribution.
    other = torch.softmax(logits[0] / (temperature * 2), dim=-1)
    assert _chi_square(counts, other) > 10 * CHI2_DF5


def test_sampling_frequencies_with_top_k_and_top_p() -> None:
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0, -1.0]])
    temperature = 0.8
    top_k = apply_top_k(logits / temperature, 4)  # keeps tokens 0, 1, 3, 4
    counts = _frequencies(logits, 40000, temperature=temperature, top_k=4)
    assert _chi_square(counts, torch.softmax(top_k[0], dim=-1)) < CHI2_DF3

    # top_p 0.88 on tempered probs: keep the smallest prefix whose mass reaches 0.88 (3 tokens).
    probs = torch.softmax(logits[0] / temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = int((sorted_probs.cumsum(0) < 0.88).sum().item()) + 1
    assert keep == 3
    nucleus = torch.zeros_like(probs)
    nucleus[order[:keep]] = sorted_probs[:keep] / sorted_probs[:keep].sum()
    counts = _frequencies(logits, 40000, temperature=temperature, top_p=0.88)
    assert _chi_square(counts, nucleus) < CHI2_DF2
    assert math.isclose(float(counts.sum()), 40000.0)


@pytest.mark.parametrize("vocab", [5, 300, 1024, 1025, 2000, 32000])
def test_two_level_inverse_cdf_matches_one_long_cumsum(vocab: int) -> None:
    from grpo_core.algorithm.sampling import ONE_LEVEL_MAX_VOCAB, inverse_cdf

    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(64, vocab, generator=gen) * 4
    logits[:, ::3] = float("-inf")  # filtered tokens: zero mass, never drawn
    logits[:, 1] = 0.0  # every row keeps some mass
    probs = logits.softmax(-1)
    uniforms = torch.rand(64, generator=gen, dtype=torch.float64)
    uniforms[:4] = torch.tensor([0.0, 0.5, 1.0 - 2.0**-53, 1.0 - 2.0**-40], dtype=torch.float64)
    cdf = probs.double().cumsum(-1)
    expected = torch.searchsorted(cdf, (uniforms.unsqueeze(1) * cdf[:, -1:]), right=True).squeeze(1)
    got = inverse_cdf(probs, uniforms)
    assert (probs.gather(1, got.unsqueeze(1)) > 0).all()
    # Summing by blocks rounds differently from one long cumsum only within an ulp of a boundary.
    agree = (got == expected.clamp(max=vocab - 1)).float().mean().item()
    assert agree == 1.0 if vocab <= ONE_LEVEL_MAX_VOCAB else agree >= 62 / 64
