"""OpenAI's grader templates (``{{sample.output_text}}``, ``{{sample.output_json.x}}``,
``{{item.col}}``): what is a reference, which columns they read, how a row renders them, and the
``sample``/``item`` every OpenAI-style grader sees of a row (one definition for all of them)."""

from __future__ import annotations

import pytest

from grpo_core.rewards.grader_rows import grader_rows, template_columns
from grpo_core.rewards.templates import (
    MAX_TEMPLATE_CHARS,
    OUTPUT_TEXT,
    MissingValue,
    check_template,
    item_columns,
    render,
    sample_of,
)


def test_well_formed_references_pass_with_or_without_spaces() -> None:
    text = "Q: {{ item.question }} A: {{sample.output_text}} J: {{sample.output_json.a.0}} {{item.x-y}}"
    assert check_template(text) == text
    plain = "no references at all, { single } braces"
    assert check_template(plain) == plain


@pytest.mark.parametrize(("template", "words"), [
    ("{{answer}}", "is not a reference"),
    ("{{item}}", "is not a reference"),
    ("{{item.a b}}", "is not a reference"),
    ("{{other.answer}}", "is not a reference"),
    ("{{sample.text}}", "'sample.text' is not a sample field"),
    ("{{sample.output_text.0}}", "output_text is text and has no keys"),
])
def test_malformed_references_are_refused_saying_which(template: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check_template(template)


def test_a_template_has_a_size_limit() -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_TEMPLATE_CHARS}"):
        check_template("x" * (MAX_TEMPLATE_CHARS + 1))


def test_item_columns_are_the_first_keys_in_first_seen_order() -> None:
    assert item_columns("{{item.b.c}} {{sample.output_text}} {{item.a}}", "{{item.b}} {{item.prompt}}") == [
        "b", "a", "prompt"]
    # prompt is in every item: a reward declares the other columns only.
    assert template_columns("{{item.prompt}} {{item.answer}}") == ["answer"]


@pytest.mark.parametrize(("text", "parsed"), [
    ('{"answer": 4}', {"answer": 4}),
    ('```json\n{"answer": [1, 2]}\n```', {"answer": [1, 2]}),
    ('  ```\n{"answer": "x"}\n```  ', {"answer": "x"}),
    ("```JSON\n[1, 2]\n```", [1, 2]),
    ("[3]", [3]),
    ("the answer is 4", None),
    ('```json\n{"answer": 4}\n``` and more text', None),
    ("[" * 100_000, None),  # deeper than the parser goes: not JSON, not an error
])
def test_output_json_is_the_answer_parsed_a_fenced_block_accepted(text: str, parsed: object) -> None:
    sample = sample_of(text)
    assert sample["output_text"] == text and sample["output_json"] == parsed
    assert "messages" not in sample


def test_render_reads_nested_keys_and_list_indexes() -> None:
    sample = sample_of('```json\n{"steps": [{"value": 3}, {"value": "x"}], "ok": true}\n```')
    item = {"meta": {"tags": ["a", "b"], "level": 2}, "answer": "42", "prompt": "What?"}
    template = ("{{sample.output_json.steps.0.value}}|{{ sample.output_json.steps.1.value }}|"
                "{{item.meta.tags.1}}|{{item.meta.level}}|{{item.answer}}|{{item.prompt}}")
    assert render(template, sample, item) == "3|x|b|2|42|What?"
    # Anything but a string is inserted as its JSON.
    assert render("{{sample.output_json.ok}} {{item.meta.tags}}", sample, item) == 'true ["a", "b"]'
    assert render(OUTPUT_TEXT, sample_of("plain"), {}) == "plain"


def test_an_inserted_value_is_not_read_as_a_template_again() -> None:
    assert render("{{item.a}}", {}, {"a": "{{item.b}}", "b": "secret"}) == "{{item.b}}"


@pytest.mark.parametrize("template", [
    "{{item.missing}}",
    "{{item.meta.nope}}",
    "{{item.meta.tags.2}}",  # past the list's end
    "{{item.meta.tags.x}}",  # a list has no named keys
    "{{item.answer.0}}",  # a string has no keys
    "{{item.empty}}",  # null: the row lacks the value
    "{{sample.output_json.answer}}",  # the answer is no JSON
])
def test_a_reference_the_row_cannot_fill_is_a_missing_value(template: str) -> None:
    item = {"meta": {"tags": ["a", "b"]}, "answer": "42", "empty": None}
    with pytest.raises(MissingValue):
        render(template, sample_of("not json"), item)


def test_grader_rows_give_every_grader_the_same_sample_and_item() -> None:
    messages = [{"role": "user", "content": "hi"}]
    conversation = [{"role": "assistant", "content": "4"}, {"role": "tool", "content": "ok"}]
    rows = grader_rows(['{"a": 1}', "text"], ["rendered 1", "Q2"], {
        "answer": ["1", "2"], "raw_completions": ["<think>x</think>1", "text"],
        "prompt_messages": [messages, None], "completion_messages": [conversation, None],
        "environment_reward": [None, None]})
    assert rows[0] == {"sample": {"output_text": '{"a": 1}', "output_json": {"a": 1},
                                  "messages": conversation},
                       "item": {"answer": "1", "prompt": messages}}
    assert rows[1] == {"sample": {"output_text": "text", "output_json": None},
                       "item": {"answer": "2", "prompt": "Q2"}}
    # A plain call (no scorer columns at all) works the same.
    assert grader_rows(["x"], ["p"], {}) == [{"sample": {"output_text": "x", "output_json": None},
                                              "item": {"prompt": "p"}}]
