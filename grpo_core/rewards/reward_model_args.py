"""The args of ``reward_model``, torch-free: the API validates them and the catalog shows their
schema, and the torch side (:mod:`grpo_core.rewards.reward_model_scoring`) reads them to load and
score, so they sit below both."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_core.spec.sources import reward_model_source

__all__ = ["RewardModelArgs"]


class RewardModelArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(..., min_length=1, max_length=1024, description=(
        "path:NAME (a Hugging Face folder of a *ForSequenceClassification model under the models "
        "root; relative to the spec's folder in `grpo train`), hf:owner/name[@revision] where the "
        "hub is allowed, or in the service file:ID (a model archive the team uploaded) or "
        "job:ID[@STEP] (another job of the team's final model or checkpoint)."))
    batch_size: int = Field(8, ge=1, le=1024, description="Texts per forward pass.")
    max_length: int = Field(1024, ge=8, le=131_072, description=(
        "Most tokens of prompt + completion scored; longer texts lose their beginning, since the "
        "score is read at the last token."))
    logit_index: int = Field(0, ge=0, le=1023, description=(
        "Which output logit is the reward (below the model's num_labels)."))
    completion: Literal["answer", "raw"] = Field("answer", description=(
        "Score the answer (reasoning stripped, as other rewards see it) or the raw completion."))

    @field_validator("model")
    @classmethod
    def _model_source(cls, value: str) -> str:
        return reward_model_source(value)  # file: and job: sources are the service's to resolve
