"""One job on 2 gloo ranks equals the 1-process run: same completions, rewards, metrics and
final parameters (issue 10, world-size invariance), with dynamic sampling too."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
from core_specs import PROMPTS, make_spec, spec_dict
from run_records import assert_same_run, assert_same_samples, records
from safetensors.torch import load_file

from grpo_core.algorithm.experience import Experience
from grpo_core.errors import SpecError
from grpo_core.parallel.distributed import Ranks
from grpo_core.run.components import build_components
from grpo_core.run.launch import check_data_parallel, run_data_parallel
from grpo_core.run.local_run import JsonlRecorder, run_local
from grpo_core.run.trainer import GRPOTrainer
from grpo_core.spec.run_spec import RunSpec

# Runs whose weights are compared across rank counts use adam_epsilon 1e-5: Adam divides a
# gradient by its own running size, so an entry near zero moves by ~lr whatever its sign, and the
# all-reduce's different summation order (~1e-7 of a gradient) could flip it: one of 8,192 weights
# then differed by 1.3e-5 to 1.9e-5 after 3 steps (seen in both comparisons below, with TRL's 1e-8
# and, on another CPU, with 1e-6 too: the rounding differs from one machine's kernels to the next).
# A larger epsilon keeps such entries' steps proportional to the gradient (largest difference then
# 7.4e-7 over every weight of the three runs here), so the weights compare to 1e-5 and a real
# difference between the runs still shows.
COMPARABLE_ADAM = {"adam_epsilon": 1e-5}
HANG = timedelta(seconds=120)  # a rank left waiting fails the test instead of hanging it


@pytest.mark.slow
@pytest.mark.parametrize(
    "reuse",
    # A batch trained twice; a round of 2 steps' prompts, each step spread over both ranks.
    [{"num_iterations": 2}, {"steps_per_generation": 4}],
)
def test_two_gloo_ranks_train_exactly_like_one_process(tiny_model_dir, tmp_path, reuse):
    # Token-mean loss and batch-scaled advantages: both need whole-step statistics across ranks.
    spec = make_spec(
        tiny_model_dir, max_steps=3, prompts_per_step=4, loss_type="bnpo", scale_rewards="batch",
        gradient_accumulation_steps=2, **COMPARABLE_ADAM, **reuse,
    )
    single = run_local(spec, tmp_path, tmp_path / "one", device="cpu", progress=False)
    double = run_data_parallel(
        spec, tmp_path, tmp_path / "two", 2, device="cpu", progress=False, hang_timeout=HANG
    )
    assert single.step == double.step == 3
    assert double.checkpoint == tmp_path / "two" / "checkpoints" / "step-3"

    assert_same_samples(tmp_path / "one", tmp_path / "two")
    # The whole step's rows (4 prompts x 4 generations), not rank 0's half.
    assert [s["step"] for s in records(tmp_path / "two", "samples")].count(1) == 4 * 4
    assert_same_run(tmp_path / "one", tmp_path / "two")
    assert any(m["loss"] != 0.0 for m in records(tmp_path / "two", "metrics"))
    initial = load_file(tiny_model_dir / "model.safetensors")
    final = load_file(double.checkpoint / "model.safetensors")
    assert any(not torch.equal(final[k], initial[k]) for k in initial if k in final)
    # Rank 0 alone wrote: one event stream, one started/finished pair.
    events = [e["type"] for e in records(tmp_path / "two", "events")]
    assert events.count("started") == 1 and events.count("finished") == 1


def _dynamic_sampling_spec(model_dir: Path) -> RunSpec:
    """A reward that some prompts can never earn: the needle "zzz" is never sampled, so their
    groups have no variance, while "e" turns up in some completions but not all."""
    spec = spec_dict(
        model_dir, max_steps=3, prompts_per_step=4, drop_zero_std_groups=True, max_resample_batches=2,
        **COMPARABLE_ADAM,
    )
    rows = [{"prompt": p, "needle": ["e", "zzz"][i % 2]} for i, p in enumerate(PROMPTS)]
    spec["dataset"] = {"prompts": rows}
    spec["rewards"] = [{"name": "contains", "args": {"field": "needle"}}]
    return RunSpec.model_validate(spec)


@pytest.mark.slow
def test_dynamic_sampling_on_two_gloo_ranks_selects_like_one_process(tiny_model_dir, tmp_path):
    spec = _dynamic_sampling_spec(tiny_model_dir)
    # The 1-process run (what run_local does), watching which groups each step keeps.
    one = tmp_path / "one"
    one.mkdir()
    trainer = GRPOTrainer(build_components(spec, device="cpu"), one / "checkpoints", JsonlRecorder(one))
    selections: list[list[int]] = []
    sample = trainer.make_experience

    def recording_selection() -> Experience:
        exp = sample()
        selections.append(exp.selected_groups)
        return exp

    trainer.make_experience = recording_selection
    assert trainer.train().step == 3
    run_data_parallel(spec, tmp_path, tmp_path / "two", 2, device="cpu", progress=False, hang_timeout=HANG)
    assert_same_samples(one, tmp_path / "two")
    assert_same_run(one, tmp_path / "two")

    metrics = records(tmp_path / "two", "metrics")
    assert any(m["loss"] != 0.0 for m in metrics)
    # Resampling happened and zero-variance groups were skipped: the selection is not the first round.
    assert sum(m["dynamic_sampling/extra_batches"] for m in metrics) > 0
    assert any(selection != [0, 1, 2, 3] for selection in selections)
    # Rank r trains the r-th half of the selection; group i of the step's rounds was sampled by
    # rank (i mod 4) // 2. Some groups were trained by the rank that did not sample them, so
    # their rows really moved between ranks.
    assert any((i % 4) // 2 != p // 2 for s in selections for p, i in enumerate(s))


def test_a_rank_keeps_its_contiguous_share_of_whole_groups():
    assert [Ranks(r, 2).share(4) for r in range(2)] == [slice(0, 2), slice(2, 4)]
    assert Ranks().share(6) == slice(0, 6)


def test_what_ranks_cannot_train_exactly_is_refused_before_launch(tiny_model_dir):
    with pytest.raises(SpecError) as uneven:
        check_data_parallel(make_spec(tiny_model_dir, prompts_per_step=3), 2)
    assert uneven.value.field == "grpo.prompts_per_step"
    # Dynamic sampling is not refused: the ranks select the groups one process would.
    check_data_parallel(make_spec(tiny_model_dir, prompts_per_step=2, drop_zero_std_groups=True), 2)
