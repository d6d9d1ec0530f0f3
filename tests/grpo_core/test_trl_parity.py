"""Our core against TRL 1.16 (a test-only reference) on identical tensors.

Loss, KL, entropy and clip metrics go through a real ``trl.GRPOTrainer._compute_loss`` on one side
and our update's own :func:`micro_batch_loss` and :meth:`StepSums.metrics` on the other: TRL's model
forward (``_get_per_token_logps_and_entropies``) is replaced on the instance by fixed tensors, so
both sides see the same log-probs and only the loss arithmetic is compared.

Advantages are not compared here: TRL computes them inline in ``_generate_and_score_completions``
(no function to call in isolation); ``test_advantages.py`` checks the same formula against a naive
loop, and TRL's ``nanstd`` (which that code uses) is compared below.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

from grpo_core.algorithm.advantages import nanstd
from grpo_core.algorithm.logprobs import selective_log_softmax, selective_log_softmax_and_entropy
from grpo_core.algorithm.losses import StepTotals
from grpo_core.algorithm.update import StepSums, micro_batch_loss
from grpo_core.spec.grpo_config import GRPOConfig as OurConfig

if TYPE_CHECKING:
    from trl import GRPOTrainer

N, G, T, P = 6, 3, 5, 4  # rows, generations per prompt, completion length, prompt length
ATOL = 1e-5


@pytest.fixture(scope="module")
def trl_utils() -> ModuleType:
    """TRL's helpers, imported when a test first needs them: importing trl (which loads peft) and
    datasets takes seconds that collecting the suite should not pay."""
    from trl.trainer import utils

    return utils


# --- log-probs --------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [7, 1000, 32000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_log_softmax_matches_trl(trl_utils: ModuleType, vocab: int, temperature: float) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, 4, vocab, generator=gen) * 4
    index = torch.randint(0, vocab, (3, 4), generator=gen)
    ours = selective_log_softmax(logits, index, temperature)
    theirs = trl_utils.selective_log_softmax(logits, index, temperature)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_entropy_matches_trl(trl_utils: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 500, generator=gen) * 4
    index = torch.randint(0, 500, (3, 4), generator=gen)
    _, entropy = selective_log_softmax_and_entropy(logits, index, temperature=0.7)
    torch.testing.assert_close(entropy, trl_utils.entropy_from_logits(logits / 0.7), atol=ATOL, rtol=0)


def test_nanstd_matches_trl(trl_utils: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=gen)
    x[0, 1] = x[2, :3] = x[4, :] = float("nan")  # rows with 3, 1 and 0 values left
    for dim in (None, 0, 1):
        torch.testing.assert_close(nanstd(x, dim=dim), trl_utils.nanstd(x, dim=dim), equal_nan=True)
    torch.testing.assert_close(
        nanstd(x, dim=1, keepdim=True), trl_utils.nanstd(x, dim=1, keepdim=True), equal_nan=True
    )


# --- loss and metrics through GRPOTrainer._compute_loss --------------------------------------


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GRPOTrainer:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl-parity")),
        use_cpu=True,
        report_to=[],
        per_device_train_batch_size=N,
        num_generations=G,
        max_completion_length=T,
        logging_steps=1,
        bf16=False,
    )
    trl_trainer = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["one two", "what is 2+3?", "hello world", "yes or no"]}),
    )
    trl_trainer.model.train()  # _compute_loss logs into the "train" bucket only in train mode
    # Settings this comparison assumes: each would add a term our core does not have.
    assert trl_trainer.importance_sampling_level == "token"
    assert trl_trainer.args.use_bias_correction_kl
    assert trl_trainer.top_entropy_quantile == 1.0 and trl_trainer.off_policy_mask_threshold is None
    assert (
        not trl_trainer.use_vllm
        and not trl_trainer._entropy_bonus_enabled
        and not trl_trainer.aux_loss_enabled
    )
    assert trl_trainer.accelerator.num_processes == 1
    return trl_trainer


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Off-policy tensors: |logprobs − old_logprobs| up to ~2, so ratios leave [0.8, 1.28] both ways."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    logprobs = -torch.rand(N, T, generator=gen) * 4 - 0.05
    return {
        "prompt_ids": torch.randint(5, 100, (N, P), generator=gen),
        "prompt_mask": torch.ones(N, P, dtype=torch.long),
        "completion_ids": torch.randint(5, 100, (N, T), generator=gen),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.3, -0.7, 0.4, -1.6, 0.9, -0.2]),
        "logprobs": logprobs,
        "entropies": torch.rand(N, T, generator=gen) * 3,
        "old_per_token_logps": logprobs + torch.randn(N, T, generator=gen) * 0.7,
        "ref_per_token_logps": logprobs + torch.randn(N, T, generator=gen) * 0.3,
    }


def _configure(
    trainer: GRPOTrainer,
    monkeypatch: pytest.MonkeyPatch,
    *,
    loss_type: str,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None,
    accumulation_steps: int = 1,
    importance_sampling_level: str = "token",
) -> None:
    """Set exactly the attributes ``_compute_loss`` reads; monkeypatch restores them after the test."""
    monkeypatch.setattr(trainer, "importance_sampling_level", importance_sampling_level)
    monkeypatch.setattr(trainer, "loss_type", loss_type)
    monkeypatch.setattr(trainer, "beta", beta)
    monkeypatch.setattr(trainer, "epsilon_low", epsilon_low)
    monkeypatch.setattr(trainer, "epsilon_high", epsilon_high)
    monkeypatch.setattr(trainer, "max_completion_length", T)
    monkeypatch.setattr(trainer, "current_gradient_accumulation_steps", accumulation_steps, raising=False)
    monkeypatch.setattr(trainer.args, "delta", delta)
    # One generation batch per optimizer step: dapo's normaliser then spans exactly that batch.
    monkeypatch.setattr(trainer.args, "steps_per_generation", accumulation_steps)


def _trl_loss(
    trainer: GRPOTrainer,
    monkeypatch: pytest.MonkeyPatch,
    batch: dict[str, torch.Tensor],
    rows: slice,
    logprobs: torch.Tensor,
    num_items_in_batch: torch.Tensor,
):
    """TRL's loss for ``batch[rows]`` with ``logprobs`` standing in for the model forward; and its metrics."""
    entropies = batch["entropies"][rows]

    def fixed_forward(*args, **kwargs):
        return logprobs, entropies, None

    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", fixed_forward)
    inputs = {
        k: batch[k][rows]
        for k in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "advantages",
            "old_per_token_logps",
            "ref_per_token_logps",
        )
    }
    inputs["num_items_in_batch"] = num_items_in_batch
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(trainer.model, inputs)
    return loss, {k: list(v) for k, v in trainer._metrics["train"].items()}


