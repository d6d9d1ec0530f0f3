"""What a spec is refused for before it is queued (issue 12, Why 2 and 7): hub ids that are not
plain ``owner/name`` ids, inline rows without a usable prompt or with a reserved column, malformed
chat messages, regexes that do not compile and reward fields missing from the inline rows. Each
error names the dotted path of the field to fix, as a 422 does."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from grpo_core.errors import SpecError
from grpo_core.rewards import validate_reward_specs
from grpo_core.spec.run_spec import RewardSpec, RunSpec
from grpo_core.spec.sources import split_source

PROMPTS = [{"prompt": "Is it yes?", "answer": "yes"}]


def spec(**fields: Any) -> dict[str, Any]:
    return {"name": "t", "model": {"source": "path:tiny"}, "dataset": {"prompts": PROMPTS},
            "rewards": [{"name": "contains", "args": {"text": "yes"}}], **fields}


def error_paths(body: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(body)
    return {".".join(map(str, e["loc"])): e["msg"] for e in info.value.errors()}


@pytest.mark.parametrize("hub_id", ["outside/m", "Qwen/Qwen2.5-0.5B-Instruct", "a_b/c.d-e@main",
                                    "o/n@refs/pr/1"])
def test_hub_ids_of_the_hubs_own_shape_are_accepted(hub_id: str) -> None:
    assert split_source(f"hf:{hub_id}") == ("hf", hub_id)


@pytest.mark.parametrize("hub_id", ["x/..", "./a", "a/b/c", "../a/b", "gpt2", "a/.b", "a-/b", "a--b/c",
                                    "a/b@../../etc", "a/b c", "/abs/path", "a\\b/c", "o/" + "n" * 95,
                                    "a/b@", "a/b@/x"])
def test_hub_ids_that_could_name_a_path_are_refused_at_the_source_field(hub_id: str) -> None:
    for section, field in (("model", "source"), ("dataset", "source")):
        body = spec(**{section: {"source": f"hf:{hub_id}"}})
        found = error_paths(body)
        assert f"{section}.{field}" in found, found
        assert "hf: ids" in found[f"{section}.{field}"]


@pytest.mark.parametrize(
    ("dataset", "path", "words"),
    [
        ({"prompts": []}, "dataset.prompts", "at least 1 item"),
        ({"prompts": [{"question": "2+2?"}]}, "dataset.prompts.0", "no 'prompt'"),
        ({"prompts": [{"question": "2+2?"}], "prompt_field": "q"}, "dataset.prompts.0", "no 'q'"),
        ({"prompts": [*PROMPTS, {"prompt": "  "}]}, "dataset.prompts.1.prompt", "a blank string"),
        ({"prompts": [{"prompt": "x", "completions": "y"}]}, "dataset.prompts.0.completions", "reserved"),
        ({"prompts": [{"prompt": "x", "raw_completions": 1}]}, "dataset.prompts.0.raw_completions",
         "reserved"),
        ({"prompts": [{"prompt": [{"role": "robot", "content": "hi"}]}]}, "dataset.prompts.0.prompt",
         "role is 'robot'"),
        ({"prompts": [{"prompt": [{"role": "user", "content": ["hi"]}]}]}, "dataset.prompts.0.prompt",
         "content part that is not"),
        ({"prompts": [{"prompt": [{"role": "user", "content": 3}]}]}, "dataset.prompts.0.prompt",
         "content is not a string"),
        ({"prompts": [{"prompt": ["hi"]}]}, "dataset.prompts.0.prompt", "a message that is str"),
        ({"prompts": [{"prompt": []}]}, "dataset.prompts.0.prompt", "an empty list"),
    ],
)
def test_bad_inline_rows_name_the_row_and_column(dataset: dict, path: str, words: str) -> None:
    found = error_paths(spec(dataset=dataset))
    assert path in found and words in found[path], found


def test_chat_messages_of_the_three_roles_are_accepted() -> None:
    messages = [{"role": r, "content": "x"} for r in ("system", "user", "assistant")]
    RunSpec.model_validate(spec(dataset={"prompts": [{"prompt": messages}]}))


@pytest.mark.parametrize("pattern", ["(", "[z-a]", "a{2,1}", "a**"])
def test_a_regex_that_does_not_compile_is_refused_at_its_pattern(pattern: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_reward_specs([RewardSpec(name="contains", args={"text": "a"}),
                               RewardSpec(name="regex_match", args={"pattern": pattern})])
    assert info.value.field == "rewards.1.args.pattern"
    assert "invalid regular expression" in info.value.reason


def test_a_pattern_that_would_compile_for_ever_is_refused_before_compiling() -> None:
    """``(?:a{65535}){65535}`` unrolls to 4e9 copies: compiling it would hold the API's process."""
    for pattern in ("(?:a{65535}){65535}", "(?:x{316}){317}", "a{100001}"):
        with pytest.raises(SpecError) as info:
            validate_reward_specs([RewardSpec(name="regex_match", args={"pattern": pattern})])
        assert info.value.field == "rewards.0.args.pattern" and "too many to compile" in info.value.reason
    validate_reward_specs([RewardSpec(name="regex_match", args={"pattern": r"\d{1,3}(?:,\d{3}){0,5}"})])


def test_a_reward_field_missing_from_the_inline_rows_is_refused() -> None:
    rewards = [RewardSpec(name="exact_match", args={"field": "solution"})]
    with pytest.raises(SpecError) as info:
        validate_reward_specs(rewards, columns={"answer"})
    assert info.value.field == "rewards.0.args" and "needs dataset column 'solution'" in info.value.reason
    validate_reward_specs(rewards, columns={"solution"})
    validate_reward_specs(rewards)  # a file or hub dataset: its columns are checked when it loads


def test_the_reward_budget_is_bounded_and_has_a_default() -> None:
    assert RunSpec.model_validate(spec()).reward_timeout_seconds == 10.0
    assert "reward_timeout_seconds" in error_paths(spec(reward_timeout_seconds=0))
