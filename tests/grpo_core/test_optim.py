"""Learning-rate schedules against hand-computed values (transformers' formulas; the comparison
with ``transformers.get_scheduler`` itself is in test_trl_config_compat.py)."""

from __future__ import annotations

import math

import pytest

from grpo_core.algorithm.optim import lr_multiplier


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


def test_adamw_is_fused_for_plain_cpu_parameters_and_steps_like_the_loop():
    import torch

    from grpo_core.algorithm.optim import build_optimizer
    from grpo_core.spec.grpo_config import GRPOConfig

    config = GRPOConfig(learning_rate=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    fused_model = torch.nn.Linear(8, 4)
    loop_model = torch.nn.Linear(8, 4)
    loop_model.load_state_dict(fused_model.state_dict())
    fused = build_optimizer(fused_model, config)
    assert fused.param_groups[0]["fused"] is True
    loop = torch.optim.AdamW(
        loop_model.parameters(), lr=1e-2, betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon, weight_decay=0.1, foreach=False,
    )
    batch = torch.randn(16, 8)
    for _ in range(3):
        for model, opt in ((fused_model, fused), (loop_model, loop)):
            opt.zero_grad()
            model(batch).pow(2).mean().backward()
            opt.step()
    for a, b in zip(fused_model.parameters(), loop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
