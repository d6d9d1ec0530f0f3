"""Evaluation during training (issue 25 item 1) through the real trainer, tiny model and real
rewards: eval points at 0, N, 2N and the final step, metrics checked by hand from the eval
completions, keyed randomness that no batch split changes, exactly once across a resume, and
training itself unchanged by evaluating."""

from __future__ import annotations

import math
from statistics import mean, stdev
from typing import Any

import pytest
from core_specs import PROMPTS, spec_dict
from run_records import records
from same_records import assert_same_record
from test_distributed import COMPARABLE_ADAM, HANG
from test_trainer import comparable, run

from grpo_core.algorithm.eval_metrics import EVAL_SPLIT, EvalRow, pass_at_k
from grpo_core.algorithm.evaluation import EvalInputs, evaluate, rank_batches
from grpo_core.run.components import build_components
from grpo_core.run.launch import run_data_parallel
from grpo_core.run.local_run import run_local
from grpo_core.spec.run_spec import RunSpec

EVAL_PROMPTS = ["hello world", "the answer is", "two plus two", "let me think", "first then"]


def eval_spec(model_dir, checkpoint_every: int = 100, **grpo: Any) -> RunSpec:
    """Training on the usual prompts; evaluation on five others with one deterministic reward
    (contains "the": the tiny model says it in some completions, not all)."""
    settings = {"max_steps": 5, "eval_strategy": "steps", "eval_steps": 2, **grpo}
    spec = spec_dict(model_dir, **settings)
    spec["eval_dataset"] = {"prompts": [{"prompt": p} for p in EVAL_PROMPTS]}
    spec["rewards"] = [{"name": "contains", "args": {"text": "the"}}]
    spec["checkpoint_every"] = checkpoint_every
    return RunSpec.model_validate(spec)


def eval_records(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records if "eval_reward" in r}


def test_eval_runs_on_start_every_eval_steps_and_at_the_final_step(tiny_model_dir, tmp_path) -> None:
    _, recorder, _ = run(eval_spec(tiny_model_dir, eval_on_start=True), tmp_path)
    assert [r["step"] for r in recorder.records] == [0, 1, 2, 3, 4, 5]
    assert sorted(eval_records(recorder.records)) == [0, 2, 4, 5]
    # Step 0 is the untrained policy's evaluation alone.
    eval_keys = {k for k in recorder.records[2] if k.startswith("eval_") or k == "timing/eval"}
    assert recorder.records[0].keys() == {"step", *eval_keys}
    assert {"eval_reward", "eval_reward_std", "eval_rewards/contains/mean", "eval_pass@k",
            "eval_completions/mean_length"} <= eval_keys
    for step, record in eval_records(recorder.records).items():
        assert record["timing/eval"] > 0
        eval_rows = [row for row in recorder.samples[step] if row.get("split") == EVAL_SPLIT]
        assert len(eval_rows) == len(EVAL_PROMPTS)  # eval_num_generations defaults to 1
    # A step that logs completions and evaluates keeps both: training's rows first.
    splits = [row.get("split") for row in recorder.samples[2]]
    assert splits == [None] * (2 * 4) + [EVAL_SPLIT] * len(EVAL_PROMPTS)


def _by_hand(rows: list[dict], threshold: float) -> dict[str, float]:
    rewards = [float("the" in row["answer"]) for row in rows]
    by_prompt: dict[str, bool] = {}
    for row, reward in zip(rows, rewards, strict=True):
        by_prompt[row["prompt"]] = by_prompt.get(row["prompt"], False) or reward >= threshold
    return {"eval_reward": mean(rewards), "eval_reward_std": stdev(rewards),
            "eval_rewards/contains/mean": mean(rewards),
            "eval_pass@k": sum(by_prompt.values()) / len(by_prompt)}


def test_eval_metrics_are_those_of_the_eval_completions(tiny_model_dir, tmp_path) -> None:
    spec = eval_spec(tiny_model_dir, eval_num_generations=3, eval_temperature=1.0, max_steps=2)
    _, recorder, _ = run(spec, tmp_path)
    record = eval_records(recorder.records)[2]
    rows = [row for row in recorder.samples[2] if row.get("split") == EVAL_SPLIT]
    assert len(rows) == 3 * len(EVAL_PROMPTS)
    assert [row["reward"] for row in rows] == [float("the" in row["answer"]) for row in rows]
    expected = _by_hand(rows, 1.0)
    assert 0 < expected["eval_reward"] < 1, "the reward should split the completions"
    assert {k: record[k] for k in expected} == pytest.approx(expected)
    assert all(row["advantage"] is None and row["step"] == 2 for row in rows)
    assert record["eval_completions/max_length"] <= spec.grpo.max_completion_length


