"""OpenAI's graders as rewards: ``string_check``, ``text_similarity`` in OpenAI's form (every metric
against a score worked out by hand), ``multi`` (its formula, its graders, what it needs) and the
converter from an OpenAI grader object to a ``rewards:`` entry."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from reward_helpers import bind_one, fresh_registry, run, spec_error  # noqa: F401 - autouse fixture
from sandbox_guard import needs_sandbox

from grpo_core.errors import SpecError
from grpo_core.rewards import (
    RewardContext,
    RewardDefinition,
    available_rewards,
    bind_rewards,
    check_reward_rows,
    model_sources,
    required_capabilities,
    reward_catalog,
    sandbox_footprints,
    score_completions,
    validate_reward_specs,
)
from grpo_core.rewards.grader_expressions import Unscorable, parse_expression
from grpo_core.rewards.multi_grader import multi_grader
from grpo_core.rewards.sandbox import CAPABILITY
from grpo_core.rewards.string_check import StringCheckArgs
from grpo_core.spec.openai_graders import openai_grader_names, rewards_from_openai_grader
from grpo_core.spec.run_spec import RewardSpec

HYP, REF = "the cat is on the mat", "the cat sat on the mat"


def similarity_error(**args: Any) -> SpecError:
    return spec_error([RewardSpec(name="text_similarity", args=args)])


def similarity(metric: str, texts: list[str], references: list[str], **args: Any) -> list[float | None]:
    reward = bind_one("text_similarity", reference="{{item.ref}}", evaluation_metric=metric, **args)
    return run(reward, texts, ref=references)


# --- string_check ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("operation", "expected"), [
    ("eq", [1.0, 0.0, 0.0, 0.0, 0.0]),
    ("ne", [0.0, 1.0, 1.0, 1.0, 1.0]),
    ("like", [1.0, 1.0, 0.0, 0.0, 0.0]),
    ("ilike", [1.0, 1.0, 1.0, 1.0, 0.0]),
])
def test_string_check_operations(operation: str, expected: list[float]) -> None:
    reward = bind_one("string_check", reference="{{item.answer}}", operation=operation)
    texts = ["Paris", "It is Paris.", "PARIS", "it's paris", "Lyon"]
    assert run(reward, texts, answer=["Paris"] * 5) == expected


def test_string_check_ignores_case_by_casefolding() -> None:
    reward = bind_one("string_check", reference="{{item.answer}}", operation="ilike")
    assert run(reward, ["GROSSE STRASSE 3", "grosse strasse"], answer=["straße", "Straße 3"]) == [1.0, 0.0]


def test_string_check_renders_both_templates_and_leaves_rows_it_cannot_render_unscored() -> None:
    reward = bind_one("string_check", input="{{sample.output_json.city}}, {{item.country}}",
                      reference="{{item.gold.0}}", operation="eq")
    assert reward.columns == ["country", "gold"]
    texts = ['{"city": "Paris"}', '```json\n{"city": "Lyon"}\n```', "Paris", '{"town": "Paris"}',
             '{"city": "Paris"}']
    scores = run(reward, texts, country=["France"] * 5,
                 gold=[["Paris, France"], ["Paris, France"], ["Paris, France"], ["Paris, France"], None])
    assert scores == [1.0, 0.0, None, None, None]


def test_string_check_reads_the_prompt_as_every_item_has_it() -> None:
    reward = bind_one("string_check", reference="{{item.prompt}}", operation="like")
    assert reward.columns == []  # prompt is always in the item: nothing to declare
    assert reward.fn(["say: hi there", "no"], ["hi", "hi"]) == [1.0, 0.0]
    messages = [[{"role": "user", "content": "hi"}], None]
    chat = bind_one("string_check", input="{{item.prompt.0.content}}", reference="hi", operation="eq")
    # A text prompt has no messages to index: that row cannot be rendered.
    assert chat.fn(["x", "y"], ["rendered", "hi"], prompt_messages=messages) == [1.0, None]


def test_string_check_args_are_openais_and_errors_name_their_field() -> None:
    assert StringCheckArgs(reference="x", operation="eq").input == "{{sample.output_text}}"
    error = spec_error([RewardSpec(name="string_check", args={"reference": "x", "operation": "in"})])
    assert error.field == "rewards.0.args.operation"
    error = spec_error([RewardSpec(name="string_check", args={"reference": "{{answer}}", "operation": "eq"})])
    assert error.field == "rewards.0.args.reference" and "not a reference" in error.reason
    error = spec_error([RewardSpec(name="string_check", args={"operation": "eq"})])
    assert error.field == "rewards.0.args.reference"
    gold = RewardSpec(name="string_check", args={"reference": "{{item.gold}}", "operation": "eq"})
    error = spec_error([gold], {"answer"})
    assert error.field == "rewards.0.args" and "'gold'" in error.reason


# --- text_similarity, OpenAI's form ---------------------------------------------------------------

def test_fuzzy_match_is_the_normalized_indel_similarity() -> None:
    # kitten -> sitting: longest common subsequence "ittn" (4), Indel distance 6 + 7 - 2 * 4 = 5.
    assert similarity("fuzzy_match", ["kitten"], ["sitting"]) == [pytest.approx(1 - 5 / 13)]


def test_bleu_by_hand() -> None:
    # One word more than the reference: n-gram precisions 6/7, 5/6, 4/5, 3/4, no brevity penalty.
    longer = similarity("bleu", ["the cat sat on the mat today"], ["the cat sat on the mat"])
    assert longer == [pytest.approx((6 / 7 * 5 / 6 * 4 / 5 * 3 / 4) ** 0.25)]
    # One word fewer: every precision 1, brevity penalty exp(1 - 7/6).
    shorter = similarity("bleu", ["the cat sat on the mat"], ["the cat sat on the mat today"])
    assert shorter == [pytest.approx(math.exp(1 - 7 / 6))]


def test_gleu_by_hand() -> None:
    # 1- to 4-grams: 22 in the text, 18 in the reference, 18 shared: min(18/22, 18/18).
    assert similarity("gleu", ["the cat sat on the mat today"], ["the cat sat on the mat"]) == [
        pytest.approx(18 / 22)]


def test_meteor_matches_words_and_stems_but_no_synonyms() -> None:
    six = "the cat sat on the mat"
    # All 6 words matched in one chunk: F-mean 1, fragmentation penalty 0.5 * (1/6)^3.
    exact, disjoint, stems, synonyms = similarity(
        "meteor", [six, "dogs bark loudly", "the cats sat", "big dog"],
        [six, "the cat sat", "the cat sat", "large dog"])
    assert exact == pytest.approx(1 - 0.5 / 6**3) and exact > 0.99
    assert disjoint == 0.0
    assert stems == pytest.approx(1 - 0.5 / 3**3)  # "cats" meets "cat" at the stem stage
    # "big" is not matched to "large" (no WordNet here): 1 of 2 words, one chunk.
    precision = recall = 1 / 2
    fmean = precision * recall / (0.9 * precision + 0.1 * recall)
    assert synonyms == pytest.approx((1 - 0.5 * 1.0**3) * fmean)


@pytest.mark.parametrize(("metric", "expected"), [
    ("rouge_1", 5 / 6),  # the x2, cat, on, mat of 6 words each side
    ("rouge_2", 3 / 5),  # "the cat", "on the", "the mat" of 5 bigrams each side
    ("rouge_3", 1 / 4),  # "on the mat" of 4 trigrams each side
    ("rouge_4", 0.0),
    ("rouge_5", 0.0),
    ("rouge_l", 5 / 6),  # longest common subsequence "the cat on the mat"
])
def test_rouge_f1_by_hand(metric: str, expected: float) -> None:
    assert similarity(metric, [HYP], [REF]) == [pytest.approx(expected)]


@pytest.mark.parametrize("metric", ["fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_3", "rouge_l"])
def test_every_metric_scores_in_unit_range_and_skips_rows_without_a_reference(metric: str) -> None:
    scores = similarity(metric, [REF, HYP, "", "x", "y"], [REF, REF, REF, "", None])
    assert scores[0] == pytest.approx(1.0, abs=0.01) and scores[4] is None
    assert all(0.0 <= score <= 1.0 for score in scores[:4])


def test_input_is_a_template_too() -> None:
    reward = bind_one("text_similarity", input="{{sample.output_json.answer}}", reference="{{item.ref}}",
                      evaluation_metric="fuzzy_match")
    assert reward.columns == ["ref"]
    scores = run(reward, ['{"answer": "kitten"}', "kitten"], ref=["sitting"] * 2)
    assert scores == [pytest.approx(8 / 13), None]


def test_the_column_form_still_works_and_mixing_the_forms_is_refused() -> None:
    legacy = bind_one("text_similarity", reference_field="ref", metric="fuzzy_ratio")
    assert legacy.columns == ["ref"]
    assert run(legacy, ["kitten"], ref=[["sitting", "kitten"]]) == [1.0]
    error = similarity_error(metric="bleu", reference="{{item.a}}", evaluation_metric="bleu")
    assert error.field == "rewards.0.args.reference"
    assert "'metric'" in error.reason and "one form" in error.reason
    error = similarity_error(reference_field="a", evaluation_metric="bleu")
    assert "'reference_field'" in error.reason and "'evaluation_metric'" in error.reason
    assert similarity_error(input="{{sample.output_text}}").field == "rewards.0.args.reference"
    assert similarity_error(reference="x").field == "rewards.0.args.evaluation_metric"
    error = similarity_error(reference="x", evaluation_metric="rouge_9")
    assert error.field == "rewards.0.args.evaluation_metric"


def test_cosine_needs_an_embedding_model_and_declares_it() -> None:
    error = similarity_error(reference="x", evaluation_metric="cosine")
    assert error.field == "rewards.0.args.embedding_model" and "embedding_model" in error.reason
    error = similarity_error(reference="x", evaluation_metric="bleu", embedding_model="path:e")
    assert error.field == "rewards.0.args.embedding_model"
    error = similarity_error(reference="x", evaluation_metric="cosine", embedding_model="s3:bucket/model")
    assert error.field == "rewards.0.args.embedding_model"
    spec = RewardSpec(name="text_similarity", args={"reference": "x", "evaluation_metric": "cosine",
                                                    "embedding_model": "path:embedder"})
    assert model_sources([spec]) == [("rewards.0.args.embedding_model", "path:embedder")]
    # Another job's model, as model.source takes it (the service resolves it), with its syntax.
    error = similarity_error(reference="x", evaluation_metric="cosine", embedding_model="job:7@")
    assert error.field == "rewards.0.args.embedding_model" and "job:ID@STEP" in error.reason
    spec = RewardSpec(name="text_similarity", args={"reference": "x", "evaluation_metric": "cosine",
                                                    "embedding_model": "job:7@40"})
    assert model_sources([spec]) == [("rewards.0.args.embedding_model", "job:7@40")]


@pytest.fixture(scope="module")
def embedder_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_core.io.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    build_tiny_model(root / "embedder", family="llama", hidden_size=32, num_layers=1, seed=3)
    return root


def mean_pooled(folder: Path, text: str) -> Any:
    """The text alone through a fresh copy of the model: its last hidden states' mean."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    model, tokenizer = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].mean(dim=0)


