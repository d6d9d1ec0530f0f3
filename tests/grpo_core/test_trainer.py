"""The training loop through real components: tiny model, real rewards, real checkpoints."""

from __future__ import annotations

import json
import math

import pytest
import torch
from core_specs import make_spec

from grpo_core.algorithm.experience import Experience
from grpo_core.algorithm.metrics import experience_metrics, tokens_in
from grpo_core.algorithm.update import accumulate_gradients
from grpo_core.errors import NonFiniteLossError
from grpo_core.run.callbacks import TrainerCallback
from grpo_core.run.components import RunComponents, build_components
from grpo_core.run.trainer import GRPOTrainer

TIMING_KEYS = ("step_time", "tokens_per_second", "peak_memory_mb")


class Recorder(TrainerCallback):
    def __init__(self, stop_after: int | None = None) -> None:
        self.records: list[dict] = []
        self.events: list[str] = []
        self.samples: dict[int, list[dict]] = {}
        self.stop_after = stop_after

    def on_step(self, record):
        self.records.append(record)

    def on_event(self, type, message, data):  # noqa: A002
        self.events.append(type)

    def on_samples(self, step, rows):
        self.samples[step] = rows

    def should_stop(self):
        return self.stop_after is not None and len(self.records) >= self.stop_after


def comparable(record: dict) -> dict:
    """Drop wall-clock figures, which differ between any two runs."""
    return {k: v for k, v in record.items() if not k.startswith("timing/") and k not in TIMING_KEYS}


def gradients(c: RunComponents, exp: Experience, **config) -> list[torch.Tensor]:
    """The policy's accumulated gradient for ``exp`` under the spec's config changed by ``config``."""
    c.optimizer.zero_grad(set_to_none=True)
    changed = c.spec.grpo.model_copy(update=config)
    accumulate_gradients(policy=c.models.policy, experience=exp, config=changed, placement=c.placement)
    return [p.grad.detach().clone() for p in c.models.policy.parameters() if p.requires_grad]


def run(spec, checkpoint_dir, stop_after=None, resume=False):
    components = build_components(spec, device="cpu")
    recorder = Recorder(stop_after)
    trainer = GRPOTrainer(components, checkpoint_dir, recorder)
    if resume:
        assert trainer.resume()
    result = trainer.train()
    return result, recorder, components


def test_records_carry_the_design_metric_names(tiny_model_dir, tmp_path):
    result, rec, _ = run(make_spec(tiny_model_dir, max_steps=2), tmp_path)
    assert result.step == 2 and not result.stopped
    assert [r["step"] for r in rec.records] == [1, 2]
    expected = {
        "step",
        "reward",
        "reward_std",
        "rewards/contains/mean",
        "rewards/contains/std",
        "rewards/length_target/mean",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "loss",
        "policy_loss",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "completions/mean_length",
        "completions/min_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "grad_norm",
        "learning_rate",
        "num_tokens",
        "tokens_per_second",
        "step_time",
        "advantages/mean",
        "advantages/std",
        "advantages/min",
        "advantages/max",
        "timing/generation",
        "timing/reward",
        "timing/ref",
        "timing/update",
        "peak_memory_mb",
    }
    assert expected <= set(rec.records[0])
    json.dumps(rec.records)  # every value is JSON-serialisable (no NaN objects, no tensors)
    # On-policy: the ratio is exactly 1, so nothing is clipped.
    assert rec.records[0]["clip_ratio/region_mean"] == 0.0
    assert rec.records[1]["num_tokens"] > rec.records[0]["num_tokens"] > 0
    assert rec.events[0] == "started" and rec.events[-1] == "finished"
    assert set(rec.samples) == {1, 2} and rec.samples[2][0]["step"] == 2
    assert (tmp_path / "step-2" / "trainer_state.json").is_file()


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_every_trainable_parameter_changes_after_one_step(tiny_model_dir, tmp_path, beta):
    c = build_components(
        make_spec(tiny_model_dir, beta=beta, num_generations=8, prompts_per_step=4, max_completion_length=16),
        device="cpu",
    )
    assert (c.models.reference is None) == (beta == 0.0)
    before = {n: p.detach().clone() for n, p in c.models.policy.named_parameters() if p.requires_grad}
    trainer = GRPOTrainer(c, tmp_path)
    exp = trainer.make_experience()
    assert exp.advantages.abs().sum() > 0, "the toy batch must carry some signal"
    trainer.optimizer_step(exp)
    unchanged = [n for n, p in c.models.policy.named_parameters() if torch.equal(before[n], p.detach())]
    assert unchanged == []


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_gradient_accumulation_does_not_change_the_gradient(tiny_model_dir, tmp_path, loss_type):
    spec = make_spec(
        tiny_model_dir,
        loss_type=loss_type,
        num_generations=4,
        prompts_per_step=4,
        max_completion_length=12,
        num_iterations=2,
    )
    c = build_components(spec, device="cpu")
    exp = GRPOTrainer(c, tmp_path).make_experience()
    # Off-policy old log-probs so clipping and the ratio are exercised, not just ρ = 1.
    exp.old_logprobs = exp.old_logprobs + 0.3 * torch.randn_like(exp.old_logprobs)
    whole = gradients(c, exp, gradient_accumulation_steps=1)
    split = gradients(c, exp, gradient_accumulation_steps=4)
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_non_finite_loss_is_an_error_and_the_step_is_not_applied(tiny_model_dir, tmp_path):
    c = build_components(make_spec(tiny_model_dir), device="cpu")
    trainer = GRPOTrainer(c, tmp_path)
    exp = trainer.make_experience()
    exp.advantages[0] = float("nan")
    before = [p.detach().clone() for p in c.models.policy.parameters()]
    with pytest.raises(NonFiniteLossError) as info:
        trainer.optimizer_step(exp)
    assert info.value.code == "non_finite_loss"
    assert all(torch.equal(a, p) for a, p in zip(before, c.models.policy.parameters(), strict=True))