def _our_loss(
    batch: dict[str, torch.Tensor],
    rows: slice,
    logprobs: torch.Tensor,
    totals: StepTotals,
    *,
    loss_type: str,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None,
    importance_sampling_level: str = "token",
):
    """Our update's loss for ``batch[rows]`` and the metrics it reports for them."""
    config = OurConfig(
        importance_sampling_level=importance_sampling_level,
        loss_type=loss_type,
        beta=beta,
        epsilon=epsilon_low,
        epsilon_high=epsilon_high,
        delta=delta,
        max_completion_length=T,
    )
    mask = batch["completion_mask"][rows]
    sums = StepSums()
    loss = micro_batch_loss(
        logprobs,
        batch["old_per_token_logps"][rows],
        batch["advantages"][rows],
        mask,
        totals,
        config,
        sums,
        ref_logprobs=batch["ref_per_token_logps"][rows],
        entropy=batch["entropies"][rows],
    )
    return loss, sums.metrics(float(mask.sum()), with_kl=beta != 0.0)


CASES = [
    pytest.param(loss_type, beta, eps_high, delta, id=f"{loss_type}-beta{beta}-epsh{eps_high}-delta{delta}")
    for loss_type, beta, eps_high, delta in itertools.product(
        ["grpo", "bnpo", "dr_grpo", "dapo"], [0.0, 0.04], [0.2, 0.28], [None, 1.5]
    )
]


