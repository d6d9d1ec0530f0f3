"""Wire schemas of OpenAI's fine-tuning API as this service answers it (``/v1/fine_tuning/jobs``, and
the answers about a ``purpose=fine-tune`` upload): a create's body, and the ``fine_tuning.job``,
``fine_tuning.job.event``, ``fine_tuning.job.checkpoint``, ``file`` and ``list`` objects, with
OpenAI's field names and types (Unix seconds, ``ftjob-`` ids). What maps to what is
:mod:`api.openai_compat`'s; :class:`FineTuningJobFacts` is what the store reads of a job for it."""

from __future__ import annotations

import math
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, field_validator

from api.schemas.jobs import JobRead

T = TypeVar("T")
AUTO = "auto"
# OpenAI's limits on metadata: 16 pairs, keys of 64 characters, values of 512.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
OpenAIStatus = Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"]


def _auto_or(whole: bool) -> PlainValidator:
    """``"auto"`` or a number above 0 (``whole``: a whole one, as an int): one error naming the
    field, not one per member of a union."""
    what = "a whole number above 0" if whole else "a number above 0"

    def check(value: Any) -> Any:
        if value == AUTO:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be 'auto' or {what}")
        if not math.isfinite(value) or value <= 0 or (whole and value != int(value)):
            raise ValueError(f"must be 'auto' or {what}")
        return int(value) if whole else float(value)

    return PlainValidator(check, json_schema_input_type=Literal["auto"] | (int if whole else float))


