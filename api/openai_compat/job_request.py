"""An OpenAI create (``POST /v1/fine_tuning/jobs``, reinforcement method) as this service's JobSpec,
and the errors of that spec told back in OpenAI's fields.

What becomes what (docs/user_guide.md, "Coming from OpenAI's fine-tuning", has the table):
``model`` is ``model.source`` and must be one this service loads (an OpenAI model name is
refused, saying what to send); ``training_file``/``validation_file`` are uploads,
``dataset.source``/``eval_dataset.source`` ``file:ID``, read with the prompt column their upload
recorded (``messages`` for a ``purpose=fine-tune`` upload); the grader is the job's one reward
(:func:`grpo_core.spec.openai_graders.rewards_from_openai_grader`); the hyperparameters are
``grpo:`` fields, ``auto`` leaving this service's default; ``seed`` is ``grpo.seed`` and
``suffix`` the job's name. What the spec cannot hold (the method as sent, ``metadata``,
``suffix``) is returned apart, for the store to keep beside the job.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from api.domain.job_spec import JobSpec
from api.schemas.fine_tuning import AUTO, FineTuningJobCreate, ReinforcementHyperparameters
from grpo_core.errors import SpecError
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.openai_graders import rewards_from_openai_grader
from grpo_core.spec.spec_file import InvalidSpec, parse_spec

HYPERPARAMETERS = "method.reinforcement.hyperparameters"
GRADER = "method.reinforcement.grader"
# ``learning_rate_multiplier`` multiplies this (grpo.learning_rate's default), and
# ``compute_multiplier`` this (grpo.num_generations' default): a multiplier of 1 is our default.
BASE_LEARNING_RATE: float = GRPOConfig.model_fields["learning_rate"].default
BASE_GENERATIONS: int = GRPOConfig.model_fields["num_generations"].default
MIN_GENERATIONS, MAX_GENERATIONS = 2, 1024
# ``eval_interval: auto`` with a validation file: evaluate every tenth of the run (and, as always,
# at its last step): grpo.eval_steps below 1 is a fraction of the run's steps.
AUTO_EVAL_STEPS = 0.1
MODEL_SCHEMES = ("path", "hf", "file", "job")
_FILE_ID = re.compile(r"file-[0-9a-f]{24}")

# Our spec's fields -> the OpenAI field each came from, so a spec error names what was sent. A
# field not here keeps its own name (the job's spec at /v1/jobs/{id} has it).
OPENAI_FIELDS: dict[str, str] = {
    "name": "suffix",
    "model": "model",
    "dataset": "training_file",
    "eval_dataset": "validation_file",
    "grpo.num_train_epochs": f"{HYPERPARAMETERS}.n_epochs",
    "grpo.prompts_per_step": f"{HYPERPARAMETERS}.batch_size",
    "grpo.learning_rate": f"{HYPERPARAMETERS}.learning_rate_multiplier",
    "grpo.eval_steps": f"{HYPERPARAMETERS}.eval_interval",
    "grpo.eval_num_generations": f"{HYPERPARAMETERS}.eval_samples",
    "grpo.num_generations": f"{HYPERPARAMETERS}.compute_multiplier",
    "grpo.seed": "seed",
}


class JobRequest(NamedTuple):
    """A create, read: the job's spec, and what is kept beside it (``method`` as sent,
    ``metadata``, ``suffix``), which the job's OpenAI view echoes."""

    spec: JobSpec
    stored: dict[str, Any]


def default_name(model: str) -> str:
    """A job's name when the create gives no ``suffix``."""
    return f"rft {model}"[:128]