def test_cosine_is_the_clipped_cosine_of_mean_pooled_embeddings(embedder_root: Path) -> None:
    import torch

    reward = bind_one("text_similarity", RewardContext(models_root=embedder_root), reference="{{item.ref}}",
                      evaluation_metric="cosine", embedding_model="path:embedder")
    texts = ["What is 2+3? The answer is 5.", "hello world", "one two three four five six seven", "cat"]
    refs = ["The answer is 5.", "hello world", "dog", "nine ten"]
    scores = run(reward, texts, ref=refs)
    # Batched and right-padded, every text embeds as it would alone.
    folder = embedder_root / "embedder"
    expected = [max(0.0, torch.nn.functional.cosine_similarity(
        mean_pooled(folder, text), mean_pooled(folder, ref), dim=0).item())
        for text, ref in zip(texts, refs, strict=True)]
    assert scores == pytest.approx(expected, abs=1e-4)
    assert scores[1] == pytest.approx(1.0) and all(0.0 <= s <= 1.0 for s in scores)
    assert run(reward, ["x", "y"], ref=[None, "y"]) == [None, pytest.approx(1.0)]


# --- multi: the formula ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("a + b ^ 2", 0.5 + 0.25**2),  # ^ binds tighter than +, as in mathematics
    ("a + b ** 2", 0.5 + 0.25**2),
    ("-a ^ 2", -(0.5**2)),
    ("2 ^ 3 ^ 2", 2.0**9),  # right to left
    ("(a + b) / 2", 0.375),
    ("0.7 * a + 0.3 * b - 1", 0.7 * 0.5 + 0.3 * 0.25 - 1),
    ("min(a, b, 1) + max(a) + abs(-b)", 0.25 + 0.5 + 0.25),
    ("floor(a * 3) + ceil(b) + sqrt(b) + exp(0) + log(exp(2)) + log(8, 2)", 1 + 1 + 0.5 + 1 + 2 + 3),
    ("1e-3 * +a", 0.0005),
])
def test_calculate_output_is_arithmetic_over_the_graders(text: str, expected: float) -> None:
    assert parse_expression(text, {"a", "b"}).value({"a": 0.5, "b": 0.25}) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "offending"), [
    ("a.real", "'a.real'"),
    ("a[0]", "'a[0]'"),
    ("__import__('os').system('true')", "'__import__('os').system'"),
    ("__import__('os')", "'__import__'"),
    ("a.__class__", "'a.__class__'"),
    ("round(a)", "'round'"),
    ("c + a", "'c'"),
    ("'1' + a", "'1'"),
    ("a if b else 1", "'a if b else 1'"),
    ("a < b", "'a < b'"),
    ("a and b", "'a and b'"),
    ("a & b", "'a & b'"),
    ("a // b", "'a // b'"),
    ("min", "'min'"),
    ("max(a, key=b)", "'max(a, key=b)'"),
    ("[a, b]", "'[a, b]'"),
    ("lambda: a", "'lambda: a'"),
    ("True + a", "'True'"),
])
def test_anything_but_arithmetic_is_refused_naming_the_text(text: str, offending: str) -> None:
    with pytest.raises(ValueError, match="calculate_output") as info:
        parse_expression(text, {"a", "b"})
    assert offending in str(info.value)