AutoWhole = Annotated[Literal["auto"] | int, _auto_or(True)]
AutoNumber = Annotated[Literal["auto"] | float, _auto_or(False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReinforcementHyperparameters(_Strict):
    """``method.reinforcement.hyperparameters``; ``auto`` (or leaving one out) takes this service's
    default. docs/user_guide.md ("Coming from OpenAI's fine-tuning") says what each becomes."""

    n_epochs: AutoWhole = Field(AUTO, description="Passes over the training file: `grpo.num_train_epochs`")
    batch_size: AutoWhole = Field(AUTO, description="Prompts per optimizer step: `grpo.prompts_per_step`")
    learning_rate_multiplier: AutoNumber = Field(
        AUTO, description="`grpo.learning_rate` = this × 1e-6 (`grpo.learning_rate`'s default)")
    eval_interval: AutoWhole = Field(AUTO, description="Optimizer steps between evaluations on "
                                     "`validation_file`: `grpo.eval_steps` (auto: a tenth of the run)")
    eval_samples: AutoWhole = Field(AUTO, description="Completions per validation prompt: "
                                    "`grpo.eval_num_generations`")
    compute_multiplier: AutoNumber = Field(AUTO, description="`grpo.num_generations` = round(8 × this), "
                                           "8 being its default")
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = Field(
        None, description="Refused: the models this service trains have no such setting")


class ReinforcementMethod(_Strict):
    grader: dict[str, Any] = Field(description="An OpenAI grader object (string_check, text_similarity, "
                                   "python, score_model, label_model, multi): the job's reward")
    hyperparameters: ReinforcementHyperparameters = Field(default_factory=ReinforcementHyperparameters)


class Method(_Strict):
    type: Literal["supervised", "dpo", "reinforcement"] = Field(
        description="`reinforcement` only: this service trains with GRPO")
    reinforcement: ReinforcementMethod | None = None
    supervised: dict[str, Any] | None = None
    dpo: dict[str, Any] | None = None


class FineTuningJobCreate(_Strict):
    """``POST /v1/fine_tuning/jobs``: OpenAI's create, reinforcement method only."""

    model: str = Field(min_length=1, max_length=1024, description="A model source this service loads: "
                       "`path:NAME`, `hf:owner/name`, `file:ID` (an uploaded model) or `job:ID[@STEP]` "
                       "(a job's model, e.g. a job's `fine_tuned_model`)")
    training_file: str = Field(min_length=1, max_length=64, description="An uploaded dataset's id")
    validation_file: str | None = Field(None, min_length=1, max_length=64,
                                        description="An uploaded dataset's id: evaluated on during training")
    method: Method | None = Field(None, description="`{type: reinforcement, reinforcement: {grader, "
                                  "hyperparameters}}`")
    hyperparameters: dict[str, Any] | None = Field(None, description="Deprecated by OpenAI: give them in "
                                                   "`method.reinforcement.hyperparameters`")
    suffix: str | None = Field(None, description="The job's name")
    seed: int | None = Field(None, description="`grpo.seed` (default 42)")
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA_PAIRS,
                                            description="Up to 16 pairs, stored and returned")
    integrations: list[dict[str, Any]] | None = Field(None, description="Refused unless empty: trackers are "
                                                      "the spec's `report_to` (POST /v1/jobs)")

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, text in (value or {}).items():
            if not 1 <= len(key) <= MAX_METADATA_KEY:
                raise ValueError(f"keys are 1-{MAX_METADATA_KEY} characters")
            if len(text) > MAX_METADATA_VALUE:
                raise ValueError(f"values are at most {MAX_METADATA_VALUE} characters ({key!r:.70})")
        return value


class FineTuningJobFacts(BaseModel):
    """What the store reads of a job for its OpenAI view (not on the wire)."""

    job: JobRead = Field(description="The job, a summary (no spec)")
    organization: str = Field(description="Its team's name")
    spec: dict[str, Any] = Field(description="Of its stored spec: model.source, dataset.source, "
                                 "eval_dataset.source (null where absent) and the grpo section")
    openai_request: dict[str, Any] | None = Field(description="What an OpenAI create stored beside the "
                                                  "spec (method, metadata, suffix); null for our own submits")
    trained_tokens: int | None = Field(description="The newest step record's `num_tokens`")


class FineTuningJobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class FineTuningHyperparameters(BaseModel):
    """The hyperparameters the job trains with, resolved (no ``auto``)."""

    n_epochs: int | float | None = Field(description="null: the job trains for `grpo.max_steps` steps")
    batch_size: int
    learning_rate_multiplier: float
    eval_interval: int | float | None = Field(description="null: no evaluation")
    eval_samples: int
    compute_multiplier: float


class FineTuningJob(BaseModel):
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    id: str = Field(description="`ftjob-` and the job's id at /v1/jobs")
    created_at: int
    finished_at: int | None
    model: str
    fine_tuned_model: str | None = Field(description="`job:ID` once succeeded: a model source of specs "
                                         "and of a create's `model`")
    organization_id: str = Field(description="The team's name")
    status: OpenAIStatus
    training_file: str
    validation_file: str | None
    result_files: list[str]
    trained_tokens: int | None
    error: FineTuningJobError | None
    seed: int
    suffix: str | None = Field(description="The job's name")
    user_provided_suffix: str | None
    metadata: dict[str, str] | None
    method: dict[str, Any]
    hyperparameters: FineTuningHyperparameters
    estimated_finish: int | None = None
    integrations: list[dict[str, Any]] | None = None


class FineTuningJobEvent(BaseModel):
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    id: str = Field(description="`ftevent-` and the event's id")
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"]
    data: dict[str, Any] = Field(description="The event's data, with its type in this service under `event`")


class FineTuningJobCheckpoint(BaseModel):
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    id: str = Field(description="`ftckpt-JOB-STEP`")
    created_at: int
    fine_tuned_model_checkpoint: str = Field(description="`job:ID@STEP`: a model source")
    fine_tuning_job_id: str
    step_number: int
    metrics: dict[str, float | None] = Field(description="The step's metrics where it has them: `step`, "
                                             "`train_loss`, `train_reward_mean`, `valid_reward_mean`")


class ListPage(BaseModel, Generic[T]):
    """OpenAI's list: pass the last item's ``id`` as ``after`` for the next page."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool


class OpenAIFile(BaseModel):
    """A ``purpose=fine-tune`` upload as OpenAI's file object, with this service's own fields that do
    not clash with OpenAI's (the file is a dataset in every other respect)."""

    object: Literal["file"] = "file"
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["fine-tune"] = "fine-tune"
    status: Literal["uploaded", "processed", "error"]
    status_details: str | None = None
    expires_at: int | None = None
    format: str
    sha256: str
    columns: list[str] | None
    prompt_field: str | None
    rows: int | None


class OpenAIFileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
