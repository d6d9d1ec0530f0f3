"""GSPO (importance_sampling_level: sequence) against a hand-computed case."""

from __future__ import annotations

import math

import pytest
import torch
from core_specs import make_spec
from run_records import records

from grpo_core.algorithm.losses import StepTotals, aggregate_loss, clip_counts, policy_loss_terms
from grpo_core.algorithm.update import StepSums, micro_batch_loss
from grpo_core.run.local_run import run_local
from grpo_core.spec.grpo_config import GRPOConfig

# Three completions; row 0 has a masked third token whose huge log-ratio must not count.
LOG_RATIO = torch.tensor([[0.1, 0.3, 5.0], [-0.5, 0.0, 0.0], [0.05, -0.05, 0.1]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
ADVANTAGES = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)


def _terms(logprobs: torch.Tensor):
    return policy_loss_terms(
        logprobs, torch.zeros_like(logprobs), ADVANTAGES, 0.2, 0.2,
        importance_sampling_level="sequence", mask=MASK,
    )


def test_sequence_weight_is_the_exp_of_the_mean_masked_log_ratio() -> None:
    terms = _terms(LOG_RATIO)
    weights = [math.exp(0.2), math.exp(-0.5), math.exp(0.1 / 3)]
    torch.testing.assert_close(terms.ratio, torch.tensor(weights, dtype=torch.float64).unsqueeze(1))
    # Row 0: A > 0 and 1.2214 > 1.2, clipped to 1.2. Row 1: A < 0 and 0.6065 < 0.8, clipped to 0.8.
    # Row 2: inside the trust region, −A·w. Every token of a row carries its row's value.
    expected = torch.tensor([-1.2, 0.8, -2.0 * weights[2]], dtype=torch.float64).unsqueeze(1).expand(3, 3)
    torch.testing.assert_close(terms.per_token_loss, expected)


def test_sequence_gradient_spreads_over_the_completion_tokens() -> None:
    logprobs = LOG_RATIO.clone().requires_grad_(True)
    totals = StepTotals(rows=3, tokens=float(MASK.sum()), max_completion_length=3)
    aggregate_loss("grpo", _terms(logprobs).per_token_loss, MASK.double(), totals).backward()
    # Clipped rows get no gradient; row 2's loss −A·w/3 (mean over 3 rows) has d/d logp_t = −A·w/3 · 1/3.
    expected = torch.zeros(3, 3, dtype=torch.float64)
    expected[2] = -2.0 * math.exp(0.1 / 3) / 9
    torch.testing.assert_close(logprobs.grad, expected)


def test_sequence_clip_fractions_count_completions() -> None:
    terms = _terms(LOG_RATIO)
    counts = clip_counts(terms.ratio, ADVANTAGES, MASK, 0.2, 0.2)
    assert (counts.low, counts.high, counts.region, counts.units) == (1.0, 1.0, 2.0, 3.0)
    token_counts = clip_counts(torch.exp(LOG_RATIO), ADVANTAGES, MASK, 0.2, 0.2)
    assert token_counts.units == float(MASK.sum())


def test_update_reports_sequence_clip_fractions() -> None:
    config = GRPOConfig(importance_sampling_level="sequence", epsilon=0.2, beta=0.0, loss_type="grpo")
    sums = StepSums()
    logprobs = LOG_RATIO.float() - 1.0
    micro_batch_loss(logprobs, logprobs - LOG_RATIO.float(), ADVANTAGES.float(), MASK,
                     StepTotals(3, float(MASK.sum()), 3), config, sums)
    metrics = sums.metrics(float(MASK.sum()), with_kl=False)
    assert metrics["clip_ratio/low_mean"] == pytest.approx(1 / 3)
    assert metrics["clip_ratio/region_mean"] == pytest.approx(2 / 3)


def test_unknown_level_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: token, sequence"):
        policy_loss_terms(LOG_RATIO, LOG_RATIO, ADVANTAGES, 0.2, 0.2, importance_sampling_level="seq")


def test_sequence_level_trains_through_the_real_loop(tiny_model_dir, tmp_path):
    """GSPO on the tiny model with a round of 2 steps: the second step is off-policy, and its clip
    fractions are counts of whole completions (of the step's B·G = 8), not of tokens."""
    spec = make_spec(
        tiny_model_dir, max_steps=2, steps_per_generation=2, importance_sampling_level="sequence",
        loss_type="grpo", learning_rate=3e-2, epsilon=0.001, epsilon_high=0.001,
    )
    result = run_local(spec, tmp_path, tmp_path / "out", device="cpu", progress=False)
    assert result.step == 2
    first, second = records(tmp_path / "out", "metrics")
    assert first["clip_ratio/region_mean"] == 0.0  # on-policy: every weight is 1
    clipped = second["clip_ratio/region_mean"] * 8
    assert clipped > 0 and clipped == pytest.approx(round(clipped), abs=1e-9)