@pytest.mark.parametrize("text", ["(a", "a +", "", "sqrt(a, b)", "a\n+ b", "(" * 300 + "a" + ")" * 300,
                                  " + ".join(["a"] * 200)])
def test_malformed_or_oversized_formulas_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="calculate_output"):
        parse_expression(text, {"a", "b"})


@pytest.mark.parametrize("text", ["a / b", "sqrt(a - 1)", "log(b)", "(a - 1) ^ 0.5", "exp(2000 * a)",
                                  "10 ^ 400"])
def test_arithmetic_without_a_real_value_leaves_the_row_unscorable(text: str) -> None:
    with pytest.raises(Unscorable):
        parse_expression(text, {"a", "b"}).value({"a": 0.5, "b": 0.0})


# --- multi: the reward ----------------------------------------------------------------------------

CHECK = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
         "reference": "{{item.answer}}", "operation": "eq", "pass_threshold": 1.0}
ROUGE = {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
         "reference": "{{item.answer}}", "evaluation_metric": "rouge_1"}


def multi(graders: dict[str, Any], formula: str) -> RewardSpec:
    return RewardSpec(name="multi", args={"graders": graders, "calculate_output": formula})


def test_multi_combines_its_graders_by_the_formula() -> None:
    [reward] = bind_rewards([multi({"exact": CHECK, "close": ROUGE}, "0.5 * exact + 0.5 * close ^ 2")],
                            RewardContext(), {"answer"})
    assert reward.columns == ["answer"]
    scores = run(reward, ["the cat sat", "the cat", "dog"], answer=["the cat sat", "the cat sat", None])
    assert list(scores) == [1.0, pytest.approx(0.5 * 0.8**2), None]  # rouge_1 of 2 of 3 words: F1 0.8
    assert scores.unscored == 0  # a row the graders do not apply to is not a failure


