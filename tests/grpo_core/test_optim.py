"""Learning-rate schedules against hand-computed values (transformers' formulas; the comparison
with ``transformers.get_scheduler`` itself is in test_trl_config_compat.py)."""

from __future__ import annotations

import math

import pytest

from grpo_core.optim import lr_multiplier


def test_warmup_starts_at_zero_then_holds():
    assert [lr_multiplier(s, "constant_with_warmup", 4, 10) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1, 1]


def test_constant_never_warms_up():
    """transformers' ``constant`` ignores warmup; ``constant_with_warmup`` is the one that warms up."""
    assert [lr_multiplier(s, "constant", 4, 10) for s in range(3)] == [1.0, 1.0, 1.0]


def test_linear_decays_to_zero_at_the_last_step():
    assert lr_multiplier(2, "linear", 2, 12) == 1.0
    assert lr_multiplier(7, "linear", 2, 12) == pytest.approx(0.5)
    assert lr_multiplier(12, "linear", 2, 12) == 0.0


def test_cosine_follows_half_a_cosine():
    assert lr_multiplier(0, "cosine", 0, 10) == 1.0
    assert lr_multiplier(5, "cosine", 0, 10) == pytest.approx(0.5)
    assert lr_multiplier(3, "cosine", 0, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.3)))


def test_unknown_schedule_lists_the_valid_ones():
    with pytest.raises(ValueError, match="constant, constant_with_warmup, linear, cosine"):
        lr_multiplier(5, "step", 0, 10)
