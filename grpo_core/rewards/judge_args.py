"""``score_model`` and ``label_model``: OpenAI's model graders, with a judge this service loads.

OpenAI's graders of these types call one of OpenAI's hosted models. Here the judge is a local
causal LM named as ``reward_model`` names its model (``path:``, ``hf:`` where the hub is allowed,
``file:`` and ``job:`` in the service), loaded once when the job binds its rewards, on the job's device: so a
grader written for OpenAI keeps its fields and its meaning (``input`` messages templated with
``{{sample.output_text}}`` and ``{{item.COLUMN}}``, :mod:`grpo_core.rewards.templates`; ``range``;
``labels`` and ``passing_labels``) and only its ``model`` changes. A hosted model's name
(``o3-mini``) is refused at submit rather than silently mapped to something else.

What the judge reads is the templated messages, as written, through its own chat template: nothing
is added to them (no instruction about the output's format that OpenAI would not have given), so a
grader's prompt has to ask for the answer it wants. How the answer is read is in
:mod:`grpo_core.rewards.judge_scoring`.

OpenAI fields with no meaning here are accepted so that a grader can be pasted as it is, but not
silently reinterpreted: ``pass_threshold`` is ignored (only OpenAI's evals read it), and
``sampling_params.reasoning_effort`` must be null (a local model has no such setting). One field is
this service's own: ``batch_size``, how many rows the judge generates for at once.

This module is torch-free (the API validates args and serves the catalog from it); loading and
generation are in :mod:`grpo_core.rewards.judge_scoring`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator

from grpo_core.rewards.grader_rows import ALWAYS_IN_ITEM
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn
from grpo_core.rewards.templates import MAX_TEMPLATE_CHARS, check_template, item_columns
from grpo_core.spec.sources import reward_model_source

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "LABEL_MODEL",
    "MAX_TOKENS",
    "SCORE_MODEL",
    "JudgeArgs",
    "JudgeMessage",
    "LabelModelArgs",
    "SamplingParams",
    "ScoreModelArgs",
]

DEFAULT_MAX_TOKENS = 64  # a verdict, not an essay: what the judge may write when nothing is set
MAX_TOKENS = 1024  # every row of a step waits for its judge: a bound keeps a step's time bounded
MAX_MESSAGES = 32
MAX_LABELS = 64
MAX_LABEL_CHARS = 200
SCORE_BOUND = 1e12  # bounds of range and pass_threshold: any real scale fits, and stays finite
_MODEL_HELP = ("path:NAME (a Hugging Face causal LM folder with a chat template, under the models root; "
               "relative to the spec's folder in `grpo train`), hf:owner/name[@revision] where the hub is "
               "allowed, or in the service file:ID (a model archive the team uploaded) or job:ID[@STEP] "
               "(another job of the team's final model or checkpoint)")


def _judge_source(value: str) -> str:
    """``value`` when it is a source ``reward_model`` accepts; a ValueError saying what a judge
    must be otherwise, a hosted model's name (OpenAI's ``o3-mini``) in particular."""
    try:
        reward_model_source(value)  # file: and job: sources are the service's to resolve
    except ValueError as exc:
        scheme = value.partition(":")[0].strip() if ":" in value else None
        if scheme is None:  # a bare name: what an OpenAI grader gives
            why = f"'{value:.100}' names no model here (the judge runs on this service, not at OpenAI)"
        elif scheme in ("path", "hf", "file", "job"):
            why = str(exc)  # a known scheme, malformed: what is wrong with it
        else:
            why = f"'{scheme:.20}:' is no source of a model"
        raise ValueError(f"the judge must be a model this service can load: {why}; name it as "
                         f"{_MODEL_HELP}") from None
    return value


class TextContent(BaseModel):
    """OpenAI's text content object, accepted in place of a plain string."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["input_text", "output_text"] = Field(..., description="OpenAI's text content types.")
    text: str = Field(..., max_length=MAX_TEMPLATE_CHARS, description="The template.")

    @field_validator("text")
    @classmethod
    def _template(cls, value: str) -> str:
        return check_template(value)


