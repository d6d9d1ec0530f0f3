"""Rewards → advantages (docs/grpo_reference.md, steps 4–5) against a naive per-group Python loop."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_core.algorithm.advantages import STD_EPSILON, combine_rewards, compute_advantages, group_std, nanstd

NAN = float("nan")


def _stdev_or_nan(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else NAN


def naive_advantages(rewards: list[float], g: int, scale_rewards: str) -> tuple[list[float], list[float]]:
    """Per-group loop over plain floats: ``(advantages, std each row was scaled by)``."""
    scored = [r for r in rewards if not math.isnan(r)]
    batch_std = _stdev_or_nan(scored)
    advantages: list[float] = []
    stds: list[float] = []
    for start in range(0, len(rewards), g):
        group = rewards[start : start + g]
        present = [r for r in group if not math.isnan(r)]
        mean = statistics.mean(present) if present else NAN
        std = batch_std if scale_rewards == "batch" else _stdev_or_nan(present)
        for r in group:
            a = r - mean
            if scale_rewards != "none":
                a = a / (std + STD_EPSILON)
            advantages.append(0.0 if math.isnan(a) else a)
            stds.append(std)
    return advantages, stds


def _random_rewards(seed: int, n: int, nan_fraction: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n, generator=gen) * 2.0 + 0.5
    if nan_fraction:
        rewards[torch.rand(n, generator=gen) < nan_fraction] = NAN
    return rewards


def _assert_close_nan(actual: torch.Tensor, expected: list[float], atol: float) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5, equal_nan=True
    )


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("g", [2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_loop(scale_rewards: str, g: int, seed: int) -> None:
    rewards = _random_rewards(seed, n=g * 5)
    out = compute_advantages(rewards, g, scale_rewards)
    expected_adv, expected_std = naive_advantages(rewards.tolist(), g, scale_rewards)
    _assert_close_nan(out.advantages, expected_adv, atol=1e-5)
    _assert_close_nan(out.std, expected_std, atol=1e-5)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", [3, 4])
def test_matches_naive_loop_with_unscorable_rows(scale_rewards: str, seed: int) -> None:
    g = 4
    rewards = _random_rewards(seed, n=g * 6, nan_fraction=0.3)
    assert torch.isnan(rewards).any()
    out = compute_advantages(rewards, g, scale_rewards)
    expected_adv, _ = naive_advantages(rewards.tolist(), g, scale_rewards)
    _assert_close_nan(out.advantages, expected_adv, atol=1e-5)
    assert not torch.isnan(out.advantages).any()
    assert (out.advantages[torch.isnan(rewards)] == 0).all()


def test_hand_computed_group_of_four() -> None:
    out = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, "group")
    std = 0.5773502691896258  # unbiased std of [1, 0, 0, 1] = sqrt(1/3)
    a = 0.5 / (std + 1e-4)
    torch.testing.assert_close(out.advantages, torch.tensor([a, -a, -a, a]), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, torch.full((4,), std), atol=1e-6, rtol=0)
    assert not out.is_std_zero.any()


def test_hand_computed_none_and_batch() -> None:
    rewards = torch.tensor([1.0, 0.0, 3.0, 3.0])  # groups of 2: means 0.5 and 3.0
    none = compute_advantages(rewards, 2, "none")
    torch.testing.assert_close(none.advantages, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    batch = compute_advantages(rewards, 2, "batch")
    batch_std = statistics.stdev([1.0, 0.0, 3.0, 3.0])
    torch.testing.assert_close(batch.advantages, torch.tensor([0.5, -0.5, 0.0, 0.0]) / (batch_std + 1e-4))


def test_equal_rewards_group_has_zero_advantage_and_is_flagged() -> None:
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.7, 1.0, 0.0, 0.25, 0.5])
    out = compute_advantages(rewards, 4, "group")
    assert out.advantages[:4].abs().max().item() == 0.0
    assert out.is_std_zero.tolist() == [True] * 4 + [False] * 4
    assert out.advantages[4:].abs().min().item() > 0.0
    none = compute_advantages(rewards, 4, "none")
    assert none.is_std_zero.tolist() == [True] * 4 + [False] * 4


def test_combine_rewards_weights_and_nansum() -> None:
    per_func = torch.tensor(
        [
            [1.0, 2.0, 0.5],
            [NAN, 2.0, 1.0],  # one function not applicable: the others still count
            [NAN, NAN, NAN],  # unscorable
            [0.0, NAN, NAN],
        ]
    )
    weights = torch.tensor([1.0, 0.5, -2.0])
    out = combine_rewards(per_func, weights)
    assert out[0].item() == pytest.approx(1.0 + 1.0 - 1.0)
    assert out[1].item() == pytest.approx(1.0 - 2.0)
    assert math.isnan(out[2].item())
    assert out[3].item() == 0.0


def test_unscorable_row_excluded_from_group_statistics() -> None:
    per_func = torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, NAN], [2.0, NAN], [1.0, 1.0], [0.0, 0.0]])
    rewards = combine_rewards(per_func, torch.tensor([1.0, 1.0]))
    assert math.isnan(rewards[1].item())
    out = compute_advantages(rewards, 3, "group")
    # Group 0 is [1, NaN, 0]: mean 0.5 and std over {1, 0} only; a 0 reward would give mean 1/3.
    std = statistics.stdev([1.0, 0.0])
    a = 0.5 / (std + 1e-4)
    torch.testing.assert_close(out.advantages[:3], torch.tensor([a, 0.0, -a]))
    assert out.std[0].item() == pytest.approx(std, abs=1e-6)
    # Group 1 is [2, 2, 0]: untouched by the NaN in group 0.
    g1 = [2.0, 2.0, 0.0]
    m1, s1 = statistics.mean(g1), statistics.stdev(g1)
    torch.testing.assert_close(out.advantages[3:], torch.tensor([(r - m1) / (s1 + 1e-4) for r in g1]))


def test_all_unscorable_group_gives_zero_advantages() -> None:
    rewards = torch.tensor([NAN, NAN, 1.0, 0.0])
    for scale in ("group", "batch", "none"):
        out = compute_advantages(rewards, 2, scale)
        assert out.advantages[:2].tolist() == [0.0, 0.0]
        assert not torch.isnan(out.advantages).any()


def test_invalid_arguments_raise() -> None:
    with pytest.raises(ValueError, match="group, batch, none"):
        compute_advantages(torch.zeros(4), 2, "global")
    with pytest.raises(ValueError, match="divisible"):
        compute_advantages(torch.zeros(5), 2, "group")


@pytest.mark.parametrize("seed", [0, 1])
def test_nanstd_equals_torch_std_without_nan(seed: int) -> None:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(nanstd(x), x.std())
    torch.testing.assert_close(nanstd(x, dim=1), x.std(dim=1))
    torch.testing.assert_close(nanstd(x, dim=0, keepdim=True), x.std(dim=0, keepdim=True))


def test_nanstd_ignores_nan_and_needs_two_values() -> None:
    x = torch.tensor([[1.0, NAN, 3.0, 5.0], [NAN, NAN, 2.0, NAN], [NAN, NAN, NAN, NAN]])
    out = nanstd(x, dim=1)
    assert out[0].item() == pytest.approx(statistics.stdev([1.0, 3.0, 5.0]), abs=1e-6)
    assert math.isnan(out[1].item())  # one value: no unbiased std
    assert math.isnan(out[2].item())
    assert math.isnan(nanstd(torch.tensor([4.0])).item())
    assert nanstd(torch.tensor([1.0, NAN, 3.0])).item() == pytest.approx(math.sqrt(2.0), abs=1e-6)


def test_group_std_shape_and_values() -> None:
    rewards = torch.tensor([0.0, 2.0, 5.0, 5.0, 1.0, NAN])
    out = group_std(rewards, 2)
    assert out.shape == (3,)
    assert out[0].item() == pytest.approx(math.sqrt(2.0), abs=1e-6)
    assert out[1].item() == 0.0
    assert math.isnan(out[2].item())


def test_zero_std_fraction_counts_constant_groups_under_batch_scaling_too():
    from grpo_core.algorithm.advantages import compute_advantages as advantages_of

    rewards = torch.tensor([0.7, 0.7, 0.7, 0.7, 1.0, 0.0, 0.25, 0.5])
    for scale in ("group", "batch", "none"):
        result = advantages_of(rewards, 4, scale)
        assert result.is_std_zero.float().mean().item() == 0.5, scale
        assert torch.all(result.advantages[:4] == 0), scale
