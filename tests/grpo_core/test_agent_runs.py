"""Whole runs of an environment job on the tiny model: a run stopped mid-round and resumed is
the uninterrupted run, step for step; two gloo ranks train exactly as one process (each rank plays
its share of the episodes, their turn counts differing, with no collective inside the turn loop)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from core_specs import spec_dict
from run_records import assert_same_run, assert_same_samples, records
from sandbox_guard import needs_sandbox
from test_distributed import COMPARABLE_ADAM, HANG
from test_trainer import comparable, run

from grpo_core.run.launch import run_data_parallel
from grpo_core.run.local_run import run_local
from grpo_core.spec.run_spec import RunSpec

pytestmark = [needs_sandbox, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "environment.yaml"


def environment_spec(model_dir: Path, **grpo) -> RunSpec:
    """The guess-the-number game of examples/environment.yaml on the tiny model: 24 model tokens
    an episode, so some episodes take several turns and others one."""
    spec = spec_dict(model_dir, max_completion_length=24, **grpo)
    spec["dataset"] = {"prompts": [{"prompt": [{"role": "user", "content": f"Guess {i}."}], "target": 3 + i}
                                   for i in range(4)]}
    spec["environment"] = yaml.safe_load(EXAMPLE.read_text())["environment"]
    spec["rewards"] = [{"name": "contains", "args": {"text": "7"}, "weight": 0.5}]
    return RunSpec.model_validate(spec)


def test_an_environment_run_resumed_mid_round_is_the_uninterrupted_run(tiny_model_dir, tmp_path) -> None:
    spec = environment_spec(tiny_model_dir, max_steps=5, steps_per_generation=2)
    _, full, _ = run(spec, tmp_path / "full")
    assert max(r["turns/max"] for r in full.records) > 1.0  # the game answered and was played on
    first, part, _ = run(spec, tmp_path / "split", stop_after=3)
    assert first.stopped and first.step == 3
    _, rest, _ = run(spec, tmp_path / "split", resume=True)
    resumed = [comparable(r) for r in part.records + rest.records]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert resumed == [comparable(r) for r in full.records]


def test_an_environment_job_on_two_gloo_ranks_trains_exactly_like_one_process(tiny_model_dir, tmp_path):
    spec = environment_spec(tiny_model_dir, max_steps=3, prompts_per_step=4, loss_type="bnpo",
                            scale_rewards="batch", **COMPARABLE_ADAM)
    single = run_local(spec, tmp_path, tmp_path / "one", device="cpu", progress=False)
    double = run_data_parallel(spec, tmp_path, tmp_path / "two", 2, device="cpu", progress=False,
                               hang_timeout=HANG)
    assert single.step == double.step == 3
    assert_same_samples(tmp_path / "one", tmp_path / "two")
    assert_same_run(tmp_path / "one", tmp_path / "two")
    metrics = records(tmp_path / "two", "metrics")
    assert all("env_reward/mean" in m for m in metrics) and any(m["turns/max"] > 1 for m in metrics)
