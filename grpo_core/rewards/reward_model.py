"""``reward_model``: a sequence-classification model scores prompt + completion, as TRL's reward
models do. The model is loaded once, when the job binds its rewards, onto the job's own device
(each rank of a multi-GPU job has its own copy and scores its own rows) in the job's dtype,
in eval mode with no gradients; its forward passes run in batches of ``batch_size``.

This module is torch-free (the API validates args and serves the catalog from it); loading and
scoring are in :mod:`grpo_core.rewards.reward_model_scoring`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_core.rewards.registry import RewardContext, RewardDefinition, RewardFn
from grpo_core.spec.run_spec import split_source

__all__ = ["REWARD_MODEL", "RewardModelArgs"]


class RewardModelArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(..., min_length=1, max_length=1024, description=(
        "path:NAME (a Hugging Face folder of a *ForSequenceClassification model under the models "
        "root; relative to the spec's folder in `grpo train`) or hf:owner/name[@revision] where the "
        "hub is allowed."))
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
        split_source(value)
        return value


def _build(args: RewardModelArgs, context: RewardContext) -> RewardFn:
    # torch and transformers only here, on the worker: the web process never builds a reward.
    from grpo_core.rewards.reward_model_scoring import load_scorer

    return load_scorer(args, context)


REWARD_MODEL = RewardDefinition(
    "reward_model",
    "The logit of a local sequence-classification reward model on prompt + completion (with the "
    "reward model's chat template when the prompt is a list of messages), as TRL scores them.",
    RewardModelArgs,
    _build,
    model_sources=lambda args: {"model": args.model},
)