def _content_kind(value: object) -> str:
    # A discriminator, so that a bad content object is reported as one, not as "not a string".
    return "object" if isinstance(value, dict | TextContent) else "string"


class JudgeMessage(BaseModel):
    """One message of the judge's input, its content a template."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant", "developer"] = Field(..., description=(
        "Who says it. developer is given to the judge's chat template as system, the role chat "
        "templates know (OpenAI's newer models read developer messages as system ones)."))
    content: Annotated[
        Annotated[str, Field(max_length=MAX_TEMPLATE_CHARS), Tag("string")]
        | Annotated[TextContent, Tag("object")],
        Discriminator(_content_kind),
    ] = Field(..., description=(
        "A template: {{sample.output_text}} (the completion's answer), {{sample.output_json.KEY}}, "
        "{{item.COLUMN}} (the dataset row's columns; {{item.prompt}} is the prompt), at most "
        f"{MAX_TEMPLATE_CHARS} characters; or OpenAI's {{type: input_text, text}} object."))
    type: Literal["message"] | None = Field(None, description="OpenAI's item type; only 'message'.")

    @field_validator("content")
    @classmethod
    def _template(cls, value: str | TextContent) -> str | TextContent:
        return check_template(value) if isinstance(value, str) else value

    @property
    def template(self) -> str:
        return self.content if isinstance(self.content, str) else self.content.text


class SamplingParams(BaseModel):
    """How the judge decodes (OpenAI's ``sampling_params``); null fields take the defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(None, ge=0, le=2, description=(
        "0 or null: greedy decoding (the judge's most likely answer, the same every time); above 0, "
        "sampling at that temperature."))
    top_p: float | None = Field(None, gt=0, le=1, description=(
        "Nucleus sampling's probability mass when sampling (null: 1, all of it); no effect when greedy."))
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description=(
        "Seeds each call's sampling, so the same rows batched the same way are judged the same; "
        "null: unseeded. Either way the training's own random streams are left as they were."))
    max_completions_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description=(
        f"Most tokens the judge writes per row (null: {DEFAULT_MAX_TOKENS}); an answer cut there is "
        "read as it is."))
    reasoning_effort: str | None = Field(None, max_length=32, description=(
        "Must be null: the judge is a model loaded here, with no reasoning-effort setting."))

    @field_validator("reasoning_effort")
    @classmethod
    def _no_effort(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("the judge is a model this service loads, which has no reasoning-effort "
                             "setting: leave reasoning_effort null (or out)")
        return value

    @property
    def max_tokens(self) -> int:
        return self.max_completions_tokens or DEFAULT_MAX_TOKENS


class JudgeArgs(BaseModel):
    """What both model graders share: the judge and its messages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(..., min_length=1, max_length=1024, description=(
        f"The judge: {_MODEL_HELP}. OpenAI's model names are refused: the judge runs on this "
        "service, loaded once per job on the job's device."))
    input: list[JudgeMessage] = Field(..., min_length=1, max_length=MAX_MESSAGES, description=(
        "The messages the judge reads, templated per row and given to its chat template as written."))
    batch_size: int = Field(16, ge=1, le=1024, description=(
        "Rows the judge generates for at once (this service's own field; OpenAI's graders have none)."))

    @field_validator("model")
    @classmethod
    def _model_source(cls, value: str) -> str:
        return _judge_source(value)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams()

    def templates(self) -> list[str]:
        return [message.template for message in self.input]


def _finite_bound(value: float) -> float:
    if not math.isfinite(value) or abs(value) > SCORE_BOUND:
        raise ValueError(f"must be a finite number within ±{SCORE_BOUND:g}")
    return value


class ScoreModelArgs(JudgeArgs):
    range: tuple[float, float] = Field((0.0, 1.0), description=(
        "[min, max]: a score outside it (or no number in the judge's answer) leaves the row unscored. "
        "Scores are used as they are, not rescaled."))
    sampling_params: SamplingParams | None = Field(None, description=(
        "temperature, top_p, seed, max_completions_tokens; reasoning_effort must be null."))
    pass_threshold: float | None = Field(None, ge=-SCORE_BOUND, le=SCORE_BOUND, description=(
        "Accepted and ignored: only OpenAI's evals read it."))

    @field_validator("range")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = (_finite_bound(bound) for bound in value)
        if not low < high:
            raise ValueError(f"must be [min, max] with min < max; got [{low:g}, {high:g}]")
        return low, high

    @property
    def sampling(self) -> SamplingParams:
        return self.sampling_params or SamplingParams()


class LabelModelArgs(JudgeArgs):
    labels: list[str] = Field(..., min_length=1, max_length=MAX_LABELS, description=(
        "The labels the judge chooses among (matched without regard to case)."))
    passing_labels: list[str] = Field(..., min_length=1, max_length=MAX_LABELS, description=(
        "The labels that score 1.0; another label scores 0.0. A subset of labels."))

    @field_validator("labels")
    @classmethod
    def _distinct(cls, labels: list[str]) -> list[str]:
        seen: set[str] = set()
        for label in labels:
            if not label.strip() or len(label) > MAX_LABEL_CHARS:
                raise ValueError(f"each label is 1 to {MAX_LABEL_CHARS} characters, not blank")
            key = label.strip().casefold()
            if key in seen:  # the judge's answer is matched without case: two would be one
                raise ValueError(f"'{label}' is given twice (labels are matched without regard to case)")
            seen.add(key)
        return labels

    @field_validator("passing_labels")
    @classmethod
    def _subset(cls, passing: list[str], info: ValidationInfo) -> list[str]:
        labels = info.data.get("labels")
        if labels is None:  # labels themselves were refused: that error is the one to read
            return passing
        unknown = [label for label in passing if label not in labels]
        if unknown:
            raise ValueError(f"must be a subset of labels; '{unknown[0]}' is not one of them")
        return passing


def _columns(args: JudgeArgs) -> list[str]:
    # item.prompt is the row's prompt, which every item has; any other item key is a column.
    return [column for column in item_columns(*args.templates()) if column not in ALWAYS_IN_ITEM]


def _load(args: JudgeArgs, context: RewardContext, verdict: Callable[[Any], Any]) -> RewardFn:
    # torch and transformers only here, on the worker: the web process never builds a reward.
    from grpo_core.rewards import judge_scoring as scoring

    sampling = args.sampling
    decoding = scoring.Decoding(sampling.max_tokens, sampling.temperature or 0.0, sampling.top_p or 1.0,
                                sampling.seed)
    return scoring.load_judge(args.model, [(message.role, message.template) for message in args.input],
                              decoding, args.batch_size, verdict(scoring), context)


def _build_score(args: ScoreModelArgs, context: RewardContext) -> RewardFn:
    return _load(args, context, lambda scoring: scoring.score_verdict(*args.range))


def _build_label(args: LabelModelArgs, context: RewardContext) -> RewardFn:
    return _load(args, context, lambda scoring: scoring.label_verdict(args.labels, args.passing_labels))


SCORE_MODEL = RewardDefinition(
    "score_model",
    "OpenAI's score_model grader with a local judge: a causal LM reads the templated input messages "
    "through its chat template and its answer's number (a JSON result or score, else the last "
    "number) is the score, kept as it is when within range.",
    ScoreModelArgs,
    _build_score,
    required_columns=_columns,
    model_sources=lambda args: {"model": args.model},
)

LABEL_MODEL = RewardDefinition(
    "label_model",
    "OpenAI's label_model grader with a local judge: a causal LM reads the templated input messages "
    "through its chat template and answers with one of labels; 1.0 for a passing label, 0.0 for "
    "another.",
    LabelModelArgs,
    _build_label,
    required_columns=_columns,
    model_sources=lambda args: {"model": args.model},
)
