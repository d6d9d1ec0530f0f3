"""Reward registry, built-ins and scoring: pure Python, no model or torch needed."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reward_helpers import bind_one, fresh_registry, run, spec_error  # noqa: F401 - autouse fixture

from grpo_core.errors import GRPOError
from grpo_core.rewards import (
    BoundReward,
    RewardContext,
    available_rewards,
    bind_rewards,
    reward_catalog,
    score_completions,
)
from grpo_core.spec.run_spec import RewardSpec

ROOT = Path(__file__).resolve().parents[2]

BUILTIN_NAMES = {
    "exact_match",
    "numeric_match",
    "regex_match",
    "think_answer_format",
    "length_target",
    "contains",
    "json_valid",
}


class FakeTokenizer:
    """Counts whitespace-separated words as tokens; checks that special tokens are not added."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return list(range(len(text.split())))


# --- built-ins -------------------------------------------------------------------------------------


def test_exact_match_strips_and_folds_case_as_asked():
    default = bind_one("exact_match")
    assert run(default, [" 42\n", "43", "x"], answer=["42", "42", None]) == [1.0, 0.0, None]
    assert run(default, ["Paris"], answer=["paris"]) == [0.0]
    folded = bind_one("exact_match", case_sensitive=False, field="city")
    assert run(folded, ["PARIS"], city=["paris"]) == [1.0]
    unstripped = bind_one("exact_match", strip=False)
    assert run(unstripped, [" 42", "42"], answer=[42, 42]) == [0.0, 1.0]  # column value compared as str


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("The answer is \\boxed{1,234}", "1234", 1.0),
        ("so 12 km", "12", 1.0),
        ("It costs $5.50", "5.5", 1.0),
        ("-3", "-3", 1.0),
        ("-3", "3", 0.0),
        ("Natalia sold 48 + 24 = 72 clips", "She sold ... #### 72", 1.0),
        ("\\boxed{3/4}", "0.75", 1.0),
        ("\\boxed{\\frac{3}{4}}", "3/4", 1.0),
        ("\\boxed{1 234}", "#### 1,234", 1.0),
        ("\\boxed{1\\,234}", "1234", 1.0),  # LaTeX thin space as a thousands separator
        ("7", "the total is 7 ####", None),  # the marker promises an answer after it; none there
        ("growth was 12%", "12", 1.0),
        ("first 7, then 8", "7", 0.0),  # the last number wins
        ("first 7, then 8", "8", 1.0),
        ("\\boxed{8} but maybe 7", "8", 1.0),  # a boxed answer beats a later number
        ("\\boxed{1} then \\boxed{2}", "2", 1.0),  # the last box wins
        ("no number here", "5", 0.0),
        ("\\boxed{A}", "5", 0.0),  # a box without a number is a wrong answer, not a fallback
        ("10 - 3", "3", 1.0),  # a detached minus is subtraction, not a sign
        ("1.5e3 meters", "1500", 1.0),
        ("anything 5", "no number at all", None),
        ("anything 5", None, None),
        ("anything 5", 5, 1.0),
    ],
)
def test_numeric_match_cases(completion: str, reference: Any, expected: float | None):
    assert run(bind_one("numeric_match"), [completion], answer=[reference]) == [expected]


def test_numeric_match_tolerances():
    loose = bind_one("numeric_match", rel_tol=0.01)
    assert run(loose, ["100.5", "102"], answer=["100", "100"]) == [1.0, 0.0]
    strict = bind_one("numeric_match")
    assert run(strict, ["100.5"], answer=["100"]) == [0.0]


def test_regex_match_modes_and_flags():
    search = bind_one("regex_match", pattern=r"\d+")
    assert run(search, ["abc 12", "abc"]) == [1.0, 0.0]
    full = bind_one("regex_match", pattern=r"\d+", mode="fullmatch")
    assert run(full, ["12", "abc 12"]) == [1.0, 0.0]
    folded = bind_one("regex_match", pattern="^yes$", flags=["IGNORECASE", "MULTILINE"])
    assert run(folded, ["well\nYES\n", "no"]) == [1.0, 0.0]


def test_regex_invalid_pattern_is_a_spec_error_at_pattern():
    error = spec_error(
        [RewardSpec(name="exact_match"), RewardSpec(name="regex_match", args={"pattern": "(a"})]
    )
    assert error.field == "rewards.1.args.pattern"
    assert "invalid regular expression" in error.reason