def test_a_formula_without_a_value_leaves_the_row_unscored_saying_why() -> None:
    [reward] = bind_rewards([multi({"exact": CHECK, "close": ROUGE}, "close / exact")], RewardContext())
    scores = run(reward, ["the cat sat", "the cat"], answer=["the cat sat"] * 2)
    assert list(scores) == [1.0, None]
    assert scores.unscored == 1 and "divides by zero" in scores.problems[1]


def test_graders_the_formula_does_not_read_are_checked_but_not_run() -> None:
    unused = {**ROUGE, "reference": "{{item.other}}"}
    [reward] = bind_rewards([multi({"exact": CHECK, "unused": unused}, "exact")], RewardContext())
    assert reward.columns == ["answer"]  # the unused grader's column is not needed
    assert run(reward, ["a"], answer=["a"]) == [1.0]
    error = spec_error([multi({"exact": CHECK, "unused": {**ROUGE, "evaluation_metric": "nope"}}, "exact")])
    assert error.field == "rewards.0.args.graders.unused.evaluation_metric"


@pytest.mark.parametrize(("graders", "formula", "field", "words"), [
    ({"a": {**CHECK, "operation": "contains"}}, "a", "graders.a.operation", "'eq'"),
    ({"a": {**CHECK, "surprise": 1}}, "a", "graders.a.surprise", "Extra inputs"),
    ({"a": {"type": "multi", "graders": {"b": CHECK}, "calculate_output": "b"}}, "a", "graders.a.type",
     "cannot be multi"),
    ({"a": {"type": "regex_match", "pattern": "x"}}, "a", "graders.a.type", "unknown grader type"),
    ({"a": {"operation": "eq"}}, "a", "graders.a.type", "needs a 'type'"),
    ({"a": "string_check"}, "a", "graders.a", "dictionary"),
    ({"my-grader": CHECK}, "a", "graders.my-grader", "not a name"),
    ({"sqrt": CHECK}, "sqrt", "graders.sqrt", "function"),
    ({"a": CHECK}, "a.real", "calculate_output", "'a.real'"),
    ({"a": CHECK}, "b * 2", "calculate_output", "'b' is not one of the graders"),
    ({}, "1", "graders", "at least 1"),
    ({f"g{i}": CHECK for i in range(17)}, "g0", "graders", "at most 16"),
])
def test_a_bad_multi_names_the_field_inside_it(graders: dict, formula: str, field: str, words: str) -> None:
    error = spec_error([multi(graders, formula)])
    assert error.field == f"rewards.0.args.{field}" and words in error.reason, error


