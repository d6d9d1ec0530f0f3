"""The mapping between OpenAI's fine-tuning API and this service's jobs (:mod:`api.openai_compat`),
without a server: ids, a create's body as a JobSpec (every hyperparameter, ``auto``, the
refusals and the errors told back at OpenAI's fields), a job as ``fine_tuning.job`` (every status,
hyperparameters resolved back to what was asked), events, checkpoints and files. The routes are
``test_fine_tuning_api.py``'s."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from api.domain.lifecycle import JOB_STATUSES
from api.openai_compat import ids
from api.openai_compat.file_object import deleted_answer, file_answer
from api.openai_compat.job_checkpoints import job_checkpoint
from api.openai_compat.job_events import job_event
from api.openai_compat.job_object import STATUSES, file_named, fine_tuning_job, hyperparameters
from api.openai_compat.job_request import (
    AUTO_EVAL_STEPS,
    default_name,
    generations_for,
    in_openai_terms,
    job_request,
    openai_field,
)
from api.schemas.files import FileRead
from api.schemas.fine_tuning import FineTuningJobCreate, FineTuningJobFacts, OpenAIFile, OpenAIFileDeleted
from api.schemas.jobs import CheckpointRead, ErrorInfo, EventRead, JobRead
from grpo_core.errors import SpecError
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.spec_file import InvalidSpec

FILE = "file-" + "a" * 24
EVAL_FILE = "file-" + "b" * 24
GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
          "reference": "{{item.reference_answer}}", "operation": "eq"}
H = "method.reinforcement.hyperparameters"
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def body(hyper: dict[str, Any] | None = None, grader: dict[str, Any] | None = None,
         **fields: Any) -> FineTuningJobCreate:
    method = {"type": "reinforcement", "reinforcement": {"grader": grader or GRADER,
                                                         "hyperparameters": hyper or {}}}
    return FineTuningJobCreate.model_validate({"model": "path:tiny", "training_file": FILE, "method": method,
                                               **fields})


def refused(create: FineTuningJobCreate) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as caught:
        job_request(create)
    return {error.field: error.reason for error in caught.value.errors}


def test_ids_are_written_and_read_in_one_form_only() -> None:
    assert ids.job_ref(7) == "ftjob-7" and ids.parse_job_ref("ftjob-7") == 7
    assert ids.parse_event_ref(ids.event_ref(12)) == 12
    assert ids.parse_checkpoint_ref(ids.checkpoint_ref(7, 40)) == (7, 40)
    assert ids.parse_job_ref(f"ftjob-{2**63 - 1}") == 2**63 - 1
    for wrong in ("7", "ftjob-07", "ftjob-0", "ftjob-", "FTJOB-7", "ftjob-7 ", f"ftjob-{2**63}", "ftjob-٤"):
        assert ids.parse_job_ref(wrong) is None, wrong
    assert ids.parse_checkpoint_ref("ftckpt-7") is None
    assert ids.parse_checkpoint_ref(f"ftckpt-7-{2**31}") is None


def test_every_hyperparameter_becomes_its_grpo_field() -> None:
    asked = job_request(body({"n_epochs": 4, "batch_size": 16, "learning_rate_multiplier": 2.5,
                              "compute_multiplier": 2, "eval_interval": 10, "eval_samples": 3},
                             validation_file=EVAL_FILE, seed=11, suffix="mine"))
    spec = asked.spec
    assert (spec.name, spec.model.source) == ("mine", "path:tiny")
    assert (spec.dataset.source, spec.eval_dataset.source) == (f"file:{FILE}", f"file:{EVAL_FILE}")
    # The prompt column is left to the upload's record (messages for purpose=fine-tune).
    assert "prompt_field" not in spec.dataset.model_fields_set
    grpo = spec.grpo
    assert (grpo.num_train_epochs, grpo.prompts_per_step, grpo.num_generations, grpo.seed) == (4, 16, 16, 11)
    assert grpo.learning_rate == pytest.approx(2.5e-6)
    assert (grpo.eval_strategy, grpo.eval_steps, grpo.eval_num_generations) == ("steps", 10, 3)
    assert [reward.model_dump(include={"name", "args"}) for reward in spec.rewards] == [
        {"name": "string_check", "args": {"input": GRADER["input"], "reference": GRADER["reference"],
                                          "operation": "eq"}}]
    assert asked.stored == {"method": body({"n_epochs": 4, "batch_size": 16, "learning_rate_multiplier": 2.5,
                                            "compute_multiplier": 2, "eval_interval": 10,
                                            "eval_samples": 3}).method.model_dump(mode="json",
                                                                                  exclude_unset=True),
                            "metadata": None, "suffix": "mine"}


def test_auto_leaves_our_defaults() -> None:
    every_auto = {name: "auto" for name in ("n_epochs", "batch_size", "learning_rate_multiplier",
                                            "compute_multiplier", "eval_interval", "eval_samples")}
    for hyper in ({}, every_auto):
        spec = job_request(body(hyper)).spec
        assert spec.grpo == GRPOConfig() and spec.eval_dataset is None
        assert spec.name == default_name("path:tiny") == "rft path:tiny"
    evaluated = job_request(body(every_auto, validation_file=EVAL_FILE)).spec.grpo
    assert (evaluated.eval_strategy, evaluated.eval_steps, evaluated.eval_num_generations) == (
        "steps", AUTO_EVAL_STEPS, 1)


def test_compute_multiplier_scales_the_default_group_rounding_half_up() -> None:
    assert [generations_for(m) for m in (1, 0.25, 0.3, 0.3125, 0.5, 1.5, 128)] == [8, 2, 2, 3, 4, 12, 1024]
    assert job_request(body({"compute_multiplier": 0.3125})).spec.grpo.num_generations == 3
    too_few = refused(body({"compute_multiplier": 0.1}))
    assert list(too_few) == [f"{H}.compute_multiplier"]
    assert "0.25 to 128" in too_few[f"{H}.compute_multiplier"]


def test_what_is_refused_is_named_at_its_openai_field() -> None:
    found = refused(body({"reasoning_effort": "low", "eval_samples": 2}, model="gpt-4.1-mini-2025-04-14",
                         training_file="train.jsonl", hyperparameters={"n_epochs": 1},
                         integrations=[{"type": "wandb"}]))
    assert set(found) == {"model", "training_file", "hyperparameters", "integrations",
                          f"{H}.reasoning_effort", f"{H}.eval_samples"}
    assert "path:NAME" in found["model"] and "job:ID" in found["model"]
    for method in ({"type": "dpo", "dpo": {}}, {"type": "supervised"}):
        create = FineTuningJobCreate.model_validate({"model": "path:tiny", "training_file": FILE,
                                                     "method": method})
        assert "GRPO" in refused(create)["method.type"]
    assert set(refused(FineTuningJobCreate(model="path:tiny", training_file=FILE))) == {"method"}
    no_grader = FineTuningJobCreate.model_validate({"model": "path:tiny", "training_file": FILE,
                                                    "method": {"type": "reinforcement"}})
    assert set(refused(no_grader)) == {"method.reinforcement"}


@pytest.mark.parametrize("model", ["ft:gpt-4o-mini:org::abc", "o3", "http://x/model", "path:", "hub:x/y"])
def test_a_model_this_service_cannot_load_is_refused(model: str) -> None:
    assert list(refused(body(model=model))) == ["model"]


def test_a_grader_error_is_told_inside_the_grader() -> None:
    assert set(refused(body(grader={"type": "regex"}))) == {"method.reinforcement.grader.type"}
    multi = {"type": "multi", "graders": {"a": {"type": "multi"}}, "calculate_output": "a"}
    assert set(refused(body(grader=multi))) == {"method.reinforcement.grader.graders.a.type"}


def test_the_specs_own_checks_are_told_at_openai_fields() -> None:
    found = refused(body({"batch_size": 10_000, "n_epochs": 10**9}, suffix="", seed=2**40))
    assert set(found) == {"suffix", f"{H}.batch_size", f"{H}.n_epochs", "seed"}
    assert found["seed"].endswith("(grpo.seed in the job's spec)")


@pytest.mark.parametrize("field, expected", [
    ("name", "suffix"),
    ("model.source", "model"),
    ("dataset.source", "training_file"),
    ("dataset.prompt_field", "training_file"),
    ("eval_dataset.source", "validation_file"),
    ("grpo.num_train_epochs", f"{H}.n_epochs"),
    ("grpo.prompts_per_step", f"{H}.batch_size"),
    ("grpo.learning_rate", f"{H}.learning_rate_multiplier"),
    ("grpo.eval_steps", f"{H}.eval_interval"),
    ("grpo.eval_num_generations", f"{H}.eval_samples"),
    ("grpo.num_generations", f"{H}.compute_multiplier"),
    ("grpo.seed", "seed"),
    ("rewards.0.args.operation", "method.reinforcement.grader.operation"),
    ("rewards.0.args.graders.a.reference", "method.reinforcement.grader.graders.a.reference"),
    ("rewards.0.name", "method.reinforcement.grader.type"),
    ("rewards.0", "method.reinforcement.grader"),
    ("rewards", "method.reinforcement.grader"),
    ("resources.pool", "resources.pool"),
    ("grpo.max_completion_length", "grpo.max_completion_length"),
])
def test_a_spec_field_is_named_as_the_create_named_it(field: str, expected: str) -> None:
    assert openai_field(field) == expected


def test_errors_in_openai_terms_keep_the_specs_field_in_the_message() -> None:
    mapped = in_openai_terms(InvalidSpec([SpecError("dataset.prompt_field", "no column 'messages'"),
                                          SpecError("rewards.0.args.reference", "bad template"),
                                          SpecError("resources.pool", "unknown pool")]))
    assert [(error.field, error.reason) for error in mapped.errors] == [
        ("training_file", "no column 'messages' (dataset.prompt_field in the job's spec)"),
        ("method.reinforcement.grader.reference", "bad template"),
        ("resources.pool", "unknown pool")]


def job(status: str = "queued", **fields: Any) -> JobRead:
    values = {"id": 7, "name": "capitals", "team_id": 2, "status": status, "priority": "normal",
              "pool": "default", "gpus": 1, "attempt": 0, "worker_id": None, "max_steps": None,
              "last_step": 0, "cancel_requested": False, "created_at": NOW, "dispatched_at": None,
              "started_at": None, "finished_at": None, "heartbeat_at": None, "latest_checkpoint": None,
              "error": None}
    return JobRead(**{**values, **fields})


def facts(read: JobRead, grpo: dict[str, Any] | None = None, request: dict[str, Any] | None = None,
          eval_source: str | None = None) -> FineTuningJobFacts:
    spec = {"model": {"source": "path:tiny"}, "dataset": {"source": f"file:{FILE}"},
            "eval_dataset": None if eval_source is None else {"source": eval_source}, "grpo": grpo or {}}
    return FineTuningJobFacts(job=read, organization="alpha", spec=spec, openai_request=request,
                              trained_tokens=None)


def test_every_status_has_openais_word() -> None:
    assert set(STATUSES) == set(JOB_STATUSES)
    assert {ours: STATUSES[ours] for ours in ("dispatched", "preempted", "cancelling", "pausing")} == {
        "dispatched": "queued", "preempted": "queued", "cancelling": "cancelled", "pausing": "paused"}
    for status in JOB_STATUSES:
        shown = fine_tuning_job(facts(job(status)))
        assert shown.status == STATUSES[status]
        assert shown.fine_tuned_model == ("job:7" if status == "succeeded" else None)


def test_a_job_object_from_its_facts() -> None:
    error = ErrorInfo(code="oom", message="out of memory", traceback="x")
    ended = job("failed", finished_at=NOW, error=error)
    request = {"method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}},
               "metadata": {"k": "v"}, "suffix": "capitals"}
    shown = fine_tuning_job(facts(ended, {"seed": 3}, request, eval_source=f"file:{EVAL_FILE}"))
    assert (shown.id, shown.created_at, shown.finished_at) == ("ftjob-7", int(NOW.timestamp()),
                                                                int(NOW.timestamp()))
    assert shown.error.model_dump() == {"code": "oom", "message": "out of memory", "param": None}
    assert (shown.training_file, shown.validation_file, shown.seed) == (FILE, EVAL_FILE, 3)
    assert (shown.method, shown.metadata, shown.user_provided_suffix) == (request["method"], {"k": "v"},
                                                                         "capitals")
    assert (shown.organization_id, shown.result_files) == ("alpha", [])


def test_hyperparameters_resolve_back_to_what_was_asked() -> None:
    asked = {"n_epochs": 4, "batch_size": 16, "learning_rate_multiplier": 3, "compute_multiplier": 0.5,
             "eval_interval": 10, "eval_samples": 3}
    grpo = job_request(body(asked, validation_file=EVAL_FILE)).spec.grpo.model_dump(mode="json")
    assert hyperparameters({**GRPOConfig().model_dump(mode="json"), **grpo}).model_dump() == asked
    defaults = hyperparameters(GRPOConfig().model_dump(mode="json")).model_dump()
    assert defaults == {"n_epochs": 3, "batch_size": 8, "learning_rate_multiplier": 1.0,
                        "eval_interval": None, "eval_samples": 1, "compute_multiplier": 1.0}
    by_steps = GRPOConfig(max_steps=20).model_dump(mode="json")
    assert hyperparameters(by_steps).n_epochs is None


def test_a_dataset_source_as_openais_file() -> None:
    assert [file_named(source) for source in (f"file:{FILE}", "path:data.jsonl", "hf:org/set", None)] == [
        FILE, "path:data.jsonl", "hf:org/set", "inline"]


def test_events_in_openais_shape() -> None:
    event = EventRead(id=12, job_id=7, ts=NOW, level="warning", type="reward_timeout", message="",
                      data={"step": 3})
    shown = job_event(event)
    assert (shown.id, shown.level, shown.message, shown.type) == ("ftevent-12", "warn", "reward_timeout",
                                                                  "message")
    assert shown.data == {"step": 3, "event": "reward_timeout"}
    assert job_event(event.model_copy(update={"level": "debug", "message": "hi"})).level == "info"


def test_checkpoints_in_openais_shape() -> None:
    point = CheckpointRead(step=40, path="step-40", attempt=1, created_at=NOW)
    shown = job_checkpoint(7, point, {"step": 40, "loss": 0.5, "reward": 0.25, "eval_reward": float("nan"),
                                      "kl": 0.1})
    assert (shown.id, shown.fine_tuned_model_checkpoint, shown.fine_tuning_job_id, shown.step_number) == (
        "ftckpt-7-40", "job:7@40", "ftjob-7", 40)
    assert shown.metrics == {"step": 40.0, "train_loss": 0.5, "train_reward_mean": 0.25}
    assert job_checkpoint(7, point, None).metrics == {"step": 40.0}


def test_an_openai_upload_answers_openais_file_object_and_ours_our_own() -> None:
    ours = FileRead(id=FILE, purpose="dataset", filename="rft.jsonl", format="jsonl", bytes=10,
                    sha256="0" * 64, columns=["messages", "answer"], prompt_field="messages", rows=2,
                    status="ready", created_at=NOW)
    assert file_answer(ours) is ours and deleted_answer(ours) is ours
    assert "openai_purpose" not in ours.model_dump()
    theirs = ours.model_copy(update={"openai_purpose": "fine-tune"})
    shown = file_answer(theirs)
    assert isinstance(shown, OpenAIFile)
    assert (shown.object, shown.purpose, shown.status, shown.created_at, shown.prompt_field) == (
        "file", "fine-tune", "processed", int(NOW.timestamp()), "messages")
    assert file_answer(theirs.model_copy(update={"status": "uploading"})).status == "uploaded"
    assert deleted_answer(theirs) == OpenAIFileDeleted(id=FILE)
