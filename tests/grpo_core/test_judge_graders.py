"""score_model and label_model with tiny random-init judges built locally: their scores are what
transformers' own greedy ``generate`` answers to the same templated messages, read by the
documented rules; the rules themselves on hand-written answers; bad args named by field; the judge
loaded once, frozen, decoding as the grader asks whatever the folder suggests, within the budget,
leaving the training's random streams alone."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from reward_helpers import fresh_registry, spec_error  # noqa: F401 - autouse fixture
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.errors import SourceUnavailable, SpecError
from grpo_core.io.tiny_models import build_tiny_model
from grpo_core.rewards import (
    RewardContext,
    bind_rewards,
    model_sources,
    score_completions,
    validate_reward_specs,
)
from grpo_core.rewards.judge_scoring import parse_label, parse_score
from grpo_core.spec.run_spec import RewardSpec

PROMPTS = ["What is 2+3?", "Is it good?", "hello world", "Think about the number seven.", "one",
           "What is 4+4?"]
ANSWERS = ["The answer is 5.", "yes", "no no", "7", "two three", "8"]
REFERENCES = ["5", "yes", "maybe", "7", "2", "8"]
SYSTEM = "Grade the answer. Reply with a number from 0 to 10."
USER = "Question: {{item.prompt}}\nAnswer: {{ sample.output_text }}\nReference: {{item.answer}}"
INPUT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def models_root(tiny_model_factory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny llama and qwen2 causal LMs (conftest), and beside them a classifier and a
    judge whose tokenizer has no chat template, all under one root."""
    for family in ("llama", "qwen2"):
        tiny_model_factory(family)
    own = tmp_path_factory.mktemp("judges")
    build_tiny_model(own / "classifier", family="llama", num_labels=1)
    plain = own / "plain"
    shutil.copytree(tiny_model_factory("llama"), plain)
    (plain / "chat_template.jinja").unlink()
    return tmp_path_factory.getbasetemp()


def judge_source(models_root: Path, tiny_model_factory, family: str) -> str:
    return f"path:{tiny_model_factory(family).relative_to(models_root)}"


def render(template: str, prompt: str, answer: str, reference: str) -> str:
    """The test's templates rendered by hand."""
    return (template.replace("{{item.prompt}}", prompt).replace("{{ sample.output_text }}", answer)
            .replace("{{item.answer}}", reference))