def job_request(body: FineTuningJobCreate) -> JobRequest:
    """The JobSpec ``body`` asks for; :class:`InvalidSpec` naming OpenAI's fields (every refusal
    found at once, then the spec's own checks)."""
    problems = _refusals(body)
    method = body.method
    rewards: list[dict[str, Any]] = []
    if method is not None and method.reinforcement is not None:
        try:
            rewards = rewards_from_openai_grader(method.reinforcement.grader)
        except SpecError as exc:
            problems.append(SpecError(_joined(GRADER, exc.field), exc.reason))
    if problems:
        raise InvalidSpec(problems)
    assert method is not None and method.reinforcement is not None  # refused above otherwise
    spec: dict[str, Any] = {
        "name": body.suffix if body.suffix is not None else default_name(body.model),
        "model": {"source": body.model},
        "dataset": {"source": f"file:{body.training_file}"},
        "rewards": rewards,
        "grpo": _grpo(method.reinforcement.hyperparameters, body.seed, body.validation_file is not None),
    }
    if body.validation_file is not None:
        spec["eval_dataset"] = {"source": f"file:{body.validation_file}"}
    try:
        parsed = parse_spec(spec, JobSpec)
    except InvalidSpec as exc:
        raise in_openai_terms(exc) from None
    stored = {"method": method.model_dump(mode="json", exclude_unset=True), "metadata": body.metadata,
              "suffix": body.suffix}
    return JobRequest(parsed, stored)


def _refusals(body: FineTuningJobCreate) -> list[SpecError]:
    """What the service does not do, each told at the field that asks for it."""
    found = [_model_problem(body.model),
             _file_problem(body.training_file, "training_file"),
             _file_problem(body.validation_file, "validation_file")]
    if body.hyperparameters:
        found.append(SpecError("hyperparameters", "OpenAI deprecated the top-level hyperparameters; give "
                                                  f"them in {HYPERPARAMETERS}"))
    if body.integrations:
        found.append(SpecError("integrations", "not offered here: a job's experiment trackers are its "
                                               "spec's report_to (tensorboard, wandb, mlflow), set through "
                                               "POST /v1/jobs"))
    found += _method_problems(body)
    return [problem for problem in found if problem is not None]


def _model_problem(model: str) -> SpecError | None:
    scheme, colon, location = model.partition(":")
    if colon and scheme in MODEL_SCHEMES and location.strip():
        return None  # its form is the spec's to check (model.source)
    return SpecError("model", (
        f"'{model[:80]}' is not a model this service can load (an OpenAI model name?). This service trains "
        "open-weight models itself: send 'path:NAME' (a model folder the operator provides), "
        "'hf:owner/name' (from the Hugging Face hub, where the service allows it), 'file:ID' (a model "
        "archive you uploaded with purpose=model) or 'job:ID[@STEP]' (another job's model: a job's "
        "fine_tuned_model)"))


def _file_problem(file_id: str | None, field: str) -> SpecError | None:
    if file_id is None or _FILE_ID.fullmatch(file_id):
        return None
    return SpecError(field, f"'{file_id[:80]}' is not a file id: upload the JSONL with POST /v1/files "
                            "(purpose=fine-tune) and give the id it answers (file-...)")