@pytest.mark.parametrize("importance_sampling_level", ["token", "sequence"])
@pytest.mark.parametrize(("loss_type", "beta", "epsilon_high", "delta"), CASES)
def test_loss_and_metrics_match_trl(
    trainer: GRPOTrainer,
    monkeypatch: pytest.MonkeyPatch,
    loss_type: str,
    beta: float,
    epsilon_high: float,
    delta: float | None,
    importance_sampling_level: str,
) -> None:
    """Token level, and GSPO's sequence level (every loss type TRL allows with it; its clip
    fractions count completions, not tokens)."""
    settings = dict(
        loss_type=loss_type, beta=beta, epsilon_low=0.2, epsilon_high=epsilon_high, delta=delta,
        importance_sampling_level=importance_sampling_level,
    )
    _configure(trainer, monkeypatch, **settings)
    batch = _batch()
    if importance_sampling_level == "sequence":
        # Averaging over a completion's tokens shrinks the log-ratios; push row 0 (A > 0) further
        # off-policy so its sequence weight leaves the trust region upwards too.
        batch["old_per_token_logps"][0] -= 0.5
    mask = batch["completion_mask"]
    rows = slice(0, N)

    trl_logprobs = batch["logprobs"].clone().requires_grad_(True)
    trl_loss, trl_metrics = _trl_loss(trainer, monkeypatch, batch, rows, trl_logprobs, mask.sum())
    our_logprobs = batch["logprobs"].clone().requires_grad_(True)
    totals = StepTotals(rows=N, tokens=float(mask.sum()), max_completion_length=T)
    our_loss, our_metrics = _our_loss(batch, rows, our_logprobs, totals, **settings)

    assert trl_loss.item() == pytest.approx(our_loss.item(), abs=ATOL), (trl_loss.item(), our_loss.item())
    trl_loss.backward()
    our_loss.backward()
    torch.testing.assert_close(our_logprobs.grad, trl_logprobs.grad, atol=ATOL, rtol=0)

    # The inputs really exercise clipping on both sides, so the metric comparison means something.
    assert our_metrics["clip_ratio/low_mean"] > 0 and our_metrics["clip_ratio/high_mean"] > 0
    assert ("kl" in trl_metrics) == ("kl" in our_metrics) == (beta != 0.0)
    shared = {"entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"}
    assert shared & set(our_metrics) == shared & set(trl_metrics) >= shared - {"kl"}
    for name in shared & set(our_metrics):
        ours = our_metrics[name]
        assert trl_metrics[name] == [pytest.approx(ours, abs=ATOL)], (name, trl_metrics[name], ours)