def reference_answers(folder: Path, conversations: list[list[dict[str, str]]],
                      max_new_tokens: int = MAX_TOKENS) -> list[str]:
    """Each conversation alone through a fresh copy of the judge and transformers' greedy generate."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    answers = []
    with torch.no_grad():
        for conversation in conversations:
            text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
            out = model.generate(**ids, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
            answers.append(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return answers


def conversations(prompts: list[str] = PROMPTS, answers: list[str] = ANSWERS,
                  system_role: str = "system") -> list[list[dict[str, str]]]:
    return [[{"role": system_role, "content": SYSTEM}, {"role": "user", "content": render(USER, p, a, r)}]
            for p, a, r in zip(prompts, answers, REFERENCES, strict=True)]


# The documented reading, written out by hand for the reference: a random judge writes no JSON
# object (a stray brace, at most), so the rules for text apply.
def no_json_object(answer: str) -> bool:
    decoder = json.JSONDecoder()
    for start in (i for i, char in enumerate(answer) if char == "{"):
        try:
            decoder.raw_decode(answer, start)
            return False
        except ValueError:
            continue
    return True


def expected_score(answer: str, low: float, high: float) -> float | None:
    assert no_json_object(answer)
    numbers = re.findall(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", answer)
    score = float(numbers[-1]) if numbers else None
    return score if score is not None and low <= score <= high else None


def expected_label(answer: str, labels: list[str]) -> str | None:
    assert no_json_object(answer)
    bare = answer.strip(" \t\r\n\"'`.,;:!?()[]{}<>*_\u2018\u2019\u201c\u201d").lower()
    if bare in labels:
        return bare
    places = [(m.start(), -len(label), label) for label in labels
              if (m := re.search(rf"(?<!\w){re.escape(label)}(?!\w)", answer, re.IGNORECASE))]
    return min(places)[2] if places else None


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def bind(models_root: Path, name: str, context: dict[str, Any] | None = None, **args: Any):
    return bind_rewards([RewardSpec(name=name, args=args)],
                        RewardContext(models_root=models_root, **(context or {})))[0].fn


@pytest.mark.parametrize(("family", "batch_size"), [("llama", 4), ("qwen2", 1), ("qwen2", 16)])
def test_scores_are_greedy_generates_answers_read_as_documented(models_root: Path, tiny_model_factory,
                                                                family: str, batch_size: int):
    judge = bind(models_root, "score_model", model=judge_source(models_root, tiny_model_factory, family),
                 input=INPUT, range=[-100, 100], batch_size=batch_size,
                 sampling_params={"temperature": 0, "max_completions_tokens": MAX_TOKENS})
    scores = judge(ANSWERS, PROMPTS, answer=REFERENCES)
    answers = reference_answers(tiny_model_factory(family), conversations())
    expected = [expected_score(answer, -100, 100) for answer in answers]
    assert list(scores) == expected
    assert any(score is not None for score in expected)  # the judge's answers hold numbers
    assert sorted(scores.problems) == [i for i, score in enumerate(expected) if score is None]
    assert scores.unscored == len(scores.problems)


def test_labels_are_greedy_generates_answers_read_as_documented(models_root: Path, tiny_model_factory):
    # label_model has no sampling_params (as OpenAI's): greedy, 64 tokens.
    answers = reference_answers(tiny_model_factory("llama"), conversations(), max_new_tokens=64)
    labels = ["yes", "of", "firs", "equalssubtract", "then"]  # words the tiny judge writes
    judge = bind(models_root, "label_model", model=judge_source(models_root, tiny_model_factory, "llama"),
                 input=INPUT, labels=labels, passing_labels=["yes", "then"], batch_size=4)
    found = [expected_label(answer, labels) for answer in answers]
    expected = [None if label is None else float(label in ("yes", "then")) for label in found]
    assert list(judge(ANSWERS, PROMPTS, answer=REFERENCES)) == expected
    assert None in expected and 1.0 in expected and 0.0 in expected, answers


def test_developer_messages_are_system_messages(models_root: Path, tiny_model_factory):
    source = judge_source(models_root, tiny_model_factory, "qwen2")
    developer = [{"role": "developer", "content": SYSTEM}, INPUT[1]]
    scores = bind(models_root, "score_model", model=source, input=developer, range=[-100, 100],
                  sampling_params={"max_completions_tokens": MAX_TOKENS})(ANSWERS, PROMPTS, answer=REFERENCES)
    answers = reference_answers(tiny_model_factory("qwen2"), conversations())
    assert list(scores) == [expected_score(answer, -100, 100) for answer in answers]


def test_the_folders_suggested_decoding_is_not_used(models_root: Path, tiny_model_factory):
    """A generation_config.json asking for sampling, top-k, a penalty and beams changes nothing:
    the judge decodes as the grader says (greedy here), with the folder's token ids."""
    folder = models_root / "suggests"
    if not folder.exists():
        shutil.copytree(tiny_model_factory("qwen2"), folder)
        config = json.loads((folder / "generation_config.json").read_text())
        config.update(do_sample=True, temperature=0.3, top_k=2, repetition_penalty=3.0, num_beams=3)
        (folder / "generation_config.json").write_text(json.dumps(config))
    scores = bind(models_root, "score_model", model="path:suggests", input=INPUT, range=[-100, 100],
                  sampling_params={"max_completions_tokens": MAX_TOKENS})(ANSWERS, PROMPTS, answer=REFERENCES)
    answers = reference_answers(tiny_model_factory("qwen2"), conversations())
    assert list(scores) == [expected_score(answer, -100, 100) for answer in answers]


def test_identical_inputs_are_generated_once_when_greedy(models_root: Path, tiny_model_factory):
    judge = bind(models_root, "score_model", model=judge_source(models_root, tiny_model_factory, "llama"),
                 input=INPUT, range=[-100, 100], sampling_params={"max_completions_tokens": 4})
    generated: list[int] = []
    original = judge.generate
    judge.generate = lambda batch, deadline=None: generated.append(len(batch)) or original(batch, deadline)
    scores = judge(["7", "7", "8", "7"], ["q"] * 4, answer=["7"] * 4)
    assert sum(generated) == 2
    assert scores[0] == scores[1] == scores[3]