def test_regex_pattern_length_is_capped():
    error = spec_error([RewardSpec(name="regex_match", args={"pattern": "a" * 513})])
    assert error.field == "rewards.0.args.pattern"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("<think>reason</think>answer", 1.0),
        ("  \n<think>reason</think>\n\n answer \n", 1.0),
        ("<think></think>answer", 1.0),  # an empty block is still one complete block
        ("<think>reason</think>   ", 0.0),  # no answer
        ("<think>reason", 0.0),  # unclosed
        ("answer only", 0.0),
        ("preamble <think>reason</think>answer", 0.0),  # only whitespace may precede the block
        ("<think>a</think>b<think>c</think>d", 0.0),  # two blocks
        ("<think>a<think>b</think>c", 0.0),  # nested open tag
        ("<think>a</think>b</think>", 0.0),  # stray close tag in the answer
    ],
)
def test_think_answer_format_reads_raw_completions(raw: str, expected: float):
    reward = bind_one("think_answer_format")
    # completions are the stripped answers; the reward must look at raw_completions instead.
    assert run(reward, ["stripped answer"], raw_completions=[raw]) == [expected]


def test_think_answer_format_falls_back_to_completions_and_answer_tags():
    assert run(bind_one("think_answer_format"), ["<think>r</think>a", "a"]) == [1.0, 0.0]
    tagged = bind_one("think_answer_format", answer_open="<answer>", answer_close="</answer>")
    raws = [
        "<think>r</think><answer>42</answer>",
        "<think>r</think> <answer> 42 </answer> ",
        "<think>r</think>42",
        "<think>r</think><answer> </answer>",
        "<think>r</think><answer>1</answer><answer>2</answer>",
    ]
    assert run(tagged, ["x"] * 5, raw_completions=raws) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_think_answer_format_prompt_ending_in_open_tag():
    reward = bind_one("think_answer_format")
    prompts = ["<|Assistant|><think>\n", "plain prompt"]
    raws = ["reasoning</think>answer", "reasoning</think>answer"]
    assert reward.fn(["answer", "answer"], prompts, raw_completions=raws) == [1.0, 0.0]


def test_think_answer_format_answer_tags_must_be_paired():
    error = spec_error([RewardSpec(name="think_answer_format", args={"answer_open": "<a>"})])
    assert error.field == "rewards.0.args"
    assert "answer_close" in error.reason


def test_length_target_chars_and_tokens():
    chars = bind_one("length_target", target=10)
    assert run(chars, ["x" * 10, "x" * 5, "x" * 15, "x" * 30, ""]) == [1.0, 0.5, 0.5, 0.0, 0.0]
    tokens = bind_one("length_target", RewardContext(tokenizer=FakeTokenizer()), target=4, unit="tokens")
    assert run(tokens, ["a b c d", "a b", "a b c d e f g h i"]) == [1.0, 0.5, 0.0]


def test_length_target_tokens_needs_a_tokenizer():
    error = spec_error([RewardSpec(name="length_target", args={"target": 5, "unit": "tokens"})])
    assert error.field == "rewards.0.args.unit"
    assert "tokenizer" in error.reason


def test_contains_text_or_field():
    fixed = bind_one("contains", text="Paris")
    assert run(fixed, ["It is Paris.", "it is paris"]) == [1.0, 0.0]
    folded = bind_one("contains", text="Paris", case_sensitive=False)
    assert run(folded, ["it is paris"]) == [1.0]
    column = bind_one("contains", field="city")
    assert column.columns == ["city"]
    assert run(column, ["in Rome", "in Rome", "in Rome", "x"], city=["Rome", "Oslo", None, ""]) == [
        1.0,
        0.0,
        None,
        None,
    ]


@pytest.mark.parametrize("args", [{}, {"text": "a", "field": "b"}])
def test_contains_needs_exactly_one_of_text_or_field(args: dict[str, Any]):
    error = spec_error([RewardSpec(name="contains", args=args)])
    assert error.field == "rewards.0.args"
    assert "exactly one" in error.reason


