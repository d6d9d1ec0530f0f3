"""Wire schemas of OpenAI's grader endpoints (``/v1/fine_tuning/alpha/graders/run`` and
``/validate``), in OpenAI's shapes so its client reads them: a grader object, a model sample and
a dataset item in; a reward and its metadata out."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.reward_trials import MAX_TEXT_CHARS


class GraderValidateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: dict[str, Any] = Field(description="An OpenAI grader object: string_check, text_similarity, "
                                               "python, score_model, label_model or multi")


class GraderValidateRead(BaseModel):
    grader: dict[str, Any] = Field(description="The grader, as it was sent")


class GraderRunRequest(GraderValidateRequest):
    model_sample: str = Field(max_length=MAX_TEXT_CHARS, description="The model's output: "
                              "`{{sample.output_text}}` (and `{{sample.output_json}}` when it is JSON)")
    item: dict[str, Any] | None = Field(None, max_length=64, description="The dataset row: `{{item.*}}`; its "
                                        "`messages` (or `prompt`) is the prompt a python grader sees")


class GraderRunErrors(BaseModel):
    """OpenAI's error flags; the ones that apply to this service's graders can be set."""

    formula_parse_error: bool = False
    invalid_variable_error: bool = Field(False, description="A template named a key the item or sample lacks")
    model_grader_parse_error: bool = False
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    model_grader_server_error_details: str | None = None
    other_error: bool = Field(False, description="The grader could not score the sample for another reason")
    python_grader_runtime_error: bool = Field(False, description="A python grader raised or answered "
                                                                 "something other than a number")
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = Field(False, description="The grader ran out of its time")


class GraderRunMetadata(BaseModel):
    name: str
    type: str
    errors: GraderRunErrors
    execution_time: float = Field(description="Seconds the run took, as the service measured it")
    scores: dict[str, Any] = Field(default_factory=dict)
    token_usage: int | None = None
    sampled_model_name: str | None = None


class GraderRunRead(BaseModel):
    reward: float = Field(description="The grader's score (0 when it could not score: see `errors`)")
    metadata: GraderRunMetadata
    sub_rewards: dict[str, Any] = Field(default_factory=dict)
    model_grader_token_usage_per_model: dict[str, Any] = Field(default_factory=dict)