def test_loaded_once_frozen_on_the_jobs_dtype(models_root: Path, tiny_model_factory,
                                              monkeypatch: pytest.MonkeyPatch):
    loads = []
    original = AutoModelForCausalLM.from_pretrained

    def counting(*args, **kwargs):
        loads.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counting)
    judge = bind(models_root, "label_model", {"dtype": "bfloat16"},
                 model=judge_source(models_root, tiny_model_factory, "llama"), input=INPUT,
                 labels=["yes", "no"], passing_labels=["yes"])
    first, second = judge(ANSWERS, PROMPTS, answer=REFERENCES), judge(ANSWERS, PROMPTS, answer=REFERENCES)
    assert len(loads) == 1 and first == second
    assert not judge.model.training and all(not p.requires_grad for p in judge.model.parameters())
    assert next(judge.model.parameters()).dtype == torch.bfloat16


def test_sampling_is_seeded_and_leaves_the_trainings_random_streams(models_root: Path, tiny_model_factory):
    judge = bind(models_root, "score_model", model=judge_source(models_root, tiny_model_factory, "qwen2"),
                 input=INPUT, range=[-100, 100],
                 sampling_params={"temperature": 1.0, "top_p": 0.9, "seed": 7, "max_completions_tokens": 8})
    assert judge.generation.do_sample and judge.generation.top_k == 0
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = judge(ANSWERS, PROMPTS, answer=REFERENCES)
    assert torch.equal(torch.get_rng_state(), state)
    assert judge(ANSWERS, PROMPTS, answer=REFERENCES) == first


def test_rows_past_the_budget_are_not_reached(models_root: Path, tiny_model_factory):
    judge = bind(models_root, "score_model", {"timeout_seconds": 2.0},
                 model=judge_source(models_root, tiny_model_factory, "llama"), input=INPUT)
    assert judge.budget_seconds == RewardContext(timeout_seconds=2.0).own_budget_seconds() == 1.0
    judge.budget_seconds = 0.0  # spent before the first batch
    scores = judge(ANSWERS, PROMPTS, answer=REFERENCES)
    assert list(scores) == [None] * len(ANSWERS)
    assert all("not reached" in problem for problem in scores.problems.values())
    # A batch under way when the budget runs out stops; its unfinished answers are not read.
    judge.decoding = dataclasses.replace(judge.decoding, max_tokens=50)
    judge.generation.max_new_tokens = 50
    ids = judge.encode([{"role": "user", "content": "hello"}])
    assert judge.generate([ids, ids], deadline=time.monotonic()) == [None, None]


def test_rows_a_template_cannot_be_written_for_are_unscored(models_root: Path, tiny_model_factory):
    judge = bind(models_root, "score_model", model=judge_source(models_root, tiny_model_factory, "llama"),
                 input=[user("Verdict {{sample.output_json.verdict}} of {{item.prompt}}")],
                 range=[-100, 100], sampling_params={"max_completions_tokens": 4})
    scores = judge(['{"verdict": "ok"}', "not json", '{"other": 1}'], ["a", "b", "c"])
    assert scores[1] is None and scores[2] is None
    assert "sample.output_json.verdict" in scores.problems[1] and 2 in scores.problems
    assert "cannot be written" not in scores.problems.get(0, "")


def test_unscored_rows_reach_the_steps_warning_with_why(models_root: Path, tiny_model_factory):
    source = judge_source(models_root, tiny_model_factory, "llama")
    spec = RewardSpec(name="score_model", args={"model": source, "input": INPUT, "range": [-100, 100],
                                                "sampling_params": {"max_completions_tokens": MAX_TOKENS}})
    bound = bind_rewards([spec], RewardContext(models_root=models_root), columns={"answer"})
    assert bound[0].columns == ["answer"]  # item.prompt is every row's; item.answer is a column
    scores = score_completions(bound, ANSWERS, PROMPTS, {"answer": REFERENCES})
    unscored = [i for i, row in enumerate(scores.matrix) if math.isnan(row[0])]
    assert unscored and scores.unscored["score_model"] == len(unscored)
    assert "holds no score" in scores.failures["score_model"].error


# The reading of answers, on hand-written ones.