def _method_problems(body: FineTuningJobCreate) -> list[SpecError]:
    method = body.method
    if method is None:
        return [SpecError("method", "give method {type: reinforcement, reinforcement: {grader: ...}}: this "
                                    "service trains with reinforcement fine-tuning (GRPO) only, so there is "
                                    "no default method")]
    if method.type != "reinforcement":
        return [SpecError("method.type", f"'{method.type}' fine-tuning is not offered: this service "
                                         "trains with GRPO, a reinforcement method; send type "
                                         "'reinforcement' with a grader that scores the model's answers")]
    found = [SpecError(f"method.{name}", "only method.reinforcement is read (method.type is reinforcement)")
             for name in ("supervised", "dpo") if getattr(method, name) is not None]
    if method.reinforcement is None:
        return [*found, SpecError("method.reinforcement", "give {grader: ..., hyperparameters: ...}")]
    hyper = method.reinforcement.hyperparameters
    if hyper.reasoning_effort is not None:
        found.append(SpecError(f"{HYPERPARAMETERS}.reasoning_effort", (
            "the models this service trains have no reasoning effort setting; leave it out (how their "
            "reasoning is read is the spec's reasoning section, POST /v1/jobs)")))
    if body.validation_file is None:
        found += [SpecError(f"{HYPERPARAMETERS}.{name}", "evaluation runs on the validation_file: give one")
                  for name in ("eval_interval", "eval_samples") if getattr(hyper, name) != AUTO]
    if hyper.compute_multiplier != AUTO:
        generations = generations_for(hyper.compute_multiplier)
        if not MIN_GENERATIONS <= generations <= MAX_GENERATIONS:
            low, high = MIN_GENERATIONS / BASE_GENERATIONS, MAX_GENERATIONS / BASE_GENERATIONS
            found.append(SpecError(f"{HYPERPARAMETERS}.compute_multiplier", (
                f"gives {generations} completions per prompt (round({BASE_GENERATIONS} × multiplier), "
                f"grpo.num_generations), which must be {MIN_GENERATIONS}-{MAX_GENERATIONS}: a multiplier "
                f"of {low:g} to {high:g}")))
    return found


def generations_for(multiplier: float) -> int:
    """``compute_multiplier`` -> ``grpo.num_generations``: the default scaled, rounded half up."""
    return math.floor(BASE_GENERATIONS * multiplier + 0.5)


def _grpo(hyper: ReinforcementHyperparameters, seed: int | None, evaluated: bool) -> dict[str, Any]:
    """The ``grpo:`` fields the hyperparameters set; ``auto`` sets none (the default stands)."""
    given = {name: value for name, value in hyper.model_dump().items() if value != AUTO}
    grpo: dict[str, Any] = {}
    if "n_epochs" in given:
        grpo["num_train_epochs"] = given["n_epochs"]
    if "batch_size" in given:
        grpo["prompts_per_step"] = given["batch_size"]
    if "learning_rate_multiplier" in given:
        grpo["learning_rate"] = given["learning_rate_multiplier"] * BASE_LEARNING_RATE
    if "compute_multiplier" in given:
        grpo["num_generations"] = generations_for(given["compute_multiplier"])
    if evaluated:
        grpo["eval_strategy"] = "steps"
        grpo["eval_steps"] = given.get("eval_interval", AUTO_EVAL_STEPS)
        if "eval_samples" in given:
            grpo["eval_num_generations"] = given["eval_samples"]
    if seed is not None:
        grpo["seed"] = seed
    return grpo


def openai_field(field: str) -> str:
    """Where a field of the job's spec came from in the create: ``grpo.num_train_epochs`` ->
    ``method.reinforcement.hyperparameters.n_epochs``, ``rewards.0.args.operation`` ->
    ``method.reinforcement.grader.operation`` (the grader is the job's one reward, its fields its
    args), ``rewards.0.name`` -> the grader's ``type``; others keep their name."""
    parts = field.split(".")
    if parts[0] == "rewards":
        if parts[2:3] == ["args"]:
            return _joined(GRADER, ".".join(parts[3:]))
        return _joined(GRADER, "type") if parts[2:3] == ["name"] else GRADER
    for end in range(len(parts), 0, -1):
        found = OPENAI_FIELDS.get(".".join(parts[:end]))
        if found is not None:
            return found
    return field


def in_openai_terms(exc: InvalidSpec) -> InvalidSpec:
    """``exc`` with each error at the OpenAI field it came from; the message says which field
    of the job's spec it is, where that is another name."""
    errors = []
    for error in exc.errors:
        field = openai_field(error.field)
        same = field == error.field or error.field.startswith("rewards.")
        reason = error.reason if same else f"{error.reason} ({error.field} in the job's spec)"
        errors.append(SpecError(field, reason))
    return InvalidSpec(errors)


def _joined(prefix: str, field: str) -> str:
    return f"{prefix}.{field}" if field else prefix
