"""One job on 2 gloo ranks equals the 1-process run: same completions, rewards, metrics and
final parameters (issue 10, world-size invariance)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from core_specs import PROMPTS, make_spec, spec_dict
from safetensors.torch import load_file

from grpo_core.components import build_components
from grpo_core.distributed import Ranks
from grpo_core.errors import SpecError
from grpo_core.experience import Experience
from grpo_core.launch import check_data_parallel, run_data_parallel
from grpo_core.local_run import JsonlRecorder, run_local
from grpo_core.spec import JobSpec
from grpo_core.trainer import GRPOTrainer, TrainResult

# Wall-clock figures differ from run to run; everything else must not.
_UNEQUAL = ("timing/", "step_time", "tokens_per_second", "peak_memory_mb")


def _records(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]


def _assert_close(one: dict, two: dict, where: str) -> None:
    assert one.keys() == two.keys(), where
    for key, value in one.items():
        if key.startswith(_UNEQUAL):
            continue
        if isinstance(value, float) and isinstance(two[key], float):
            close = math.isclose(value, two[key], rel_tol=1e-5, abs_tol=1e-5)
            assert close, f"{where} {key}: {value} != {two[key]}"
        else:
            assert value == two[key], f"{where} {key}"


def _assert_same_run(single: TrainResult, double: TrainResult, one: Path, two: Path, model_dir: Path) -> None:
    """Same samples and metrics (timings aside) at every step, same final parameters."""
    assert single.step == double.step
    samples_one, samples_two = _records(one, "samples"), _records(two, "samples")
    assert [s["completion"] for s in samples_one] == [s["completion"] for s in samples_two]
    for i, (a, b) in enumerate(zip(samples_one, samples_two, strict=True)):
        _assert_close(a, b, f"sample {i}")
    metrics_one, metrics_two = _records(one, "metrics"), _records(two, "metrics")
    assert [m["step"] for m in metrics_two] == list(range(1, double.step + 1))
    for a, b in zip(metrics_one, metrics_two, strict=True):
        _assert_close(a, b, f"step {a['step']}")
    assert any(m["loss"] != 0.0 for m in metrics_two)

    weights_one = load_file(single.checkpoint / "model.safetensors")
    weights_two = load_file(double.checkpoint / "model.safetensors")
    initial = load_file(model_dir / "model.safetensors")
    assert weights_one.keys() == weights_two.keys()
    assert any(not torch.equal(weights_one[k], initial[k]) for k in initial if k in weights_one)
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_two_gloo_ranks_train_exactly_like_one_process(tiny_model_dir, tmp_path):
    # Token-mean loss and batch-scaled advantages: both need whole-step statistics across ranks.
    spec = make_spec(
        tiny_model_dir, max_steps=3, prompts_per_step=4, loss_type="bnpo", scale_rewards="batch",
        num_iterations=2, gradient_accumulation_steps=2,
    )
    single = run_local(spec, tmp_path, tmp_path / "one", device="cpu", progress=False)
    # Bounded: a rank left waiting on the other fails the run instead of hanging the test.
    double = run_data_parallel(
        spec, tmp_path, tmp_path / "two", 2, device="cpu", progress=False, hang_timeout=timedelta(seconds=120)
    )
    assert single.step == double.step == 3
    assert double.checkpoint == tmp_path / "two" / "checkpoints" / "step-3"

    _assert_same_run(single, double, tmp_path / "one", tmp_path / "two", tiny_model_dir)
    # The whole step's rows (4 prompts x 4 generations), not rank 0's half.
    assert [s["step"] for s in _records(tmp_path / "two", "samples")].count(1) == 4 * 4
    # Rank 0 alone wrote: one event stream, one started/finished pair.
    events = [e["type"] for e in _records(tmp_path / "two", "events")]
    assert events.count("started") == 1 and events.count("finished") == 1


def _dynamic_sampling_spec(model_dir: Path) -> JobSpec:
    """A reward that some prompts can never earn: the needle "zzz" is never sampled, so their
    groups have no variance, while "e" turns up in some completions but not all."""
    spec = spec_dict(
        model_dir, max_steps=3, prompts_per_step=4, drop_zero_std_groups=True, max_resample_batches=2
    )
    rows = [{"prompt": p, "needle": ["e", "zzz"][i % 2]} for i, p in enumerate(PROMPTS)]
    spec["dataset"] = {"prompts": rows}
    spec["rewards"] = [{"name": "contains", "args": {"field": "needle"}}]
    return JobSpec.model_validate(spec)


@pytest.mark.slow
def test_dynamic_sampling_on_two_gloo_ranks_selects_like_one_process(tiny_model_dir, tmp_path):
    spec = _dynamic_sampling_spec(tiny_model_dir)
    # The 1-process run, watching which groups each step keeps (run_local, plus the selection).
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
    single = trainer.train()
    double = run_data_parallel(
        spec, tmp_path, tmp_path / "two", 2, device="cpu", progress=False, hang_timeout=timedelta(seconds=120)
    )
    _assert_same_run(single, double, one, tmp_path / "two", tiny_model_dir)

    metrics = _records(tmp_path / "two", "metrics")
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