@pytest.mark.parametrize(("answer", "low", "high", "score"), [
    ('{"steps": [{"description": "checks 2 things", "conclusion": "3 ok"}], "result": 0.8}', 0, 1, 0.8),
    ('```json\n{"score": 7}\n```', 0, 10, 7.0),
    ('{"result": 0.4, "score": 0.9}', 0, 1, 0.4),
    ('Reasoning: 9 of 10 steps hold.\n{"result": 0.25}', 0, 1, 0.25),
    ('{"result": "high"} so 0.3', 0, 1, 0.3),
    ('{"result": true} 1', 0, 1, 1.0),
    ("0.75", 0, 1, 0.75),
    ("I give it 7 out of 10. Final: 6", 0, 10, 6.0),
    ("Score: **-0.5**", -1, 1, -0.5),
    ("between 3-4", 0, 10, 4.0),
    ("1e-3", 0, 1, 0.001),
    ("0", 0, 1, 0.0),
    ("1.", 0, 1, 1.0),
    ("1.5", 0, 1, None),
    ('{"result": 11}', 0, 10, None),
    ("great answer", 0, 1, None),
    ("1e999", 0, 1, None),
    ("", 0, 1, None),
])
def test_score_reading(answer: str, low: float, high: float, score: float | None):
    value, problem = parse_score(answer, low, high)
    assert value == score
    assert (problem is None) == (score is not None)


def test_score_problems_say_why():
    assert "outside the range [0, 1]" in parse_score("1.5", 0, 1)[1]
    assert "holds no score" in parse_score("great", 0, 1)[1]


LABELS = ["correct", "incorrect", "not sure"]


@pytest.mark.parametrize(("answer", "label"), [
    ('{"result": "Correct"}', "correct"),
    ('Thinking... {"steps": [], "result": "incorrect"}', "incorrect"),
    ('{"result": "wrong"} but it is correct', "correct"),
    ('"Incorrect."', "incorrect"),
    ("**CORRECT**", "correct"),
    ("  'not sure'!\n", "not sure"),
    ("The answer is incorrect, not correct", "incorrect"),
    ("I am not sure it is correct", "not sure"),
    ("incorrectly correct", "correct"),
    ("notcorrect", None),
    ("maybe", None),
    ("", None),
])
def test_label_reading(answer: str, label: str | None):
    assert parse_label(answer, LABELS) == label


def test_labels_score_passing_one_other_zero_none_unscored(models_root: Path, tiny_model_factory):
    judge = bind(models_root, "label_model", model=judge_source(models_root, tiny_model_factory, "llama"),
                 input=INPUT, labels=["Yes", "No", "Unsure"], passing_labels=["Yes"])
    assert judge.verdict("yes.") == (1.0, None)
    assert judge.verdict('{"result": "NO"}') == (0.0, None)
    assert judge.verdict("unsure") == (0.0, None)
    value, problem = judge.verdict("perhaps")
    assert value is None and "none of the labels" in problem


# Args, checked at submit without loading anything.

