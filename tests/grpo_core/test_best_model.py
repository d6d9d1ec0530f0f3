"""The best checkpoint and early stopping (issue 37 item 2): the verdicts agree with transformers'
own ``EarlyStoppingCallback`` and ``Trainer._determine_best_metric`` on the same metric series;
through the real trainer, early stopping ends a run at its patience, the best step is checkpointed
and kept by retention, and the state goes on across a resume."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from core_specs import spec_dict
from safetensors.torch import load_file
from test_trainer import Recorder

from grpo_core.run.best_model import BestModel
from grpo_core.run.components import build_components
from grpo_core.run.trainer import GRPOTrainer
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.run_spec import RunSpec


def transformers_verdicts(values: list[float], greater: bool, patience: int, threshold: float,
                          ) -> list[tuple[bool, bool]]:
    """``(new best, stop)`` at each eval point as transformers' Trainer decides them: the callback's
    on_evaluate first (against the best before this point), then _determine_best_metric."""
    from transformers import EarlyStoppingCallback, TrainerControl, TrainerState

    args = SimpleNamespace(metric_for_best_model="reward", greater_is_better=greater)
    callback = EarlyStoppingCallback(early_stopping_patience=patience, early_stopping_threshold=threshold)
    state, verdicts = TrainerState(), []
    for value in values:
        control = TrainerControl()
        callback.on_evaluate(args, state, control, metrics={"eval_reward": value})
        best = state.best_metric
        new_best = best is None or (value > best if greater else value < best)
        if new_best:
            state.best_metric = value
        verdicts.append((new_best, control.should_training_stop))
    return verdicts


@pytest.mark.parametrize("greater", [True, False])
@pytest.mark.parametrize(("patience", "threshold"), [(1, 0.0), (2, 0.0), (3, 0.05)])
def test_verdicts_are_transformers(greater: bool, patience: int, threshold: float) -> None:
    rng = random.Random(patience * 7 + greater)
    config = GRPOConfig(metric_for_best_model="reward", greater_is_better=greater,
                        early_stopping_patience=patience, early_stopping_threshold=threshold)
    for _ in range(20):
        values = [round(rng.uniform(0, 1), 2) for _ in range(rng.randint(1, 12))]
        ours = BestModel(config)
        verdicts = [ours.observe(step, {"eval_reward": value})
                    for step, value in enumerate(values, start=1)]
        assert [(v.new_best, v.stop) for v in verdicts] == transformers_verdicts(values, greater, patience,
                                                                                  threshold), values


def test_names_and_defaults_follow_transformers() -> None:
    assert GRPOConfig(metric_for_best_model="pass@k").best_model_metric == "eval_pass@k"
    assert GRPOConfig(metric_for_best_model="eval_loss").best_model_greater_is_better is False
    assert GRPOConfig(metric_for_best_model="eval_reward").best_model_greater_is_better is True
    assert GRPOConfig(load_best_model_at_end=True).best_model_metric == "eval_reward"
    assert GRPOConfig().best_model_metric is None
    # A non-finite value is no best and no improvement.
    best = BestModel(GRPOConfig(metric_for_best_model="reward", early_stopping_patience=1))
    assert best.observe(1, {"eval_reward": 0.5}).new_best
    verdict = best.observe(2, {"eval_reward": float("nan")})
    assert not verdict.new_best and verdict.stop


def eval_run_spec(model_dir, **grpo) -> RunSpec:
    spec = spec_dict(model_dir, **{"max_steps": 8, "eval_strategy": "steps", "eval_steps": 1, **grpo})
    spec["eval_dataset"] = {"prompts": [{"prompt": p} for p in ("hello world", "the answer is", "two plus")]}
    spec["checkpoint_every"] = 100
    spec["checkpoint_keep_last"] = 1
    return RunSpec.model_validate(spec)


class EventLog(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.data: list[tuple[str, dict]] = []

    def on_event(self, type, message, data):  # noqa: A002
        super().on_event(type, message, data)
        self.data.append((type, data))


def test_early_stopping_ends_the_run_and_the_best_checkpoint_is_kept(tiny_model_dir, tmp_path) -> None:
    # eval_completions/mean_length with the model sampling at temperature 0 moves little: a run that
    # must improve it by 1000 tokens never does, so patience 2 ends it at its third eval point.
    spec = eval_run_spec(tiny_model_dir, metric_for_best_model="eval_completions/mean_length",
                         early_stopping_patience=2, early_stopping_threshold=1000.0,
                         load_best_model_at_end=True)
    log = EventLog()
    trainer = GRPOTrainer(build_components(spec, device="cpu"), tmp_path, log)
    result = trainer.train()
    assert result.early_stopped and not result.stopped
    assert result.step == 3  # step 1 is the first best; steps 2 and 3 did not improve by 1000
    events = dict(log.data)
    assert events["early_stopped"]["step"] == 3 and events["early_stopped"]["patience"] == 2
    best_step = result.best_summary["step"]
    assert result.best == tmp_path / f"step-{best_step}"
    values = {r["step"]: r["eval_completions/mean_length"] for r in log.records}
    assert result.best_summary["value"] == max(values[s] for s in (1, 2, 3))
    assert values[best_step] == result.best_summary["value"]
    # Retention keeps one checkpoint (the final one) and the best one.
    kept = sorted(p.name for p in tmp_path.glob("step-*"))
    assert kept == sorted({f"step-{best_step}", "step-3"})
    assert [t for t, _ in log.data].count("best_checkpoint") >= 1


def test_the_best_is_tracked_across_a_resume(tiny_model_dir, tmp_path) -> None:
    spec = eval_run_spec(tiny_model_dir, metric_for_best_model="eval_reward", greater_is_better=False,
                         max_steps=4)
    whole = GRPOTrainer(build_components(spec, device="cpu"), tmp_path / "whole", Recorder())
    expected = whole.train()
    first = GRPOTrainer(build_components(spec, device="cpu"), tmp_path / "parts", Recorder(stop_after=2))
    assert first.train().stopped
    second = GRPOTrainer(build_components(spec, device="cpu"), tmp_path / "parts", Recorder())
    assert second.resume()
    resumed = second.train()
    assert resumed.best_summary == expected.best_summary
    weights = load_file(resumed.best / "model.safetensors")
    assert all(torch.equal(weights[k], v) for k, v in load_file(expected.best / "model.safetensors").items())


def test_two_ranks_stop_together_for_a_rule_and_for_early_stopping(tiny_model_dir, tmp_path) -> None:
    """On k ranks every rank judges the same record and they end at the same step (a rank that
    went on alone would wait for ever in the next collective): a pausing rule, then early stopping
    with the best checkpoint kept."""
    from test_distributed import HANG

    from grpo_core.run.launch import run_data_parallel

    spec = eval_run_spec(tiny_model_dir, max_steps=5, metric_for_best_model="eval_completions/mean_length",
                         early_stopping_patience=1, early_stopping_threshold=1000.0)
    stopped = run_data_parallel(spec, tmp_path, tmp_path / "early", 2, device="cpu", progress=False,
                                hang_timeout=HANG)
    assert stopped.early_stopped and stopped.step == 2 and stopped.best_summary["step"] in (1, 2)
    assert stopped.best.is_dir()

    paused_spec = RunSpec.model_validate({**spec.model_dump(), "alerts": [
        {"rule": "no_signal", "threshold": 0.0, "window": 1, "action": "pause"}]})
    paused = run_data_parallel(paused_spec, tmp_path, tmp_path / "paused", 2, device="cpu", progress=False,
                               hang_timeout=HANG)
    assert paused.stopped and paused.step == 1 and paused.alert.rule == "no_signal"