def test_greedy_eval_gives_each_prompt_one_answer(tiny_model_dir, tmp_path) -> None:
    _, recorder, _ = run(eval_spec(tiny_model_dir, eval_num_generations=2, max_steps=2), tmp_path)
    rows = [row for row in recorder.samples[2] if row.get("split") == EVAL_SPLIT]
    assert [row["completion"] for row in rows[0::2]] == [row["completion"] for row in rows[1::2]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eval_rows_do_not_depend_on_the_batch_split(tiny_model_dir, temperature: float) -> None:
    spec = eval_spec(tiny_model_dir, eval_num_generations=3, eval_temperature=temperature)
    c = build_components(spec, device="cpu")
    results = []
    for prompts_per_step in (1, 2, 8):  # 1, 2 and all 5 eval prompts per generation call
        config = c.spec.grpo.model_copy(update={"prompts_per_step": prompts_per_step})
        inputs = EvalInputs(c.models.policy, c.tokenizer, c.eval_prompts, c.rewards, c.eos_ids, config,
                            c.spec.reasoning, c.placement)
        results.append(evaluate(inputs, step=3))
    assert results[0].samples == results[1].samples == results[2].samples
    assert results[0].metrics == results[1].metrics == results[2].metrics
    # Another step draws other completions when sampling.
    def completions(samples: list[dict]) -> list[str]:
        return [row["completion"] for row in samples]

    other = evaluate(inputs, step=4).samples
    assert (completions(other) == completions(results[0].samples)) == (temperature == 0.0)


def test_evaluating_leaves_training_unchanged(tiny_model_dir, tmp_path) -> None:
    _, plain, _ = run(eval_spec(tiny_model_dir, eval_strategy="no", max_steps=3), tmp_path / "plain")
    _, evaluated, _ = run(eval_spec(tiny_model_dir, eval_steps=1, eval_temperature=1.0, max_steps=3),
                          tmp_path / "eval")
    training_only = [{k: v for k, v in comparable(r).items() if not k.startswith("eval")}
                     for r in evaluated.records]
    assert training_only == [comparable(r) for r in plain.records]


def test_a_resumed_run_evaluates_each_eval_point_exactly_once(tiny_model_dir, tmp_path) -> None:
    spec = eval_spec(tiny_model_dir, checkpoint_every=1, eval_temperature=1.0, eval_num_generations=2)
    _, full, _ = run(spec, tmp_path / "full")
    # Stopped right after eval point 2 (checkpointed with it), then resumed.
    first, part, _ = run(spec, tmp_path / "split", stop_after=2)
    assert first.stopped and first.step == 2
    _, rest, _ = run(spec, tmp_path / "split", resume=True)
    resumed = part.records + rest.records
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert sorted(eval_records(resumed)) == [2, 4, 5]
    assert [comparable(r) for r in resumed] == [comparable(r) for r in full.records]
    assert {**part.samples, **rest.samples} == full.samples


@pytest.mark.slow
def test_two_gloo_ranks_evaluate_exactly_like_one_process(tiny_model_dir, tmp_path) -> None:
    # Five eval prompts: rank 0 takes three, rank 1 two, and with 1 prompt a batch rank 1 has an
    # empty last batch.
    spec = eval_spec(tiny_model_dir, max_steps=2, eval_steps=1, eval_on_start=True, prompts_per_step=2,
                     num_generations=2, eval_num_generations=2, eval_temperature=1.0, **COMPARABLE_ADAM)
    run_local(spec, tmp_path, tmp_path / "one", device="cpu", progress=False)
    run_data_parallel(spec, tmp_path, tmp_path / "two", 2, device="cpu", progress=False, hang_timeout=HANG)
    one, two = records(tmp_path / "one", "metrics"), records(tmp_path / "two", "metrics")
    assert sorted(eval_records(two)) == [0, 1, 2]
    for step, record in eval_records(one).items():
        evaluated = {k: v for k, v in record.items() if k.startswith("eval_")}
        assert_same_record(evaluated, {k: eval_records(two)[step][k] for k in evaluated}, f"step {step}")
    eval_samples = [[row for row in records(tmp_path / name, "samples") if row.get("split") == EVAL_SPLIT]
                    for name in ("one", "two")]
    assert len(eval_samples[1]) == 3 * 2 * len(EVAL_PROMPTS)
    assert [row["completion"] for row in eval_samples[0]] == [row["completion"] for row in eval_samples[1]]


def _row(prompt: int, reward: float) -> EvalRow:
    return EvalRow(prompt, 0, f"p{prompt}", "", "", [reward], reward, 1, False)


def test_pass_at_k_counts_prompts_with_one_completion_at_the_threshold() -> None:
    rows = [_row(0, 0.0), _row(0, 1.0), _row(1, 0.5), _row(1, math.nan), _row(2, 0.2), _row(2, 0.4)]
    assert pass_at_k(rows, 1.0) == pytest.approx(1 / 3)  # prompt 0 only
    assert pass_at_k(rows, 0.5) == pytest.approx(2 / 3)  # prompts 0 and 1; a NaN never passes
    assert pass_at_k(rows, -1.0) == 1.0


def test_ranks_get_contiguous_shares_in_the_same_number_of_batches() -> None:
    shares = [rank_batches(5, rank, 2, 2) for rank in range(2)]
    assert shares == [[[0, 1], [2]], [[3, 4], []]]
    assert rank_batches(1, 1, 2, 4) == [[]]
    assert rank_batches(len(PROMPTS), 0, 1, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