def args_error(name: str, **args: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        validate_reward_specs([RewardSpec(name=name, args=args)])
    return info.value


SCORE = {"model": "path:judge", "input": INPUT}
LABEL = {**SCORE, "labels": ["pass", "fail"], "passing_labels": ["pass"]}


@pytest.mark.parametrize(("name", "args", "field"), [
    ("score_model", {**SCORE, "model": "o3-mini"}, "model"),
    ("label_model", {**LABEL, "model": "gpt-4o-2024-08-06"}, "model"),
    ("score_model", {**SCORE, "model": "job:0"}, "model"),
    ("score_model", {**SCORE, "model": "job:3@"}, "model"),
    ("score_model", {**SCORE, "model": "s3:bucket/model"}, "model"),
    ("score_model", {**SCORE, "sampling_params": {"reasoning_effort": "low"}},
     "sampling_params.reasoning_effort"),
    ("score_model", {**SCORE, "sampling_params": {"max_completions_tokens": 5000}},
     "sampling_params.max_completions_tokens"),
    ("score_model", {**SCORE, "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ("score_model", {**SCORE, "sampling_params": {"top_k": 5}}, "sampling_params.top_k"),
    ("score_model", {**SCORE, "range": [1, 0]}, "range"),
    ("score_model", {**SCORE, "range": [0, 1, 2]}, "range"),
    ("score_model", {**SCORE, "input": []}, "input"),
    ("score_model", {**SCORE, "input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ("score_model", {**SCORE, "input": [user("{{answer}}")]}, "input.0.content"),
    ("score_model", {**SCORE, "input": [user("{{sample.text}}")]}, "input.0.content"),
    ("score_model", {**SCORE, "input": [user("x" * 20_001)]}, "input.0.content.string"),
    ("score_model", {**SCORE, "input": [user({"type": "input_text", "text": "{{x}}"})]},
     "input.0.content.object.text"),
    ("score_model", {**SCORE, "input": [{**user("x"), "type": "item"}]}, "input.0.type"),
    ("score_model", {**SCORE, "batch_size": 0}, "batch_size"),
    ("score_model", {**SCORE, "labels": ["a"]}, "labels"),
    ("label_model", {**LABEL, "passing_labels": ["pass", "maybe"]}, "passing_labels"),
    ("label_model", {**LABEL, "passing_labels": []}, "passing_labels"),
    ("label_model", {**LABEL, "labels": ["pass", "PASS"]}, "labels"),
    ("label_model", {**LABEL, "labels": ["pass", " "]}, "labels"),
    ("label_model", {**LABEL, "sampling_params": {}}, "sampling_params"),
])
def test_bad_args_name_their_field(name: str, args: dict, field: str):
    assert args_error(name, **args).field == f"rewards.0.args.{field}"


def test_hosted_model_names_say_the_judge_must_load_here():
    reason = args_error("score_model", **{**SCORE, "model": "o3-mini"}).reason
    assert "must be a model this service can load" in reason and "path:" in reason and "file:" in reason
    assert "job:ID[@STEP]" in reason  # another job's model is one this service loads
    malformed = args_error("score_model", **{**SCORE, "model": "job:abc"}).reason
    assert "'job:ID' (its final model) or 'job:ID@STEP'" in malformed  # model.source's own check


def test_another_jobs_model_may_be_the_judge():
    """``job:ID[@STEP]`` validates, as a ``model.source`` does (the service resolves it); the core
    refuses to load it (``grpo train`` refuses it before: tests/api/test_job_spec.py)."""
    label = {**LABEL, "model": "job:7@40"}
    specs = [RewardSpec(name="score_model", args={**SCORE, "model": "job: 7"}),
             RewardSpec(name="label_model", args=label)]
    validate_reward_specs(specs)
    assert model_sources(specs) == [("rewards.0.args.model", "job: 7"), ("rewards.1.args.model", "job:7@40")]


def test_openai_graders_validate_as_written():
    """Pasted OpenAI graders (less type and name) validate: item types, content objects, nulls,
    pass_threshold (ignored)."""
    score = {"model": "path:judge", "range": [0, 10], "pass_threshold": 7,
             "input": [{"type": "message", "role": "developer", "content": "Grade 0-10."},
                       {"type": "message", **user({"type": "input_text",
                                                    "text": "{{item.reference}} / {{sample.output_text}}"})}],
             "sampling_params": {"temperature": None, "top_p": None, "seed": 3,
                                 "max_completions_tokens": None, "reasoning_effort": None}}
    label = {"model": "file:file-0123456789abcdef01234567", "input": INPUT, "labels": ["good", "bad"],
             "passing_labels": ["good"]}
    specs = [RewardSpec(name="score_model", args=score), RewardSpec(name="label_model", args=label)]
    validate_reward_specs(specs, columns={"reference", "answer"})
    assert model_sources(specs) == [("rewards.0.args.model", "path:judge"),
                                    ("rewards.1.args.model", "file:file-0123456789abcdef01234567")]
    with pytest.raises(SpecError) as info:
        validate_reward_specs(specs[:1], columns={"answer"})
    assert info.value.field == "rewards.0.args" and "'reference'" in info.value.reason


def test_bad_judges_name_their_field_at_bind(models_root: Path):
    def error(model: str) -> SpecError:
        return spec_error([RewardSpec(name="score_model", args={"model": model, "input": INPUT})],
                          models_root=models_root)

    own = next(models_root.glob("judges*")).name
    classifier = error(f"path:{own}/classifier")
    assert classifier.field == "rewards.0.args.model" and "not a causal language model" in classifier.reason
    plain = error(f"path:{own}/plain")
    assert plain.field == "rewards.0.args.model" and "chat template" in plain.reason
    missing = error("path:nowhere")
    assert isinstance(missing, SourceUnavailable) and missing.field == "rewards.0.args.model"
    assert error("path:../outside").field == "rewards.0.args.model"
    unresolved = error("job:3")  # the service's source, which only its worker resolves
    assert unresolved.field == "rewards.0.args.model" and "'path:' or 'hf:'" in unresolved.reason
