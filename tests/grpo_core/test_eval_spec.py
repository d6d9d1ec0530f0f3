"""The evaluation fields of a spec (issue 25 item 1): TRL's eval_strategy, eval_steps and
eval_on_start with TRL's meaning, our eval_num_generations, eval_temperature and
eval_pass_threshold, and the top-level eval_dataset; what is refused, and with which field named."""

from __future__ import annotations

from typing import Any

import pytest
from core_specs import spec_dict

from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.spec_file import InvalidSpec, parse_spec

EVAL_ROWS = {"prompts": [{"prompt": "Say yes.", "answer": "5"}, {"prompt": "Say no.", "answer": "5"}]}


def _eval_spec(tmp_path, eval_dataset: Any = EVAL_ROWS, **grpo: Any) -> dict[str, Any]:
    spec = spec_dict(tmp_path, **grpo)
    if eval_dataset is not None:
        spec["eval_dataset"] = eval_dataset
    return spec


def _only_error(spec: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec)
    [error] = info.value.errors
    return error.field, error.reason


def test_a_trl_eval_config_is_taken_with_its_meaning(tmp_path) -> None:
    spec = parse_spec(_eval_spec(tmp_path, eval_strategy="steps", eval_steps=2, eval_on_start=True,
                                 eval_num_generations=3, eval_temperature=0.7, eval_pass_threshold=0.5))
    grpo = spec.grpo
    assert (grpo.eval_strategy, grpo.eval_steps, grpo.eval_on_start) == ("steps", 2, True)
    assert (grpo.eval_num_generations, grpo.eval_temperature, grpo.eval_pass_threshold) == (3, 0.7, 0.5)
    assert [row["prompt"] for row in spec.eval_dataset.prompts] == ["Say yes.", "Say no."]
    assert spec.warnings() == []


def test_the_defaults_evaluate_nothing_greedily_once_per_prompt() -> None:
    grpo = GRPOConfig()
    assert (grpo.eval_strategy, grpo.eval_steps, grpo.eval_on_start) == ("no", None, False)
    assert (grpo.eval_num_generations, grpo.eval_temperature, grpo.eval_pass_threshold) == (1, 0.0, 1.0)
    assert grpo.eval_interval_for(100) is None


@pytest.mark.parametrize(("eval_steps", "total", "interval"), [(5, 100, 5), (0.25, 10, 3), (0.1, 100, 10),
                                                               (0.001, 10, 1)])
def test_eval_steps_is_a_count_or_a_fraction_rounded_up_as_in_transformers(
        eval_steps: float, total: int, interval: int) -> None:
    grpo = GRPOConfig(eval_strategy="steps", eval_steps=eval_steps)
    assert grpo.eval_interval_for(total) == interval


def test_steps_without_an_eval_dataset_names_eval_dataset(tmp_path) -> None:
    field, reason = _only_error(_eval_spec(tmp_path, None, eval_strategy="steps", eval_steps=2))
    assert field == "eval_dataset" and "eval_strategy 'steps'" in reason


def test_steps_without_eval_steps_names_eval_steps(tmp_path) -> None:
    field, reason = _only_error(_eval_spec(tmp_path, eval_strategy="steps"))
    assert field == "grpo.eval_steps" and "needs eval_steps" in reason


@pytest.mark.parametrize(("grpo", "field", "words"), [
    ({"eval_strategy": "epoch", "eval_steps": 2}, "grpo.eval_strategy", "'epoch' is not supported"),
    ({"eval_strategy": "steps", "eval_steps": 2.5}, "grpo.eval_steps", "whole number of steps"),
    ({"eval_strategy": "steps", "eval_steps": 0}, "grpo.eval_steps", "greater than 0"),
    ({"eval_num_generations": 0}, "grpo.eval_num_generations", "greater than or equal to 1"),
    ({"eval_temperature": -1}, "grpo.eval_temperature", "greater than or equal to 0"),
    ({"num_generations_eval": 4}, "grpo.num_generations_eval", "grpo.eval_num_generations"),
])
def test_bad_eval_fields_are_refused_naming_the_field(tmp_path, grpo: dict[str, Any], field: str,
                                                      words: str) -> None:
    error_field, reason = _only_error(_eval_spec(tmp_path, **grpo))
    assert error_field == field and words in reason


def test_an_eval_dataset_with_eval_strategy_no_warns_that_it_is_unused(tmp_path) -> None:
    [warning] = parse_spec(_eval_spec(tmp_path)).warnings()
    assert warning.field == "eval_dataset" and "grpo.eval_strategy is 'no'" in warning.message


def test_the_eval_dataset_is_checked_like_the_dataset(tmp_path) -> None:
    field, reason = _only_error(_eval_spec(tmp_path, {"prompts": [{"question": "x"}]}))
    assert field == "eval_dataset.prompts.0" and "'prompt'" in reason
