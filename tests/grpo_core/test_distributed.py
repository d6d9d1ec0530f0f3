"""One job on 2 gloo ranks equals the 1-process run: same completions, rewards, metrics and
final parameters (issue 10, world-size invariance)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from core_specs import make_spec
from safetensors.torch import load_file
from same_records import assert_same_record

from grpo_core.distributed import Ranks
from grpo_core.errors import SpecError
from grpo_core.launch import check_data_parallel, run_data_parallel
from grpo_core.local_run import run_local


def _records(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]


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

    samples_one, samples_two = _records(tmp_path / "one", "samples"), _records(tmp_path / "two", "samples")
    assert [s["completion"] for s in samples_one] == [s["completion"] for s in samples_two]
    # The whole step's rows (4 prompts x 4 generations), not rank 0's half.
    assert [s["step"] for s in samples_two].count(1) == 4 * 4
    for i, (a, b) in enumerate(zip(samples_one, samples_two, strict=True)):
        assert_same_record(a, b, f"sample {i}")
    metrics_one, metrics_two = _records(tmp_path / "one", "metrics"), _records(tmp_path / "two", "metrics")
    assert [m["step"] for m in metrics_two] == [1, 2, 3]
    for a, b in zip(metrics_one, metrics_two, strict=True):
        assert_same_record(a, b, f"step {a['step']}")
    assert any(m["loss"] != 0.0 for m in metrics_two)

    weights_one = load_file(single.checkpoint / "model.safetensors")
    weights_two = load_file(double.checkpoint / "model.safetensors")
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert weights_one.keys() == weights_two.keys()
    assert any(not torch.equal(weights_one[k], initial[k]) for k in initial if k in weights_one)
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=0, atol=1e-5, msg=name)
    # Rank 0 alone wrote: one event stream, one started/finished pair.
    events = [e["type"] for e in _records(tmp_path / "two", "events")]
    assert events.count("started") == 1 and events.count("finished") == 1


def test_a_rank_keeps_its_contiguous_share_of_whole_groups():
    assert [Ranks(r, 2).share(4) for r in range(2)] == [slice(0, 2), slice(2, 4)]
    assert Ranks().share(6) == slice(0, 6)


def test_what_ranks_cannot_train_exactly_is_refused_before_launch(tiny_model_dir):
    with pytest.raises(SpecError) as uneven:
        check_data_parallel(make_spec(tiny_model_dir, prompts_per_step=3), 2)
    assert uneven.value.field == "grpo.prompts_per_step"
    with pytest.raises(SpecError) as dynamic:
        check_data_parallel(make_spec(tiny_model_dir, prompts_per_step=2, drop_zero_std_groups=True), 2)
    assert dynamic.value.field == "grpo.drop_zero_std_groups"
