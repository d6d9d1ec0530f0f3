"""Log-prob and entropy precision at real vocabulary sizes (Qwen's 151,936; 256,000), fp32 logits,
against an fp64 reference and against TRL's ``logit − logsumexp`` on the same tensors (TRL is a
test-only reference)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from grpo_core.algorithm.logprobs import selective_log_softmax_and_entropy

ROWS, TOKENS = 2, 8
LOGPROB_ATOL = 2e-6
ENTROPY_ATOL = 5e-6


@pytest.fixture(scope="module")
def trl_utils() -> ModuleType:
    from trl.trainer import utils

    return utils


def lm_like_logits(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 logits ``(ROWS, TOKENS, vocab)`` shaped like a language model's, and sampled tokens.

    Every position has a normal background (std 3, the spread of a trained LM's logits); odd
    positions are confident: a few tokens far above it (up to +30) and a few far below (down to
    −50), as after a strongly predictive context. Even positions are flat, high-entropy rows,
    where every one of the ``vocab`` terms counts in the normaliser. Tokens are drawn from the
    distribution itself, as a rollout draws them.
    """
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, TOKENS, vocab, generator=gen) * 3.0 - 1.0
    confident = logits[:, 1::2]
    high = torch.randint(0, vocab, (*confident.shape[:-1], 16), generator=gen)
    confident.scatter_(-1, high, 10.0 + 20.0 * torch.rand(high.shape, generator=gen))
    low = torch.randint(0, vocab, (*confident.shape[:-1], 16), generator=gen)
    confident.scatter_(-1, low, -20.0 - 30.0 * torch.rand(low.shape, generator=gen))
    probs = torch.softmax(logits.double(), dim=-1).view(-1, vocab)
    index = torch.multinomial(probs, 1, generator=gen).view(ROWS, TOKENS)
    return logits, index


def fp64_reference(logits: torch.Tensor, index: torch.Tensor, temperature: float):
    log_probs = torch.log_softmax(logits.double() / temperature, dim=-1)
    logp = log_probs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


def max_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return (value.double() - reference).abs().max().item()


@pytest.mark.parametrize("vocab", [151_936, 256_000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
# A constant offset leaves the distribution as it is; +70 puts the top logits past where fp32
# exp overflows (88.7) and -60 every exp(logit) under 1e-13: both take the max-shifted sum.
@pytest.mark.parametrize("offset", [0.0, 70.0, -60.0])
def test_logprobs_within_2e6_of_fp64_and_no_worse_than_trl(
    trl_utils: ModuleType, vocab: int, temperature: float, offset: float
) -> None:
    logits, index = lm_like_logits(vocab, seed=vocab)
    logits += offset
    ref_logp, _ = fp64_reference(logits, index, temperature)
    ours, _ = selective_log_softmax_and_entropy(logits, index, temperature, with_entropy=False)
    theirs = trl_utils.selective_log_softmax(logits, index, temperature)
    assert ours.dtype == torch.float32
    ours_error, trl_error = max_error(ours, ref_logp), max_error(theirs, ref_logp)
    assert ours_error <= LOGPROB_ATOL, f"max |ours - fp64| = {ours_error:.3g}"
    assert ours_error <= trl_error, f"ours {ours_error:.3g} vs TRL {trl_error:.3g}"


@pytest.mark.parametrize("vocab", [151_936, 256_000])
def test_entropy_close_to_fp64_and_no_worse_than_trl(trl_utils: ModuleType, vocab: int) -> None:
    logits, index = lm_like_logits(vocab, seed=vocab + 1)
    ref_logp, ref_entropy = fp64_reference(logits, index, 1.0)
    logp, entropy = selective_log_softmax_and_entropy(logits, index)
    assert entropy is not None
    # The flat rows are where the entropy is large (~log V) and hardest to get right.
    assert ref_entropy[:, 0::2].min() > 5.0
    entropy_error = max_error(entropy, ref_entropy)
    trl_error = max_error(trl_utils.entropy_from_logits(logits), ref_entropy)
    assert entropy_error <= ENTROPY_ATOL, f"max |ours - fp64| = {entropy_error:.3g}"
    assert entropy_error <= trl_error, f"ours {entropy_error:.3g} vs TRL {trl_error:.3g}"
    assert max_error(logp, ref_logp) <= LOGPROB_ATOL  # the same numbers with the entropy path on
