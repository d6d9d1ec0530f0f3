"""An uploaded dataset's columns and prompt field, recorded at upload and checked at submit as
inline rows' are, and a ``python`` grader's imports checked at submit: through the real service
(HTTP, Postgres, Redis). A job on such a file through the real worker is in
``tests/worker/test_uploaded_file_jobs.py``."""

from __future__ import annotations

import json
import uuid

import pytest
from test_files import upload

from api.store import bus
from api.vocabulary import Heartbeat
from grpo_core.rewards.sandbox import CAPABILITY

QUESTIONS = [{"question": "2+3?", "answer": "5"}, {"question": "hi", "answer": "hello", "level": 1}]
JSONL = "".join(json.dumps(row) + "\n" for row in QUESTIONS).encode()


@pytest.fixture
def questions(alpha):
    """An upload of rows whose prompt is under ``question``, sent with ``prompt_field``."""
    response = upload(alpha, "questions.jsonl", JSONL, prompt_field="question")
    assert response.status_code == 201, response.text
    yield response.json()
    alpha.delete(f"/v1/files/{response.json()['id']}")


def submitted(client, spec: dict) -> dict:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    client.post(f"/v1/jobs/{response.json()['id']}/cancel")  # its files stay free to delete
    return response.json()


def refusal(client, spec: dict) -> dict:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    return response.json()["error"]


def test_an_upload_records_its_columns_and_prompt_field(alpha, questions) -> None:
    assert questions["columns"] == ["question", "answer", "level"]  # every row's, in the order first seen
    assert questions["prompt_field"] == "question"
    assert questions["rows"] == 2
    assert alpha.get(f"/v1/files/{questions['id']}").json() == questions
    plain = upload(alpha, "plain.jsonl", b'{"prompt": "hi"}\n')  # no prompt_field: checked as "prompt"
    assert (plain.json()["columns"], plain.json()["prompt_field"]) == (["prompt"], "prompt")
    alpha.delete(f"/v1/files/{plain.json()['id']}")


def test_a_round_over_an_uploaded_datasets_rows_is_a_warning_at_submit(alpha, questions, job_spec, pool,
                                                                        api_server) -> None:
    """As for inline rows: the answer and the job's events say the round draws more prompts than
    the file's 2 rows, naming the field and the file; one that fits has no warning."""
    source = {"source": f"file:{questions['id']}"}
    over = submitted(alpha, job_spec(pool=pool, dataset=source, grpo={"prompts_per_step": 4}))
    [warning] = over["warnings"]
    assert warning["param"] == "grpo.prompts_per_step", warning
    assert f"the uploaded dataset {questions['id']} has 2 rows" in warning["message"], warning
    events = alpha.get(f"/v1/jobs/{over['id']}/events").json()["items"]
    told = [e["data"] for e in events if e["type"] == "prompts_over_dataset"]
    assert told == [{"field": "grpo.prompts_per_step"}]
    fits = submitted(alpha, job_spec(pool=pool, dataset=source, grpo={"prompts_per_step": 2}))
    assert fits["warnings"] == []
    # The worker counts the rows again when it loads them and would warn at training start: the
    # job is told once (the worker's reporter writes it only where the submit did not).
    from worker.reporting import JobReporter

    for job in (over, fits):
        JobReporter(api_server.settings.database_url, job["id"], None).on_event(
            "prompts_over_dataset", "grpo.prompts_per_step: as the worker found it", {"rows": 2})
        events = alpha.get(f"/v1/jobs/{job['id']}/events").json()["items"]
        assert len([e for e in events if e["type"] == "prompts_over_dataset"]) == 1


