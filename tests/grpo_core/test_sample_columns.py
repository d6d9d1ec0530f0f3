"""Sample rows carry their dataset row's columns (issue 33 item 9): the dashboard shows a dataset's
own ``answer`` column beside the answer parsed from the completion, which the row's top-level
``answer`` is. Through the real trainer and tiny model, training's rows and eval's alike; a long
value is cut so it cannot swell the samples."""

from __future__ import annotations

from core_specs import PROMPTS, spec_dict
from test_trainer import run

from grpo_core.algorithm.eval_metrics import EVAL_SPLIT
from grpo_core.io.prompt_data import MAX_SAMPLE_VALUE_CHARS
from grpo_core.spec.run_spec import RunSpec

LONG = "x" * (MAX_SAMPLE_VALUE_CHARS + 50)


def test_training_and_eval_samples_carry_the_rows_dataset_columns(tiny_model_dir, tmp_path) -> None:
    spec = spec_dict(tiny_model_dir, max_steps=2, eval_strategy="steps", eval_steps=2)
    spec["dataset"] = {"prompts": [{"prompt": p, "answer": f"ref {n}", "level": n, "note": LONG}
                                   for n, p in enumerate(PROMPTS)]}
    spec["eval_dataset"] = {"prompts": [{"prompt": "hello there", "answer": "hi", "tags": ["a", "b"]}]}
    spec["log_completions_every"] = 1
    _, recorder, _ = run(RunSpec.model_validate(spec), tmp_path)

    training = [row for row in recorder.samples[2] if row.get("split") != EVAL_SPLIT]
    assert training
    cut = LONG[:MAX_SAMPLE_VALUE_CHARS] + "…"
    for row in training:
        n = PROMPTS.index(row["prompt"])  # a plain prompt is rendered as it is
        assert row["columns"] == {"answer": f"ref {n}", "level": n, "note": cut}
        assert isinstance(row["answer"], str)  # the parsed answer, the completion's, not the column
    [evaluated] = [row for row in recorder.samples[2] if row.get("split") == EVAL_SPLIT]
    assert evaluated["columns"] == {"answer": "hi", "tags": ["a", "b"]}