def test_multi_is_in_the_catalog_with_string_check() -> None:
    catalog = {reward["name"]: reward for reward in reward_catalog()}
    assert catalog["multi"]["builtin"] and catalog["string_check"]["builtin"]
    assert catalog["multi"]["args_schema"]["required"] == ["graders", "calculate_output"]
    operation = catalog["string_check"]["args_schema"]["properties"]["operation"]
    assert operation["enum"] == ["eq", "ne", "like", "ilike"]
    metric = catalog["text_similarity"]["args_schema"]["properties"]["evaluation_metric"]["anyOf"][0]
    assert metric["enum"][-1] == "cosine" and "gleu" in metric["enum"]


def _fake(name: str, **parts: Any) -> RewardDefinition:
    from pydantic import BaseModel, ConfigDict

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        column: str = "answer"

    def build(args: Any, context: RewardContext) -> Any:
        return lambda completions, prompts, **columns: [0.5] * len(completions)

    return RewardDefinition(name, f"{name}, for tests", Args, build, **parts)


def test_what_multi_needs_is_what_its_graders_need() -> None:
    seen: list[str] = []

    def check_rows(args: Any, rows: list[dict[str, Any]]) -> None:
        seen.append(args.column)
        if any(row.get(args.column) == "bad" for row in rows):
            raise ValueError(f"row has a bad {args.column}")

    fakes = {
        "string_check": _fake("string_check", required_columns=lambda args: [args.column],
                              capabilities=frozenset({"gpu_judge"}), sandbox_bytes=lambda args: 100,
                              model_sources=lambda args: {"model": "path:judge"}, check_rows=check_rows),
        "python": _fake("python", required_columns=lambda args: [args.column, "answer"],
                        capabilities=frozenset({CAPABILITY}), sandbox_bytes=lambda args: 20),
    }
    definition = multi_grader(fakes.get)
    args = definition.args_model.model_validate({"graders": {
        "a": {"type": "string_check", "column": "x"}, "b": {"type": "python", "column": "y"},
        "c": {"type": "python", "column": "z"}}, "calculate_output": "a + b"})
    assert definition.required_columns(args) == ["x", "y", "answer"]  # c is not read: not needed
    assert definition.capabilities_of(args) == {"gpu_judge", CAPABILITY}
    assert definition.sandbox_bytes(args) == 120  # run at once: held at once
    assert definition.model_sources(args) == {"graders.a.model": "path:judge"}
    definition.check_rows(args, [{"x": "fine"}])
    with pytest.raises(ValueError, match="graders.a: row has a bad x"):
        definition.check_rows(args, [{"x": "bad"}])
    with pytest.raises(Exception, match="no 'label_model' reward is registered here"):
        definition.args_model.model_validate({"graders": {"a": {"type": "label_model"}},
                                              "calculate_output": "a"})
    assert seen == ["x", "x"]