def test_a_spec_without_prompt_field_takes_the_uploads(alpha, questions, job_spec, pool) -> None:
    source = {"source": f"file:{questions['id']}"}
    job = submitted(alpha, job_spec(pool=pool, dataset=source, eval_dataset=source))
    stored = alpha.get(f"/v1/jobs/{job['id']}").json()["spec"]  # what the worker reads
    assert stored["dataset"]["prompt_field"] == stored["eval_dataset"]["prompt_field"] == "question"
    # A spec's own prompt_field wins, when the file has that column.
    own = submitted(alpha, job_spec(pool=pool, dataset={**source, "prompt_field": "answer"}))
    assert own["spec"]["dataset"]["prompt_field"] == "answer"
    error = refusal(alpha, job_spec(pool=pool, dataset={**source, "prompt_field": "text"}))
    assert error["param"] == "dataset.prompt_field", error
    assert "'text'" in error["message"] and "question, answer, level" in error["message"], error


def test_a_reward_reading_a_column_the_file_lacks_is_refused(alpha, questions, job_spec, pool) -> None:
    source = {"source": f"file:{questions['id']}"}
    solution = [{"name": "contains", "args": {"text": "x"}},
                {"name": "exact_match", "args": {"field": "solution"}}]
    error = refusal(alpha, job_spec(pool=pool, dataset=source, rewards=solution))
    assert error["param"] == "rewards.1.args", error
    assert "'solution'" in error["message"] and "answer, level" in error["message"], error
    assert questions["id"] in error["message"]
    # The eval file is scored by the same rewards: named on its source.
    inline = {"prompts": [{"prompt": "2+3?", "solution": "5"}]}
    error = refusal(alpha, job_spec(pool=pool, dataset=inline, eval_dataset=source, rewards=solution))
    assert error["param"] == "eval_dataset.source", error
    assert "rewards.1.args" in error["message"] and "'solution'" in error["message"], error
    # The column the file has is found (the prompt is none: a reward never reads it by name).
    answer = [{"name": "exact_match", "args": {"field": "answer"}}]
    submitted(alpha, job_spec(pool=pool, dataset=source, rewards=answer))
    error = refusal(alpha, job_spec(pool=pool, dataset=source, rewards=[
        {"name": "exact_match", "args": {"field": "question"}}]))
    assert error["param"] == "rewards.0.args", error


GRADER = """import math
{imports}

def grade(sample, item):
    return float(sample["output_text"] == item["answer"])
"""


def test_a_python_grader_importing_outside_the_standard_library_is_refused(
        alpha, api_server, questions, job_spec, pool) -> None:
    settings = api_server.settings
    worker = f"sandboxed-{uuid.uuid4().hex[:8]}"  # the pool's workers can run graders
    with bus.connect(settings) as redis:
        bus.advertise_worker(redis, settings.redis_keys, Heartbeat(worker_id=worker, pool=pool,
                                                                   capabilities=[CAPABILITY]), 60)
        try:
            def grader(imports: str) -> dict:
                source = GRADER.format(imports=imports)
                return job_spec(pool=pool, dataset={"source": f"file:{questions['id']}"},
                                rewards=[{"name": "python", "args": {"source": source}}])

            for imports, line, module in (("import numpy as np", 2, "numpy"),
                                          ("from sklearn.metrics import f1_score", 2, "sklearn.metrics"),
                                          ("import json, numpy.linalg", 2, "numpy.linalg"),
                                          ("from . import helpers", 2, ".")):
                error = refusal(alpha, grader(imports))
                assert error["param"] == "rewards.0.args.source", error
                assert f"line {line} imports '{module}'" in error["message"], error
                assert "standard library" in error["message"], error
            inner = "def helper():\n    import scipy\n    return scipy"  # in a function: checked too
            assert "line 3 imports 'scipy'" in refusal(alpha, grader(inner))["message"]
            # The standard library (any depth of it), and a fallback the grader handles, are fine.
            submitted(alpha, grader("import json, os.path\nfrom collections import Counter\n"
                                    "try:\n    import numpy\nexcept ImportError:\n    numpy = None"))
        finally:
            redis.delete(settings.redis_keys.worker(worker))