@pytest.mark.parametrize(
    "config",
    [
        {"num_iterations": 1},
        {"num_iterations": 2},
        {"drop_zero_std_groups": True, "max_resample_batches": 2},
        # A round of 2 steps (4 with num_iterations=2): step 3 is inside one, so the round and
        # its old log-probs come back from the checkpoint instead of being generated again.
        {"steps_per_generation": 2},
        {"steps_per_generation": 2, "num_iterations": 2},
    ],
)
def test_resume_reproduces_the_uninterrupted_run(tiny_model_dir, tmp_path, config):
    spec = make_spec(tiny_model_dir, max_steps=5, **config)
    if config.get("drop_zero_std_groups"):
        # The tiny model almost never says "yes": most groups have no signal, so every step
        # draws extra rounds, and those must resume exactly too.
        spec = spec.model_copy(update={"rewards": spec.rewards[:1]})
    _, full, _ = run(spec, tmp_path / "full")
    if config.get("drop_zero_std_groups"):
        assert sum(r["dynamic_sampling/extra_batches"] for r in full.records) > 0
    # Stop after step 3: with num_iterations=2 that is mid-cycle, so the pending batch is saved too.
    first, part, _ = run(spec, tmp_path / "split", stop_after=3)
    assert first.stopped and first.step == 3 and part.events[-1] == "stopped"
    _, rest, _ = run(spec, tmp_path / "split", resume=True)
    assert rest.events[0] == "resumed"
    resumed = [comparable(r) for r in part.records + rest.records]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert resumed == [comparable(r) for r in full.records]


def test_num_iterations_reuses_one_generation_batch(tiny_model_dir, tmp_path):
    _, rec, _ = run(make_spec(tiny_model_dir, max_steps=4, num_iterations=2), tmp_path)
    first, second = rec.records[0], rec.records[1]
    assert first["reward"] == second["reward"] and second["timing/generation"] == 0.0
    assert second["num_tokens"] == first["num_tokens"] < rec.records[2]["num_tokens"]
    # The second pass is off-policy: the first update moved the policy, so the same batch scores
    # differently and the ratio has left 1.
    assert first["policy_loss"] != second["policy_loss"]
    assert first["clip_ratio/region_mean"] == 0.0 and second["clip_ratio/region_mean"] > 0.0


def test_dynamic_sampling_prefers_groups_with_signal(tiny_model_dir, tmp_path):
    spec = make_spec(tiny_model_dir, max_steps=2, drop_zero_std_groups=True, max_resample_batches=3)
    _, rec, _ = run(spec, tmp_path)
    for record in rec.records:
        assert 0 <= record["dynamic_sampling/extra_batches"] <= 3
        kept = record["dynamic_sampling/informative_groups"]
        # Zero-variance groups only fill the batch when too few informative ones were found.
        assert record["frac_reward_zero_std"] <= 1 - min(kept, 2) / 2 + 1e-6


def test_a_generation_batch_does_not_depend_on_the_global_rng(tiny_model_dir, tmp_path):
    """Sampling is keyed by (seed, prompt draw, generation): the torch RNG's state, which differs
    between ranks and after any other draw, must not change a single token."""
    trainer = GRPOTrainer(build_components(make_spec(tiny_model_dir), device="cpu"), tmp_path)
    sampler = trainer.components.sampler
    start = sampler.state_dict()
    batches = []
    for rng_seed in (1, 999):
        sampler.load_state_dict(start)
        torch.manual_seed(rng_seed)
        batches.append(trainer.make_experience().rollout.completion_ids)
    assert torch.equal(batches[0], batches[1])
    assert len({tuple(row) for row in batches[0].tolist()}) > 1


