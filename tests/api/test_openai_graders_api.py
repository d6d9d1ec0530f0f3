"""OpenAI's grader endpoints (``/v1/fine_tuning/alpha/graders/run`` and ``/validate``) through
the official ``openai`` client against the live service: each grader type scores a sample as a
job would, and a wrong field is a 422 naming it as the grader's own field."""

from __future__ import annotations

import openai
import pytest
from sandbox_guard import needs_sandbox

STRING_CHECK = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
                "reference": "{{item.reference_answer}}", "operation": "eq"}
PYTHON = {"type": "python", "name": "py",
          "source": "def grade(sample, item):\n"
                    "    return 0.25 if item['reference_answer'] in sample['output_text'] else 0.0\n"}


@pytest.fixture
def client(api_server, team_keys):
    http = openai.DefaultHttpxClient(trust_env=False, timeout=30)  # no proxy from the environment
    yield openai.OpenAI(api_key=team_keys.alpha, base_url=f"{api_server.http_url}/v1", http_client=http,
                        max_retries=0)
    http.close()


def run(client, grader: dict, sample: str, **item) -> dict:
    return client.fine_tuning.alpha.graders.run(grader=grader, model_sample=sample, item=item).model_dump()


def test_string_check_and_text_similarity_score_as_hand_computed(client) -> None:
    assert run(client, STRING_CHECK, "Paris", reference_answer="Paris")["reward"] == 1.0
    assert run(client, STRING_CHECK, "paris", reference_answer="Paris")["reward"] == 0.0
    ilike = {**STRING_CHECK, "operation": "ilike"}
    assert run(client, ilike, "It is PARIS.", reference_answer="paris")["reward"] == 1.0
    similarity = {"type": "text_similarity", "name": "sim", "input": "{{sample.output_text}}",
                  "reference": "{{item.reference_answer}}", "evaluation_metric": "fuzzy_match"}
    answer = run(client, similarity, "kitten", reference_answer="sitting")
    # Indel similarity: 1 - (edits / total length) = 1 - 5/13 with 5 insertions+deletions.
    assert answer["reward"] == pytest.approx(1 - 5 / 13)
    assert answer["metadata"]["type"] == "text_similarity" and answer["metadata"]["name"] == "sim"


@needs_sandbox
def test_a_python_grader_sees_openais_messages_as_a_dataset_row_would(client) -> None:
    source = ("def grade(sample, item):\n"
              "    return 1.0 if item['prompt'][0] == {'role': 'system', 'content': 'Be brief.'} else 0.0\n")
    messages = [{"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
                {"role": "user", "content": "hi"}]
    assert run(client, {**PYTHON, "source": source}, "x", messages=messages)["reward"] == 1.0


def test_a_missing_item_field_scores_zero_with_the_invalid_variable_flag(client) -> None:
    answer = run(client, STRING_CHECK, "Paris")
    assert answer["reward"] == 0.0
    assert answer["metadata"]["errors"]["invalid_variable_error"] is True


@needs_sandbox
def test_a_multi_grader_of_string_check_and_python_in_the_sandbox(client) -> None:
    multi = {"type": "multi", "name": "both", "graders": {"exact": STRING_CHECK, "py": PYTHON},
             "calculate_output": "0.5 * exact + py ^ 1"}
    assert run(client, multi, "Paris", reference_answer="Paris")["reward"] == pytest.approx(0.75)
    assert run(client, multi, "Lyon", reference_answer="Paris")["reward"] == 0.0
    raising = {**PYTHON, "source": "def grade(sample, item):\n    return 1 / 0\n"}
    answer = run(client, raising, "x", reference_answer="Paris")
    assert answer["reward"] == 0.0 and answer["metadata"]["errors"]["python_grader_runtime_error"] is True
    assert "ZeroDivisionError" in answer["metadata"]["errors"]["python_grader_runtime_error_details"]


def test_validate_echoes_a_good_grader_and_names_a_bad_field(client) -> None:
    assert client.fine_tuning.alpha.graders.validate(grader=STRING_CHECK).grader.type == "string_check"
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.fine_tuning.alpha.graders.validate(grader={**STRING_CHECK, "operation": "regex"})
    assert refused.value.body["param"] == "grader.operation"
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.fine_tuning.alpha.graders.validate(grader={"type": "sorcery", "name": "x"})
    assert refused.value.body["param"] == "grader.type"
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        run(client, {**STRING_CHECK, "reference": "{{reference.answer}}"}, "x", answer="x")
    assert refused.value.body["param"].startswith("grader.reference")


def test_a_judge_model_is_checked_but_not_run_by_a_dry_run(client) -> None:
    judge = {"type": "score_model", "name": "judge", "model": "path:/nonexistent/judge",
             "input": [{"role": "user", "content": "Rate {{sample.output_text}} from 0 to 1"}]}
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        run(client, judge, "x")
    assert refused.value.body["param"].startswith("grader")