def test_the_registry_reports_multis_needs() -> None:
    plain = multi({"exact": CHECK}, "exact")
    python = {"type": "python", "source": "def grade(s, i):\n    return 1.0\n", "image_tag": "2025-05-08",
              "memory_mb": 128}
    sandboxed = multi({"exact": CHECK, "py": python}, "exact * py")
    assert required_capabilities([plain, sandboxed]) == [(1, CAPABILITY)]
    assert [index for index, _ in sandbox_footprints([plain, sandboxed])] == [1]
    validate_reward_specs([plain, sandboxed], {"answer"})
    check_reward_rows([plain, sandboxed], [{"prompt": "p", "answer": "a"}])


@needs_sandbox
def test_a_python_grader_inside_multi_runs_in_the_sandbox() -> None:
    source = ("def grade(sample, item):\n"
              "    if sample['output_text'] == 'boom':\n"
              "        raise ValueError('no grade for boom')\n"
              "    return 1.0 if sample['output_json'] == {'answer': item['answer']} else 0.25\n")
    graders = {"py": {"type": "python", "name": "json answer", "source": source, "image_tag": "2025-05-08"},
               "fmt": {"type": "string_check", "reference": "answer", "operation": "like"}}
    spec = multi(graders, "py ^ 2 * (0.5 + 0.5 * fmt)")
    bound = bind_rewards([spec], RewardContext(timeout_seconds=20), {"answer"})
    texts = ['{"answer": "4"}', '{"answer": "5"}', "4", "boom"]
    result = score_completions(bound, texts, ["q"] * 4, {"answer": ["4"] * 4})
    assert [row[0] for row in result.matrix[:3]] == [1.0, pytest.approx(0.0625), pytest.approx(0.0625 * 0.5)]
    assert math.isnan(result.matrix[3][0])
    assert result.unscored == {"multi": 1}
    assert "grader 'py'" in result.problems["multi"][3] and "no grade for boom" in result.problems["multi"][3]


