"""``POST /v1/jobs?dry_run=true``'s answer: the spec as a submit would store it, what the submit
would warn of, and the job's GPU-hours estimated from its shape and its pool's throughput
(:mod:`api.limits.gpu_estimate`), beside what its team has left of its budget."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api.schemas.jobs import SpecWarningRead
from api.schemas.usage import BudgetRead


class GpuEstimate(BaseModel):
    gpu_hours: float | None = Field(description=(
        "(resources.gpus × startup_gpu_seconds + tokens ÷ tokens_per_gpu_second) ÷ 3600 (GPUs × hours); "
        "null while the run's steps are unknown (max_steps -1 over a file or hub dataset: counted when "
        "the job loads it)"))
    tokens_per_step: int = Field(description=(
        "grpo.prompts_per_step × num_generations × (prompt_tokens + max_completion_length)"))
    prompt_tokens: int = Field(description=(
        "A prompt's tokens, guessed: the inline prompts' mean length in characters ÷ 4, at most "
        "max_prompt_length; max_prompt_length for a file or hub dataset"))
    steps: int | None = Field(description="The run's optimizer steps (null: unknown until it loads its data)")
    tokens: int | None = Field(description=(
        "tokens_per_step × the steps that generate (steps ÷ num_iterations, rounded up), as the "
        "num_tokens metric counts them"))
    tokens_per_gpu_second: float = Field(description="The pool's rate as a job trains, past its first step")
    startup_gpu_seconds: float = Field(description=(
        "Per GPU, what a job of the pool holds beyond its tokens at that rate: dispatch, process start, "
        "model loading, the first step, the final model (0 by default)"))
    basis: Literal["measured", "default"] = Field(description=(
        "measured: on the pool's latest succeeded jobs; default: none has succeeded yet, so "
        "GRPO_ESTIMATE_TOKENS_PER_GPU_SECOND and no start-up"))
    measured_jobs: int = Field(description="How many succeeded jobs it was measured on (0: default)")


class JobDryRun(BaseModel):
    dry_run: Literal[True] = Field(True, description="Nothing was created: the answer of ?dry_run=true")
    spec: dict[str, Any] = Field(description=(
        "The spec as the job would be stored (the team's priority, an uploaded dataset's prompt field "
        "filled in)"))
    warnings: list[SpecWarningRead] = Field(default_factory=list,
                                            description="Fields accepted but ignored, as a submit says them")
    estimate: GpuEstimate
    team_budget: BudgetRead = Field(description="What the team has left of its GPU-hour budget this period")
