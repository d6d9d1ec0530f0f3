"""``GET /v1/jobs/compare``'s answer: the jobs compared, each requested metric's points per
job, the metrics they have to pick from, and where their specs differ."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ComparedJob(BaseModel):
    id: int
    name: str
    status: str


class SpecDifference(BaseModel):
    field: str = Field(description="Dotted path into the spec; list items by index (`rewards.0.name`)")
    values: dict[int, Any] = Field(description="Each job's value there; null where its spec lacks it")


class Comparison(BaseModel):
    jobs: list[ComparedJob]  # in the order the ids were given
    metrics: dict[str, dict[int, list[tuple[int, float]]]] = Field(
        description="metric -> job id -> [[step, value], ...] in step order, thinned evenly when long")
    metric_names: list[str] = Field(description="Every numeric metric any of the jobs recorded")
    spec_diff: list[SpecDifference] = Field(description=(
        "The spec fields whose values differ, in path order, as many as fit in `GRPO_COMPARE_DIFF_BYTES` "
        "of JSON (256 KiB by default)"))
    spec_diff_omitted: int = Field(0, description=(
        "Differing fields left out of `spec_diff` because they did not fit in its byte budget (0: it is "
        "whole)"))