def test_json_valid():
    reward = bind_one("json_valid")
    texts = [
        '{"a": 1}',
        " [1, 2] ",
        '```json\n{"a": 1}\n```',
        "```\n[1]\n```",
        "{a: 1}",
        "NaN",
        "",
        "[" * 100_000,
    ]
    assert run(reward, texts) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    objects = bind_one("json_valid", require_object=True)
    assert run(objects, ['{"a": 1}', "[1]", "3"]) == [1.0, 0.0, 0.0]


def test_rewards_package_does_not_import_torch():
    # A fresh interpreter: this test process may have imported torch through other modules.
    code = (
        "import sys, grpo_core.rewards; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]"


# --- registry and binding ------------------------------------------------------------------------


def test_available_rewards_and_catalog_cover_the_builtins():
    assert BUILTIN_NAMES <= set(available_rewards())
    catalog = {entry["name"]: entry for entry in reward_catalog()}
    assert BUILTIN_NAMES <= set(catalog)
    length = catalog["length_target"]
    assert length["builtin"] is True
    assert length["args_schema"]["properties"]["target"]["maximum"] == 100_000
    assert length["args_schema"]["additionalProperties"] is False
    for entry in catalog.values():
        for name, prop in entry["args_schema"].get("properties", {}).items():
            assert prop.get("description"), f"{entry['name']}.{name} has no description"


def test_unknown_reward_lists_available_names():
    error = spec_error([RewardSpec(name="json_valid"), RewardSpec(name="nope")])
    assert error.field == "rewards.1.name"
    names = ", ".join(sorted(available_rewards()))
    assert error.reason == f"unknown reward 'nope'; available: {names}"


@pytest.mark.parametrize(
    ("args", "field", "fragment"),
    [
        # Our contract is the code and the field path; the wording is pydantic's, except where
        # the reason must name the values to use instead (the unit's choices, the bound).
        ({"target": 0}, "rewards.0.args.target", "1"),
        ({"target": 100_001}, "rewards.0.args.target", "100000"),
        ({}, "rewards.0.args.target", ""),
        ({"target": 5, "colour": "red"}, "rewards.0.args.colour", ""),
        ({"target": 5, "unit": "words"}, "rewards.0.args.unit", "chars"),
    ],
)
def test_bad_args_name_the_field_path(args: dict[str, Any], field: str, fragment: str):
    error = spec_error([RewardSpec(name="length_target", args=args)])
    assert error.field == field
    assert fragment in error.reason
    assert error.code == "invalid_spec"


def test_bad_list_item_path_includes_the_index():
    error = spec_error(
        [RewardSpec(name="regex_match", args={"pattern": "a", "flags": ["DOTALL", "VERBOSE"]})]
    )
    assert error.field == "rewards.0.args.flags.1"


def test_missing_column_is_reported_before_training():
    specs = [RewardSpec(name="json_valid"), RewardSpec(name="numeric_match")]
    error = spec_error(specs, columns={"solution", "id"})
    assert error.field == "rewards.1.args"
    assert error.reason == "needs dataset column 'answer'; columns present: id, solution"
    bound = bind_rewards(specs, RewardContext(), columns={"answer"})
    assert [reward.columns for reward in bound] == [[], ["answer"]]


def test_duplicate_names_get_numbered_metric_names():
    specs = [
        RewardSpec(name="regex_match", args={"pattern": "a"}, weight=0.5),
        RewardSpec(name="json_valid"),
        RewardSpec(name="regex_match", args={"pattern": "b"}),
        RewardSpec(name="regex_match", args={"pattern": "c"}),
    ]
    bound = bind_rewards(specs, RewardContext())
    assert [reward.name for reward in bound] == [
        "regex_match",
        "json_valid",
        "regex_match_2",
        "regex_match_3",
    ]
    assert [reward.weight for reward in bound] == [0.5, 1.0, 1.0, 1.0]
    assert [run(reward, ["b"])[0] for reward in bound] == [0.0, 0.0, 1.0, 0.0]


# --- scoring -------------------------------------------------------------------------------------


def fixed(name: str, values: Any) -> BoundReward:
    return BoundReward(name=name, weight=1.0, fn=lambda completions, prompts, **columns: values)


def test_score_completions_builds_an_n_by_f_matrix_with_nan_for_none():
    rewards = [bind_one("numeric_match"), bind_one("think_answer_format")]
    matrix = score_completions(
        rewards,
        completions=["72", "71", "5"],
        prompts=["p", "p", "q"],
        columns={"answer": ["72", "72", None]},
        raw_completions=["<think>r</think>72", "71", "5"],
    ).matrix
    assert len(matrix) == 3 and all(len(row) == 2 for row in matrix)
    assert matrix[0] == [1.0, 1.0]
    assert matrix[1] == [0.0, 0.0]
    assert math.isnan(matrix[2][0]) and matrix[2][1] == 0.0


def test_score_completions_passes_every_column_and_copies():
    seen: dict[str, Any] = {}

    def spy(completions: list[str], prompts: list[str], **columns: Any) -> list[float]:
        seen.update(columns, prompts=prompts)
        completions.append("mutated")
        return [1.0] * 2

    completions = ["a", "b"]
    columns = {"answer": [1, 2], "extra": ["e", "f"]}
    matrix = score_completions([BoundReward("spy", 1.0, spy)], completions, ["p", "q"], columns).matrix
    assert matrix == [[1.0], [1.0]]
    # Without raw texts (no reasoning split) the answers stand in for them; without messages (or
    # episodes), None.
    expected = {"answer": [1, 2], "extra": ["e", "f"], "prompts": ["p", "q"], "raw_completions": ["a", "b"],
                "prompt_messages": [None, None], "completion_messages": [None, None],
                "environment_reward": [None, None]}
    assert seen == expected
    assert completions == ["a", "b"]


def test_non_finite_values_become_nan():
    rewards = [fixed("r", [math.inf, -math.inf, math.nan, 10**400, 2])]
    matrix = score_completions(rewards, ["a"] * 5, ["p"] * 5, {}).matrix
    assert all(math.isnan(row[0]) for row in matrix[:4])
    assert matrix[4] == [2.0]


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ([1.0], "returned 1 values for 2 completions"),
        ([1.0, 2.0, 3.0], "returned 3 values for 2 completions"),
        ("10", "returned str"),
        (1.0, "returned float"),
        ([1.0, "1"], "returned str"),
        ([True, 1.0], "returned bool"),
    ],
)
def test_bad_return_values_are_reward_errors(values: Any, fragment: str):
    with pytest.raises(GRPOError) as info:
        score_completions([fixed("mine", values)], ["a", "b"], ["p", "p"], {})
    assert info.value.code == "reward_error"
    assert "reward 'mine'" in info.value.message
    assert fragment in info.value.message