@pytest.mark.slow
def test_mean_reward_rises_on_a_toy_reward(tiny_model_dir, tmp_path):
    spec = make_spec(
        tiny_model_dir,
        max_steps=40,
        num_generations=8,
        prompts_per_step=4,
        max_completion_length=16,
        learning_rate=3e-3,
    )
    _, rec, _ = run(spec, tmp_path)
    rewards = [r["reward"] for r in rec.records]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.3, f"reward did not rise: first {first:.3f}, last {last:.3f}"


def test_kl_is_zero_while_the_policy_is_the_reference_and_grows_after_updates(tiny_model_dir, tmp_path):
    """k3 is exactly 0 where log-probs agree; a KL that is not 0 on step 1 means the policy and the
    reference score the same tokens differently (dropout, positions, autocast...)."""
    _, rec, _ = run(make_spec(tiny_model_dir, beta=0.04, max_steps=3), tmp_path)
    kls = [r["kl"] for r in rec.records]
    assert kls[0] == 0.0
    assert kls[1] > 1e-6 and kls[2] > 1e-6


def test_gradient_checkpointing_is_on_and_gives_the_same_gradients(tiny_model_dir, tmp_path):
    def grads(checkpointing: bool) -> tuple[list[torch.Tensor], int]:
        spec = make_spec(tiny_model_dir, gradient_checkpointing=checkpointing, gradient_accumulation_steps=2)
        c = build_components(spec, device="cpu")
        assert c.models.policy.is_gradient_checkpointing == checkpointing
        torch.manual_seed(1)
        exp = GRPOTrainer(c, tmp_path).make_experience()
        forwards = []
        # A module inside the layer (transformers keeps the layer's own hooks out of the replay), and
        # a pre-hook: the replay stops early, once it has what the backward needs. (The output
        # projection: the shared-prompt pass calls it for the prompts and for the completions.)
        projection = c.models.policy.model.layers[0].self_attn.o_proj
        projection.register_forward_pre_hook(lambda *_: forwards.append(1))
        return gradients(c, exp), len(forwards)

    plain, plain_forwards = grads(False)
    checkpointed, checkpointed_forwards = grads(True)
    # Its forwards per micro-batch; with checkpointing the backward runs each layer's forward again.
    assert plain_forwards >= 2 and checkpointed_forwards == 2 * plain_forwards
    for a, b in zip(plain, checkpointed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_masking_truncated_completions_keeps_their_lengths_and_tokens(tiny_model_dir, tmp_path):
    """Only the loss ignores truncated rows: lengths and token counts still measure them."""
    spec = make_spec(
        tiny_model_dir, mask_truncated_completions=True, num_generations=8, max_completion_length=6
    )
    c = build_components(spec, device="cpu")
    exp = GRPOTrainer(c, tmp_path).make_experience()
    truncated = exp.rollout.is_truncated
    assert truncated.any(), "a random-init model runs 6 tokens without EOS in some rows"
    eos = set(c.eos_ids.tolist())
    lengths = [
        next((i + 1 for i, token in enumerate(row) if token in eos), 6)
        for row in exp.rollout.completion_ids.tolist()
    ]
    metrics = experience_metrics(exp, [r.name for r in c.rewards])
    assert metrics["completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths))
    assert metrics["completions/max_length"] == 6 and metrics["completions/min_length"] == min(lengths)
    assert tokens_in(exp) == int(exp.rollout.prompt_mask.sum()) + sum(lengths)
    assert exp.loss_mask[truncated].sum() == 0
    assert torch.equal(exp.loss_mask[~truncated], exp.rollout.completion_mask[~truncated])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: bf16 autocast runs only there")
def test_cuda_step_uses_bf16_autocast_and_stays_finite(tiny_model_dir, tmp_path):
    components = build_components(make_spec(tiny_model_dir, max_steps=2), device="cuda")
    recorder = Recorder()
    GRPOTrainer(components, tmp_path, recorder).train()
    assert all(math.isfinite(r["loss"]) for r in recorder.records)
    assert recorder.records[-1]["peak_memory_mb"] > 0


def test_a_pending_experience_saved_before_its_newer_fields_loads_with_defaults(tiny_model_dir, tmp_path):
    # A checkpoint written by an earlier version holds an Experience pickled without the fields
    # added since (the rows' columns, their reward errors): it still loads, and its sample rows
    # still build, so such a checkpoint resumes.
    import io

    from grpo_core.algorithm.metrics import sample_rows

    c = build_components(make_spec(tiny_model_dir), device="cpu")
    exp = GRPOTrainer(c, tmp_path).make_experience()
    del exp.__dict__["errors"], exp.__dict__["columns"]
    buffer = io.BytesIO()
    torch.save(exp, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.errors == [] and loaded.columns == []
    rows = sample_rows(loaded, ["r"] * loaded.rewards_per_func.shape[1], 1)
    assert rows and all("error" not in row and row["columns"] == {} for row in rows)
    assert loaded.step_part(0, 1) is loaded
