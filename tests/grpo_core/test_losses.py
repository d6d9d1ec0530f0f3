"""Clipped surrogate, k3 KL and aggregation (docs/grpo_reference.md, steps 8–10) against
hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_core.algorithm.losses import (
    AGGREGATORS,
    StepTotals,
    aggregate_loss,
    clip_counts,
    k3_kl,
    policy_loss_terms,
)

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


def _single_token_loss(
    ratio: float, advantage: float, eps_low: float = 0.2, eps_high: float = 0.2, delta: float | None = None
) -> float:
    logprobs = torch.tensor([[math.log(ratio)]], dtype=torch.float64)
    terms = policy_loss_terms(
        logprobs,
        torch.zeros_like(logprobs),
        torch.tensor([advantage], dtype=torch.float64),
        eps_low,
        eps_high,
        delta=delta,
    )
    assert terms.kl is None
    return terms.per_token_loss.item()


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected"),
    [
        (1.5, 2.0, -1.2 * 2.0),  # A > 0, ratio above 1+ε: clipped at 1.2
        (0.5, 2.0, -0.5 * 2.0),  # A > 0, ratio below 1−ε: min picks the unclipped 0.5·A
        (0.5, -1.0, 0.8),  # A < 0, ratio below 1−ε: clipped at 0.8 → −0.8·A
        (1.5, -1.0, 1.5),  # A < 0, ratio above 1+ε: unclipped, the pessimistic side
        (1.1, 3.0, -1.1 * 3.0),  # inside the trust region: plain ratio·A
        (5.0, 0.0, 0.0),  # zero advantage: no loss whatever the ratio
    ],
)
def test_clipped_surrogate_hand_cases(ratio: float, advantage: float, expected: float) -> None:
    assert _single_token_loss(ratio, advantage) == pytest.approx(expected, abs=1e-12)


def test_dual_clip_delta_caps_ratio_for_negative_advantage() -> None:
    assert _single_token_loss(5.0, -1.0) == pytest.approx(5.0)
    assert _single_token_loss(5.0, -1.0, delta=3.0) == pytest.approx(3.0)
    assert _single_token_loss(2.0, -1.0, delta=3.0) == pytest.approx(2.0)  # below delta: untouched
    # A > 0: the clipped 1+ε side wins before delta matters.
    assert _single_token_loss(5.0, 1.0, delta=3.0) == pytest.approx(-1.2)


def test_ratio_reported_is_after_delta_cap() -> None:
    logprobs = torch.log(torch.tensor([[5.0, 2.0, 0.5]]))
    terms = policy_loss_terms(logprobs, torch.zeros_like(logprobs), torch.tensor([-1.0]), 0.2, 0.2, delta=3.0)
    torch.testing.assert_close(terms.ratio, torch.tensor([[3.0, 2.0, 0.5]]))


def test_epsilon_high_is_asymmetric() -> None:
    # ε_low = 0.2, ε_high = 0.28 (DAPO clip-higher).
    assert _single_token_loss(1.25, 1.0, 0.2, 0.28) == pytest.approx(-1.25)  # 1.2 < 1.25 < 1.28: not clipped
    assert _single_token_loss(1.25, 1.0, 0.2, 0.2) == pytest.approx(-1.2)
    assert _single_token_loss(1.5, 1.0, 0.2, 0.28) == pytest.approx(-1.28)
    assert _single_token_loss(0.75, -1.0, 0.2, 0.28) == pytest.approx(0.8)  # low side still uses ε_low
    assert _single_token_loss(0.75, -1.0, 0.3, 0.28) == pytest.approx(0.75)


def test_k3_kl_formula_and_non_negative() -> None:
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 5
    ref = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 5
    kl = k3_kl(logprobs, ref)
    d = ref - logprobs
    torch.testing.assert_close(kl, torch.exp(d) - d - 1)
    assert (kl >= 0).all()
    assert k3_kl(logprobs, logprobs).abs().max().item() == 0.0
    # Hand case: logp = log 0.5, ref = log 0.25 → d = −log 2 → 0.5 + log 2 − 1.
    hand = k3_kl(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])).item()
    assert hand == pytest.approx(0.5 + math.log(2) - 1, abs=1e-7)


def test_kl_term_is_bias_corrected_by_ratio() -> None:
    logprobs = torch.tensor([[math.log(1.5)]], dtype=torch.float64)
    old = torch.zeros_like(logprobs)
    ref = torch.zeros_like(logprobs)
    terms = policy_loss_terms(
        logprobs, old, torch.tensor([2.0], dtype=torch.float64), 0.2, 0.2, beta=0.1, ref_logprobs=ref
    )
    k3 = 1 / 1.5 + math.log(1.5) - 1  # exp(d) − d − 1 with d = −log 1.5
    assert terms.kl is not None
    assert terms.kl.item() == pytest.approx(1.5 * k3, abs=1e-12)
    assert terms.per_token_loss.item() == pytest.approx(-1.2 * 2.0 + 0.1 * 1.5 * k3, abs=1e-12)


def test_beta_without_reference_raises() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss_terms(x, x, torch.zeros(1), 0.2, 0.2, beta=0.04)


def _masked_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n, t = 6, 5
    loss = torch.randn(n, t, generator=gen, dtype=torch.float64)
    lengths = [5, 3, 1, 4, 2, 5]
    mask = torch.tensor([[1.0] * k + [0.0] * (t - k) for k in lengths], dtype=torch.float64)
    return loss, mask, lengths


def naive_aggregate(
    loss_type: str, loss: torch.Tensor, lengths: list[int], max_len: int, generation_tokens: float
) -> float:
    rows = [[loss[i, j].item() for j in range(k)] for i, k in enumerate(lengths)]
    total = sum(sum(r) for r in rows)
    if loss_type == "grpo":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if loss_type == "bnpo":
        return total / sum(lengths)
    if loss_type == "dr_grpo":
        return total / (len(rows) * max_len)
    if loss_type == "dapo":
        return total / generation_tokens
    raise AssertionError(loss_type)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_aggregate_loss_matches_reference_formulas(loss_type: str) -> None:
    loss, mask, lengths = _masked_batch()
    max_len = 8  # max_completion_length may exceed the longest completion in the batch
    totals = StepTotals(rows=6, tokens=float(sum(lengths)), max_completion_length=max_len)
    out = aggregate_loss(loss_type, loss, mask, totals).item()
    assert out == pytest.approx(naive_aggregate(loss_type, loss, lengths, max_len, sum(lengths)), abs=1e-12)


def test_loss_types_differ_on_uneven_lengths() -> None:
    loss, mask, lengths = _masked_batch()
    totals = StepTotals(rows=6, tokens=float(sum(lengths)), max_completion_length=8)
    values = {lt: aggregate_loss(lt, loss, mask, totals).item() for lt in ("grpo", "bnpo", "dr_grpo")}
    assert len({round(v, 9) for v in values.values()}) == 3


def test_masked_positions_do_not_contribute() -> None:
    loss, mask, _ = _masked_batch()
    poisoned = torch.where(mask.bool(), loss, torch.full_like(loss, 1e6))
    totals = StepTotals(rows=6, tokens=float(mask.sum()), max_completion_length=5)
    for loss_type in LOSS_TYPES:
        assert aggregate_loss(loss_type, poisoned, mask, totals).item() == pytest.approx(
            aggregate_loss(loss_type, loss, mask, totals).item(), abs=1e-9
        )


def test_grpo_empty_row_counts_as_zero() -> None:
    loss = torch.ones(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    totals = StepTotals(rows=2, tokens=2.0, max_completion_length=3)
    assert aggregate_loss("grpo", loss, mask, totals).item() == pytest.approx(0.5)


def _policy_loss_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    n, t = 6, 5
    logprobs = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    old = (
        logprobs + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.4
    )  # off-policy: clipping both ways
    ref = logprobs + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.3
    advantages = torch.randn(n, generator=gen, dtype=torch.float64)
    _, mask, _ = _masked_batch(seed)
    return logprobs, old, ref, advantages, mask


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("splits", [[6], [3, 3], [2, 2, 2], [1, 4, 1], [5, 1]])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_gradient_accumulation_invariance(loss_type: str, splits: list[int], beta: float) -> None:
    logprobs, old, ref, advantages, mask = _policy_loss_inputs(1)
    totals = StepTotals(rows=6, tokens=float(mask.sum()), max_completion_length=7)

    def micro_loss(lp: torch.Tensor, rows: slice) -> torch.Tensor:
        terms = policy_loss_terms(
            lp, old[rows], advantages[rows], 0.2, 0.28, delta=2.0, beta=beta, ref_logprobs=ref[rows]
        )
        return aggregate_loss(loss_type, terms.per_token_loss, mask[rows], totals)

    full_leaf = logprobs.clone().requires_grad_(True)
    full = micro_loss(full_leaf, slice(0, 6))
    full.backward()

    accum_leaf = logprobs.clone().requires_grad_(True)
    accumulated, start = 0.0, 0
    for size in splits:
        part = micro_loss(accum_leaf[start : start + size], slice(start, start + size))
        part.backward()  # one backward per micro-batch, grads accumulate on the leaf
        accumulated += part.item()
        start += size

    assert accumulated == pytest.approx(full.item(), abs=1e-9)
    assert full_leaf.grad is not None and full_leaf.grad.abs().sum() > 0
    torch.testing.assert_close(accum_leaf.grad, full_leaf.grad, atol=1e-6, rtol=0)


def test_clip_counts_hand_case() -> None:
    ratio = torch.tensor([[0.5, 1.0, 1.5, 0.7], [0.5, 1.3, 1.25, 0.79]])
    advantages = torch.tensor([-1.0, 1.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    counts = clip_counts(ratio, advantages, mask, epsilon_low=0.2, epsilon_high=0.28)
    # Row 0 (A<0): 0.5 is low-clipped; 1.5 is above but A<0 pushes down: not counted; 0.7 masked.
    # Row 1 (A>0): 1.3 > 1.28 high-clipped; 1.25 inside; 0.5 and 0.79 low but A>0: not counted.
    assert (counts.low, counts.high, counts.region) == (1.0, 1.0, 2.0)


def test_clip_counts_zero_on_policy() -> None:
    counts = clip_counts(torch.ones(3, 4), torch.tensor([1.0, -1.0, 0.0]), torch.ones(3, 4), 0.2, 0.2)
    assert (counts.low, counts.high, counts.region) == (0.0, 0.0, 0.0)


def test_unknown_loss_type_lists_valid_names() -> None:
    totals = StepTotals(rows=1, tokens=1.0, max_completion_length=1)
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'") as info:
        aggregate_loss("ppo", torch.zeros(1, 1), torch.ones(1, 1), totals)
    for name in AGGREGATORS:
        assert name in str(info.value)
    assert set(AGGREGATORS) == set(LOSS_TYPES)
