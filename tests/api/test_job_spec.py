"""The service's job spec on the core's run spec: a spec the previous version stored (one
``JobSpec`` model, in the core) reads back unchanged; the core's ``RunSpec`` has none of the
service's fields and the core names no service; ``grpo train`` refuses them from the core alone
and, through the service's ``grpo`` console, runs a service spec with them ignored (warned)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.cli.main import build_parser
from api.domain.job_spec import JobSpec
from grpo_core import cli as core_cli
from grpo_core.errors import SpecError
from grpo_core.spec.run_spec import RunSpec
from grpo_core.spec.spec_file import with_changes

CORE = Path(__file__).resolve().parents[2] / "grpo_core"
# Dumped by the version whose core JobSpec held priority, pool, stall_seconds and job: sources.
STORED = json.loads((Path(__file__).parent / "data" / "stored_job_spec.json").read_text())
SERVICE_WORDS = {"priority", "pool", "stall_seconds", "limits"}


def test_a_spec_stored_by_the_previous_version_reads_back_unchanged() -> None:
    spec = JobSpec.model_validate(STORED)
    assert spec.model_dump(mode="json") == STORED
    assert (spec.priority, spec.resources.pool, spec.stall_seconds) == ("high", "gpu-a", 600)
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


def test_the_run_spec_has_no_service_field() -> None:
    def names(model: type) -> set[str]:
        found = set(model.model_fields)
        for field in model.model_fields.values():
            if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"):
                found |= names(field.annotation)
        return found

    assert not names(RunSpec) & SERVICE_WORDS
    assert {"priority", "pool", "stall_seconds"} <= names(JobSpec)
    with pytest.raises(ValueError, match="'path:' or 'hf:'"):
        RunSpec.model_validate({**STORED, "model": {"source": "job:7"}})


def test_the_core_never_names_the_service() -> None:
    naming = [str(path.relative_to(CORE)) for path in CORE.rglob("*.py")
              if "grpo-service" in path.read_text()]
    assert not naming, f"the core names the service's distribution or tracker project in {naming}"


def test_changes_to_a_job_spec_keep_it_a_job_spec() -> None:
    changes = {"priority": "low", "resources": {"sharding": "ddp"}}
    changed = with_changes(JobSpec.model_validate(STORED), changes)
    assert type(changed) is JobSpec
    assert (changed.priority, changed.resources.sharding, changed.resources.pool) == ("low", "ddp", "gpu-a")


def _service_spec_file(tmp_path: Path, *, leave_out: tuple[str, ...] = (), **fields) -> Path:
    # One prompt a step, as the stored spec has one row: these tests are about the service's fields,
    # not the warning a step larger than the dataset earns.
    data = {**STORED, "model": {**STORED["model"], "source": "path:model"},
            "grpo": {**STORED["grpo"], "prompts_per_step": 1},
            "resources": {"gpus": 1, "pool": "gpu-a"}, **fields}
    data = {name: value for name, value in data.items() if name not in leave_out}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    return path


def test_grpo_train_from_the_core_alone_refuses_service_fields_naming_them(tmp_path, capsys) -> None:
    code = core_cli.main(["train", str(_service_spec_file(tmp_path)), "--output-dir", str(tmp_path / "out")])
    errors = capsys.readouterr().err
    assert code == 2
    for field in ("priority", "stall_seconds", "resources.pool"):
        assert f"error: {field}: unknown field" in errors


def test_grpo_train_of_the_service_console_runs_a_service_spec_ignoring_its_service_fields(tmp_path) -> None:
    path = _service_spec_file(tmp_path)
    args = build_parser().parse_args(["train", str(path), "--output-dir", str(tmp_path / "out")])
    spec, warnings = args.load_spec(path)
    assert isinstance(spec, RunSpec) and spec.model.source == "path:model"
    assert [w.field for w in warnings] == ["priority", "stall_seconds", "resources.pool"]
    assert all("grpo train ignores it" in w.message for w in warnings)
    # Defaults are no request: a spec that does not set them is run without a word.
    plain = _service_spec_file(tmp_path, resources={"gpus": 1}, leave_out=("priority", "stall_seconds"))
    assert args.load_spec(plain)[1] == []


JUDGE = {"type": "score_model", "model": "job:7@40",
         "input": [{"role": "user", "content": "{{sample.output_text}}"}]}


@pytest.mark.parametrize("fields, field", [
    ({"model": {**STORED["model"], "source": "job:7"}}, "model.source"),
    ({"rewards": [{"name": "reward_model", "args": {"model": "job:7"}}]}, "rewards.0.args.model"),
    ({"rewards": [{"name": "contains", "args": {"text": "x"}},
                  {"name": "multi", "args": {"graders": {"judge": JUDGE}, "calculate_output": "judge"}}]},
     "rewards.1.args.graders.judge.model"),
])
def test_grpo_train_of_the_service_console_refuses_another_jobs_model(tmp_path, fields, field) -> None:
    path = _service_spec_file(tmp_path, **fields)
    args = build_parser().parse_args(["train", str(path), "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SpecError, match=f"{field}: 'job:' sources name a job of the service"):
        args.load_spec(path)


@pytest.mark.parametrize("fields, field", [
    ({"model": {**STORED["model"], "source": f"file:file-{'a' * 24}"}}, "model.source"),
    ({"dataset": {"source": f"file:file-{'a' * 24}"}}, "dataset.source"),
    ({"rewards": [{"name": "reward_model", "args": {"model": f"file:file-{'a' * 24}"}}]},
     "rewards.0.args.model"),
])
def test_grpo_train_of_the_service_console_refuses_uploaded_files(tmp_path, fields, field) -> None:
    path = _service_spec_file(tmp_path, **fields)
    args = build_parser().parse_args(["train", str(path), "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SpecError, match=f"{field}: 'file:' sources name a file uploaded to the service"):
        args.load_spec(path)


def test_grpo_train_ignores_a_service_specs_tags_and_description_with_a_warning(tmp_path) -> None:
    path = _service_spec_file(tmp_path, leave_out=("priority", "stall_seconds"), tags=["exp/v2"],
                              description="for the service's lists")
    args = build_parser().parse_args(["train", str(path), "--output-dir", str(tmp_path / "out")])
    spec, warnings = args.load_spec(path)
    assert isinstance(spec, RunSpec) and spec.tags == ["exp/v2"]
    assert [w.field for w in warnings] == ["resources.pool", "tags", "description"]
