"""``JobSpec``: the service's job spec, the one contract for HTTP, ``grpo submit`` and the worker.

It is the core's :class:`~grpo_core.spec.run_spec.RunSpec` (what a run needs) plus what only the
service means: the scheduler's ``priority``, the ``resources.pool`` of workers to run on and the
job's GPU-hour budget (``resources.max_gpu_hours``), a ``stall_seconds`` limit, ``tags`` and a
``description`` to find the job by (:mod:`api.domain.job_labels`), ``job:ID[@STEP]`` model
sources (another job's model, the policy's or a reward's, which the worker resolves to a folder,
:mod:`worker.job_sources`, before the core sees it) and ``file:ID`` sources (a file the team
uploaded, ``POST /v1/files``: a model archive or a dataset, also a reward's model), which the
worker fetches from the object store. A subclass, so the wire format is the one stored specs and
clients already use: the same field names, in the same places, under the same schema names
(``JobSpec``, ``ModelSpec``, ``DatasetSpec``, ``ResourcesSpec``) in ``/openapi.json``.

Only shape and bounds are checked here, as in the core; whether a ``job:`` or ``file:`` source is
the team's and holds a model (or prompts) is checked at submit (:mod:`api.http.submission`).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from api.domain.job_labels import DESCRIPTION_DESCRIPTION, TAGS_DESCRIPTION, Description, Tags, unset
from api.vocabulary import DEFAULT_POOL, MAX_GPU_HOURS, POOL_NAME_PATTERN, Priority
from grpo_core.errors import SpecWarning
from grpo_core.spec import run_spec
from grpo_core.spec.run_spec import RunSpec
from grpo_core.spec.sources import FILE_SCHEME, JOB_SCHEME, file_source_id, named_job, split_source

# As the core's, plus job: and file:, whose syntax the core checks too (a reward's args take them).
_KNOWN_SCHEME = re.compile(r"^(path|hf|job|file):(.+)$")


def split_any_source(source: str) -> tuple[str, str]:
    """:func:`~grpo_core.spec.sources.split_source` of a source valid in a job spec, ``job:``
    sources included: ``"job:7@40"`` -> ``("job", "7@40")``."""
    if continued_job(source) is not None:
        return JOB_SCHEME, source.partition(":")[2].strip()
    file_id = file_source_id(source)
    if file_id is not None:
        return FILE_SCHEME, file_id
    return split_source(source)


def continued_job(source: str) -> tuple[int, int | None] | None:
    """The ``(job id, step or None)`` a ``job:`` model source (``model.source``, a reward's model)
    names; None for another scheme. Raises ValueError for a malformed ``job:`` source."""
    return named_job(source)


class ModelSpec(run_spec.ModelSpec):
    """The policy to train: where it comes from (in the service, also another job's model) and
    how it is loaded."""

    source: str = Field(..., max_length=1024, description="path:FOLDER (an operator's shared model), "
                        "hf:owner/name[@revision], file:ID (a model archive the team uploaded), or "
                        "job:ID[@STEP]: another job of the team's final model, or its checkpoint of STEP")

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        """Replaces the core's check (same name), which knows no ``job:`` or ``file:``."""
        if _KNOWN_SCHEME.match(value) is None:
            raise ValueError("must start with 'path:', 'hf:', 'file:' or (a model) 'job:'")
        split_any_source(value)
        return value


class DatasetSpec(run_spec.DatasetSpec):
    """The prompts: inline rows or a file or hub dataset (exactly one). A row's other columns reach
    the rewards by name (an answer to check, test cases to run)."""

    source: str | None = Field(None, max_length=1024, description="path:FILE (.jsonl, .json, .csv or "
                               ".parquet, under the service's data root: an operator's shared data), "
                               "file:ID (a dataset the team uploaded) or hf:dataset-id[@revision]")

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        """Replaces the core's check (same name), which knows no ``file:``."""
        if value is None:
            return None
        if value.partition(":")[0] == JOB_SCHEME:
            raise ValueError("a dataset comes from 'path:', 'hf:' or 'file:'; 'job:' names a model")
        if file_source_id(value) is None:
            split_source(value)
        return value


class ResourcesSpec(run_spec.ResourcesSpec):
    """Where the job runs."""

    pool: str = Field(DEFAULT_POOL, pattern=POOL_NAME_PATTERN,
                      description="The pool of workers to run on (GET /v1/cluster lists them).")
    max_gpu_hours: float | None = Field(
        None, gt=0, le=MAX_GPU_HOURS, allow_inf_nan=False, exclude_if=lambda value: value is None,
        description="In the service: the most GPU-hours (GPUs × hours held, every attempt counted) the "
        "job may use; reached, it is paused at its next step with its checkpoint, and resumes once "
        "raised (PATCH /v1/jobs/{id} with max_gpu_hours). Null: no limit but the team's budget. "
        "`grpo train` ignores it.")


def _described_as_in_core(name: str) -> str | None:
    return RunSpec.model_fields[name].description


class JobSpec(RunSpec):
    """A GRPO job: the model, its prompts, the rewards that score its completions and the
    hyper-parameters (``grpo``, with TRL's GRPOConfig names), and how the service schedules it."""

    model: ModelSpec = Field(..., description=_described_as_in_core("model"))
    dataset: DatasetSpec = Field(..., description=_described_as_in_core("dataset"))
    eval_dataset: DatasetSpec | None = Field(None, exclude_if=lambda value: value is None,
                                             description=_described_as_in_core("eval_dataset"))
    stall_seconds: int | None = Field(
        None, ge=1, le=7 * 24 * 3600,
        description="In the service: end the job as `stalled` when no step finishes for this long "
        "(its first step counts from the start, model loading included). Only lowers the service's "
        "own limit (GRPO_STALL_SECONDS); `grpo train` ignores it.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec,
                                     description=_described_as_in_core("resources"))
    priority: Priority = Field("normal", description="The scheduler's class: high jobs go first and "
                               "may preempt a job of a team over its fair share; low ones go last.")
    tags: Tags = Field(default_factory=list, description=TAGS_DESCRIPTION, exclude_if=unset)
    description: Description = Field(None, description=DESCRIPTION_DESCRIPTION, exclude_if=unset)


# The service's fields, by their dotted path; a run without the service has nothing to do with them.
SERVICE_FIELDS = ("priority", "stall_seconds", "resources.pool", "resources.max_gpu_hours", "tags",
                  "description")


def ignored_by_local_run(spec: JobSpec) -> list[SpecWarning]:
    """The service's fields ``spec`` was given (in its file, not by default), which ``grpo train``
    (no scheduler, no pools, no stall watch) ignores: told as warnings, so a spec written for the
    service also runs on this machine."""
    given = {*spec.model_fields_set, *(f"resources.{name}" for name in spec.resources.model_fields_set)}
    return [SpecWarning(name, "a field of the service's job spec; grpo train ignores it")
            for name in SERVICE_FIELDS if name in given]
