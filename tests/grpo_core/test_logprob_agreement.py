"""One log-prob computation: the old (generating) policy's, the reference's and the update's
log-probs of an unmoved policy are the same bits, so its ratio is exactly 1 and its KL exactly 0
(TRL gets ratio 1 by construction, ``old = logprobs.detach()``); an update that sees ratio 1
has nothing clipped and its surrogate is the advantage-weighted mean of the reference formula."""

from __future__ import annotations

import pytest
import torch
from core_specs import make_spec

import grpo_core.algorithm.update as update_module
from grpo_core.run.components import build_components
from grpo_core.run.trainer import GRPOTrainer


@pytest.mark.parametrize("batching", [{"steps_per_generation": 2}, {"num_iterations": 2}])
def test_unmoved_policy_has_ratio_exactly_one(tiny_model_dir, tmp_path, monkeypatch, batching):
    # temperature 1 on the CPU: where log-probs alone and log-probs with the entropy took different
    # code paths that differed by an ulp. beta != 0: the reference's log-probs are computed too.
    spec = make_spec(tiny_model_dir, max_steps=1, temperature=1.0, beta=0.04, loss_type="grpo", **batching)
    trainer = GRPOTrainer(build_components(spec, device="cpu"), tmp_path)
    seen = []
    real_loss = update_module.micro_batch_loss

    def recording_loss(logprobs, old_logprobs, advantages, mask, totals, config, sums, ref, entropy):
        seen.append((logprobs.detach().clone(), old_logprobs, ref, advantages, mask))
        return real_loss(logprobs, old_logprobs, advantages, mask, totals, config, sums, ref, entropy)

    monkeypatch.setattr(update_module, "micro_batch_loss", recording_loss)
    generation_round = trainer.make_experience()
    assert generation_round.old_logprobs is not None and generation_round.ref_logprobs is not None
    exp = generation_round.step_part(0, spec.grpo.round_steps)
    metrics = trainer.optimizer_step(exp)

    (logprobs, old, ref, advantages, mask), = seen
    assert mask.sum() > 0
    assert torch.equal(logprobs, old)
    assert torch.equal(logprobs, ref)
    for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "kl"):
        assert metrics[name] == 0.0, name
    # ρ = 1 and kl = 0 on every token: ℓ = −A, so the grpo loss is −mean over rows of A (rows
    # with no loss token add 0), and the total loss is that surrogate.
    has_tokens = (mask.sum(-1) > 0).double()
    expected = -float((advantages.double() * has_tokens).sum()) / mask.size(0)
    assert metrics["policy_loss"] == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert metrics["loss"] == metrics["policy_loss"]
