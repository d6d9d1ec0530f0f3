"""``GRPOConfig``: the ``grpo:`` section of a job spec, validated before any step runs.

Field names follow TRL's ``GRPOConfig`` so a TRL user can paste theirs. Every field has bounds;
unknown fields are rejected. Cross-field rules (``epsilon_high >= epsilon``, ``delta`` above the
upper clip, batch divisible by the accumulation steps) are validators too, so a bad config never
reaches the trainer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none"]
LRScheduler = Literal["constant", "linear", "cosine"]


class GRPOConfig(BaseModel):
    """Hyper-parameters of one GRPO run (DESIGN §3, GRPO_REFERENCE)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    num_generations: int = Field(8, ge=2, le=1024, description="G: completions sampled per prompt.")
    prompts_per_step: int = Field(8, ge=1, le=4096, description="B: prompts per optimizer step.")
    max_prompt_length: int = Field(256, ge=1, le=131072, description="Prompts are left-truncated to this.")
    max_completion_length: int = Field(256, ge=1, le=131072, description="Completions stop here.")
    temperature: float = Field(
        1.0, gt=0.0, le=10.0, description="Sampling temperature; log-probs use it too."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=100000, description="0 disables top-k filtering.")
    beta: float = Field(0.04, ge=0.0, le=100.0, description="KL coefficient; 0 builds no reference model.")
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="Lower clip range epsilon_low.")
    epsilon_high: float | None = Field(
        None, gt=0.0, le=10.0, description="Upper clip range; defaults to epsilon."
    )
    delta: float | None = Field(None, gt=1.0, le=1000.0, description="Dual-clip upper bound on the ratio.")
    loss_type: LossType = "dapo"
    scale_rewards: ScaleRewards = "group"
    num_iterations: int = Field(1, ge=1, le=64, description="mu: optimizer passes per generation batch.")
    mask_truncated_completions: bool = False
    drop_zero_std_groups: bool = Field(
        False, description="DAPO dynamic sampling: resample groups whose rewards are all equal."
    )
    max_resample_batches: int = Field(
        2, ge=0, le=64, description="Cap on extra generation batches per step for drop_zero_std_groups."
    )
    learning_rate: float = Field(1.0e-6, gt=0.0, le=1.0)
    lr_scheduler: LRScheduler = "constant"
    warmup_steps: int = Field(0, ge=0, le=10_000_000)
    weight_decay: float = Field(0.0, ge=0.0, le=10.0)
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0)
    adam_epsilon: float = Field(1.0e-8, gt=0.0, le=1.0)
    max_grad_norm: float = Field(1.0, ge=0.0, le=1.0e6, description="0 disables clipping.")
    gradient_accumulation_steps: int = Field(1, ge=1, le=4096)
    max_steps: int = Field(500, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    gradient_checkpointing: bool = False

    @property
    def epsilon_low(self) -> float:
        return self.epsilon

    @property
    def clip_high(self) -> float:
        """The upper clip range actually used (epsilon_high, else epsilon)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    # Cross-field rules are field validators (not a model validator) so the error's location is
    # the field to fix. Each checks against fields declared above it, which pydantic has already
    # validated into ``info.data``.
    @field_validator("epsilon_high")
    @classmethod
    def _clip_higher_only(cls, value: float | None, info: ValidationInfo) -> float | None:
        epsilon = info.data.get("epsilon")
        if value is not None and epsilon is not None and value < epsilon:
            raise ValueError(f"must be >= epsilon ({epsilon}); clip-higher only widens the upper range")
        return value

    @field_validator("delta")
    @classmethod
    def _dual_clip_above_the_trust_region(cls, value: float | None, info: ValidationInfo) -> float | None:
        # At or below 1 + clip_high the cap binds before the clip does: it would cut positive
        # advantages inside the trust region and stop bounding negative ones.
        epsilon = info.data.get("epsilon")
        epsilon_high = info.data.get("epsilon_high")
        clip_high = epsilon if epsilon_high is None else epsilon_high
        if value is not None and clip_high is not None and value <= 1.0 + clip_high:
            raise ValueError(f"must be > 1 + epsilon_high ({1.0 + clip_high:g}) so the dual clip only acts "
                             "on ratios the ordinary clip leaves unbounded")
        return value

    @field_validator("gradient_accumulation_steps")
    @classmethod
    def _divides_the_batch(cls, value: int, info: ValidationInfo) -> int:
        b, g = info.data.get("prompts_per_step"), info.data.get("num_generations")
        if b is not None and g is not None and (b * g) % value != 0:
            raise ValueError(
                f"must divide prompts_per_step*num_generations = {b * g} "
                "so every micro-batch has the same number of rows"
            )
        return value

    # --- TRL generation batching and GSPO (issue 13 item 8) -----------------------------------
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="token: one importance ratio per token; sequence (GSPO): exp of the mean over the "
        "completion's tokens of logprobs - old_logprobs, shared by its tokens and clipped the same way.",
    )