def test_delta_changes_the_loss() -> None:
    """Guards the cases above: delta = 1.5 must bind for some A < 0 token, or those cases test nothing new."""
    batch = _batch()
    ratio = torch.exp(batch["logprobs"] - batch["old_per_token_logps"])
    negative = (batch["advantages"] < 0).unsqueeze(1) & batch["completion_mask"].bool()
    assert (ratio[negative] > 1.5).any()
    totals = StepTotals(rows=N, tokens=float(batch["completion_mask"].sum()), max_completion_length=T)
    settings = dict(loss_type="grpo", beta=0.0, epsilon_low=0.2, epsilon_high=0.2)
    with_delta, _ = _our_loss(batch, slice(0, N), batch["logprobs"], totals, delta=1.5, **settings)
    without, _ = _our_loss(batch, slice(0, N), batch["logprobs"], totals, delta=None, **settings)
    assert abs(with_delta.item() - without.item()) > 1e-3


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_gradient_accumulation_matches_trl(
    trainer: GRPOTrainer, monkeypatch: pytest.MonkeyPatch, loss_type: str, beta: float
) -> None:
    """Two micro-batches of 3 rows with equal token counts (the case where TRL's per-micro-batch
    ``bnpo`` mean also equals the step's token mean): summed losses and gradients agree."""
    settings = dict(loss_type=loss_type, beta=beta, epsilon_low=0.2, epsilon_high=0.28, delta=1.5)
    _configure(trainer, monkeypatch, accumulation_steps=2, **settings)
    batch = _batch(seed=1)
    batch["completion_mask"] = (
        torch.arange(T).unsqueeze(0) < torch.tensor([[5], [3], [1], [4], [2], [3]])
    ).long()
    mask = batch["completion_mask"]
    assert mask[:3].sum() == mask[3:].sum()
    totals = StepTotals(rows=N, tokens=float(mask.sum()), max_completion_length=T)

    trl_leaf = batch["logprobs"].clone().requires_grad_(True)
    our_leaf = batch["logprobs"].clone().requires_grad_(True)
    trl_total = our_total = 0.0
    for rows in (slice(0, 3), slice(3, 6)):
        trl_loss, _ = _trl_loss(trainer, monkeypatch, batch, rows, trl_leaf[rows], mask.sum())
        trl_loss.backward()
        our_loss, _ = _our_loss(batch, rows, our_leaf[rows], totals, **settings)
        our_loss.backward()
        trl_total += trl_loss.item()
        our_total += our_loss.item()
    assert trl_total == pytest.approx(our_total, abs=ATOL), (trl_total, our_total)
    torch.testing.assert_close(our_leaf.grad, trl_leaf.grad, atol=ATOL, rtol=0)


@pytest.mark.parametrize("importance_sampling_level", ["token", "sequence"])
def test_dapo_step_of_a_two_step_round_matches_trl(
    trainer: GRPOTrainer, monkeypatch: pytest.MonkeyPatch, importance_sampling_level: str
) -> None:
    """A generation round of 6 rows feeding 2 optimizer steps (TRL: steps_per_generation =
    2·gradient_accumulation_steps): TRL divides each step's dapo loss by the round's tokens
    rescaled to one step, not by the step's own tokens; ours must do the same."""
    settings = dict(
        loss_type="dapo", beta=0.04, epsilon_low=0.2, epsilon_high=0.28, delta=None,
        importance_sampling_level=importance_sampling_level,
    )
    _configure(trainer, monkeypatch, **settings)
    monkeypatch.setattr(trainer.args, "steps_per_generation", 2)
    batch = _batch(seed=2)
    mask = batch["completion_mask"]
    rows = slice(0, 3)  # the round's first step
    round_tokens = float(mask.sum())
    assert round_tokens / 2 != float(mask[rows].sum())  # otherwise both normalisers agree anyway

    trl_leaf = batch["logprobs"].clone().requires_grad_(True)
    trl_loss, _ = _trl_loss(trainer, monkeypatch, batch, rows, trl_leaf[rows], mask.sum())
    our_leaf = batch["logprobs"].clone().requires_grad_(True)
    step_tokens = float(mask[rows].sum())
    totals = StepTotals(3, step_tokens, max_completion_length=T, round_tokens_per_step=round_tokens / 2)
    our_loss, _ = _our_loss(batch, rows, our_leaf[rows], totals, **settings)
    assert trl_loss.item() == pytest.approx(our_loss.item(), abs=ATOL), (trl_loss.item(), our_loss.item())
    trl_loss.backward()
    our_loss.backward()
    torch.testing.assert_close(our_leaf.grad, trl_leaf.grad, atol=ATOL, rtol=0)