# --- the converter --------------------------------------------------------------------------------

def test_the_converter_accepts_every_openai_type_and_each_is_a_reward() -> None:
    assert openai_grader_names() == ["string_check", "text_similarity", "python", "score_model",
                                     "label_model", "multi"]
    assert set(openai_grader_names()) <= set(available_rewards())


@pytest.mark.parametrize(("grader", "expected"), [
    (CHECK, {"name": "string_check", "args": {"input": "{{sample.output_text}}",
                                              "reference": "{{item.answer}}", "operation": "eq"}}),
    (ROUGE, {"name": "text_similarity", "args": {"input": "{{sample.output_text}}",
                                                 "reference": "{{item.answer}}",
                                                 "evaluation_metric": "rouge_1"}}),
    ({"type": "python", "name": "p", "source": "def grade(s, i): return 1", "image_tag": "2025-05-08",
      "pass_threshold": 0.5},
     {"name": "python", "args": {"source": "def grade(s, i): return 1"}}),
    ({"type": "score_model", "name": "judge", "model": "path:j", "input": [{"role": "user", "content": "x"}],
      "range": [0, 1]},
     {"name": "score_model", "args": {"model": "path:j", "input": [{"role": "user", "content": "x"}],
                                      "range": [0, 1]}}),
    ({"type": "label_model", "name": "l", "model": "path:j", "input": [], "labels": ["a", "b"],
      "passing_labels": ["a"]},
     {"name": "label_model", "args": {"model": "path:j", "input": [], "labels": ["a", "b"],
                                      "passing_labels": ["a"]}}),
    ({"type": "multi", "name": "m", "graders": {"a": CHECK}, "calculate_output": "a"},
     {"name": "multi", "args": {"graders": {"a": CHECK}, "calculate_output": "a"}}),
])
def test_a_grader_becomes_one_reward_of_its_type_with_its_fields(grader: dict, expected: dict) -> None:
    assert rewards_from_openai_grader(grader) == [expected]


def test_converted_graders_validate_as_rewards_and_the_callers_object_stays_its_own() -> None:
    grader = {"type": "multi", "name": "m", "graders": {"exact": CHECK, "close": ROUGE},
              "calculate_output": "exact * close"}
    rewards = rewards_from_openai_grader(grader)
    validate_reward_specs([RewardSpec(**reward) for reward in rewards], {"answer"})
    rewards[0]["args"]["graders"]["exact"]["operation"] = "ne"
    assert grader["graders"]["exact"]["operation"] == "eq"


@pytest.mark.parametrize(("grader", "field", "words"), [
    ([CHECK], "", "must be an object"),
    ("string_check", "", "must be an object"),
    ({"name": "x"}, "type", "needs a 'type'"),
    ({"type": "regex"}, "type", "unknown grader type 'regex'"),
    ({"type": 3}, "type", "unknown grader type 3"),
    ({"type": "multi", "graders": [CHECK], "calculate_output": "a"}, "graders", "object of named graders"),
    ({"type": "multi", "graders": {}, "calculate_output": "a"}, "graders", "at least one"),
    ({"type": "multi", "graders": {"a": "x"}}, "graders.a", "must be an object"),
    ({"type": "multi", "graders": {"a": {"type": "nope"}}}, "graders.a.type", "unknown grader type"),
    ({"type": "multi", "graders": {"a": {"type": "multi", "graders": {}}}}, "graders.a.type",
     "cannot be multi"),
])
def test_what_is_no_grader_object_is_refused_with_its_path(grader: Any, field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        rewards_from_openai_grader(grader)
    assert info.value.field == field and words in info.value.reason
