"""Wire schemas of a rewards dry run (``POST /v1/rewards/run``): a spec's rewards and a few
hand-written samples in, each sample's scores out, in sample order."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_core.spec.run_spec import RewardSpec

MAX_SAMPLES = 64
MAX_REWARDS = 16
MAX_SPEC_CHARS = 1024 * 1024
MAX_TRIAL_SECONDS = 30.0  # a dry run answers within a request's time
MAX_TEXT_CHARS = 32768


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(max_length=32, description="system, user or assistant")
    content: str = Field(max_length=MAX_TEXT_CHARS)


class TrialSampleIn(BaseModel):
    """One row as training would score it: the prompt, one completion, the row's other columns."""

    model_config = ConfigDict(extra="forbid")

    prompt: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | Annotated[list[ChatMessage], Field(
        min_length=1, max_length=64)] = Field(description="The prompt: text, or chat messages as a dataset "
                                                          "row holds them")
    completion: str = Field(max_length=MAX_TEXT_CHARS, description="The completion to score (its answer)")
    columns: dict[str, Any] = Field(default_factory=dict, max_length=64,
                                    description="The row's other dataset columns (`answer`, `tests`...)")

    def prompt_value(self) -> str | list[dict[str, Any]]:
        """The prompt as a dataset row holds it: text, or messages as plain objects."""
        if isinstance(self.prompt, str):
            return self.prompt
        return [message.model_dump() for message in self.prompt]


class RewardTrialRequest(BaseModel):
    """The rewards to try: a ``rewards`` list, or a whole ``spec`` as text (JSON or YAML, as the
    dashboard's form holds it) of which ``rewards:`` and ``reward_timeout_seconds`` are used."""

    model_config = ConfigDict(extra="forbid")

    rewards: list[RewardSpec] | None = Field(None, min_length=1, max_length=MAX_REWARDS,
                                             description="As in a spec's `rewards:`; checked as at submit")
    spec: str | None = Field(None, max_length=MAX_SPEC_CHARS,
                             description="Instead of `rewards`: a spec's text (JSON or YAML); its "
                                         "`rewards:` and `reward_timeout_seconds` are used")
    samples: list[TrialSampleIn] = Field(min_length=1, max_length=MAX_SAMPLES)
    reward_timeout_seconds: float = Field(10.0, gt=0, le=MAX_TRIAL_SECONDS,
                                          description="Budget of each reward's call, as in a spec")
    pool: str | None = Field(None, max_length=64, description="Whose verifiers `http_verifier` may "
                             "name, as a job in that pool could (default: the default pool)")

    @model_validator(mode="after")
    def _one_source_of_rewards(self) -> RewardTrialRequest:
        if (self.rewards is None) == (self.spec is None):
            raise ValueError("give either `rewards` (a list) or `spec` (a spec's text), not both or neither")
        return self


class SampleScoresRead(BaseModel):
    reward: float | None = Field(description="The weighted sum a training step would compute; null "
                                             "when no reward scored the sample")
    rewards: dict[str, float | None] = Field(description="Each reward by its metric name, after its "
                                                         "clip and gate; null: not scored")
    problems: dict[str, str] = Field(default_factory=dict,
                                     description="Why a reward left this sample unscored, where it says")


class RewardTrialRead(BaseModel):
    items: list[SampleScoresRead]