def test_exception_in_a_reward_is_wrapped_and_chained():
    def explode(completions: list[str], prompts: list[str], **columns: Any) -> list[float]:
        raise ZeroDivisionError("boom")

    with pytest.raises(GRPOError) as info:
        score_completions([BoundReward("explosive", 1.0, explode)], ["a"], ["p"], {})
    assert info.value.code == "reward_error"
    assert "explosive" in info.value.message and "boom" in info.value.message
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("CUDA error: out of memory")])
def test_a_reward_out_of_memory_is_out_of_memory_not_a_reward_error(error: BaseException):
    def reward_model(completions: list[str], prompts: list[str], **columns: Any) -> list[float]:
        raise error

    with pytest.raises(GRPOError) as info:
        score_completions([BoundReward("judge", 1.0, reward_model)], ["a"], ["p"], {})
    assert info.value.code == "out_of_memory" and "lower" in info.value.message
    assert info.value.__cause__ is error


def test_missing_column_at_score_time_is_a_reward_error():
    with pytest.raises(GRPOError) as info:
        score_completions([bind_one("exact_match")], ["a"], ["p"], {})
    assert info.value.code == "reward_error"
    assert "'answer'" in info.value.message


def test_misaligned_inputs_are_caller_errors():
    with pytest.raises(ValueError, match="prompts"):
        score_completions([], ["a", "b"], ["p"], {})
    with pytest.raises(ValueError, match="column 'answer'"):
        score_completions([], ["a"], ["p"], {"answer": [1, 2]})
    for reserved in ("completions", "prompts", "raw_completions"):
        with pytest.raises(ValueError, match="clashes"):
            score_completions([], ["a"], ["p"], {reserved: ["x"]})
    with pytest.raises(ValueError, match="raw completions"):
        score_completions([], ["a"], ["p"], {}, raw_completions=["x", "y"])
