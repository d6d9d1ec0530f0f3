"""Words every part of the service shares and none of them owns: priority classes, the shape of
team and pool names, the default pool, the trackers' project, Celery task names, and a worker's
heartbeat. The service owns them: the training core knows none of them. Pure (no I/O), so the store,
the scheduler, the worker, the HTTP layer and the CLI can all import it. Queue names belong to a
deployment's namespace: ``api.redis_keys``.

The job's statuses and their transitions live in :mod:`api.domain.lifecycle`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

Priority = Literal["low", "normal", "high"]  # lowest first
# Pool (and team) names: lower case, digits, "_" and "-", as in a URL path or a queue name.
POOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_\-]{0,62}$"
PRIORITIES: tuple[str, ...] = get_args(Priority)  # lowest first
# Team names follow the same rules as pool names: a JobSpec names a pool, an admin a team.
NAME_PATTERN = POOL_NAME_PATTERN
DEFAULT_POOL = "default"
# The W&B project and MLflow experiment a job's trackers report to, unless the worker's
# environment names one (WANDB_PROJECT, MLFLOW_EXPERIMENT_NAME).
TRACKER_PROJECT = "grpo-service"
MAX_QUOTA_GPUS = 1_000_000  # larger is a typo, and it keeps every sum inside a 32-bit INTEGER
MAX_ARTIFACT_QUOTA_BYTES = 2**62  # a team's artifact byte quota: far past any disk, inside a BIGINT
MAX_LABEL_LENGTH = 128  # an API key's label
MAX_QUEUED_JOBS = 1_000_000  # a team's queue cap, and a rate bucket's burst: larger is a typo
MAX_RATE_PER_SECOND = 1_000_000.0  # a team's requests per second: larger is a typo
# A job's or a team's GPU-hour budget: a thousand GPUs for a century is far less; larger is a typo.
MAX_GPU_HOURS = 1_000_000_000.0
# A team's GPU-hour budget renews each calendar period, in UTC: a day from midnight, a week from
# Monday, a month from its first day.
BudgetPeriod = Literal["day", "week", "month"]

RUN_JOB = "grpo.run_job"

# Optimizer steps count from 1; a record at step 0 holds the evaluation before training
# (grpo.eval_on_start) and its eval samples. A step cursor starting after this one reads them too.
BEFORE_FIRST_STEP = -1


@dataclass(frozen=True)
class Heartbeat:
    """What a live worker advertises (``api.store.bus``): its pool and capacity (devices
    ``0..gpus-1``), and which of its devices each job it runs now uses."""

    worker_id: str
    pool: str = DEFAULT_POOL
    gpus: int = 1
    gpu_model: str | None = None
    gpu_memory_mb: int | None = None
    memory_mb: int | None = None
    hostname: str | None = None
    # where the other workers of the pool reach it (GRPO_WORKER_ADDRESS): a gang's first worker
    # serves the gang's rendezvous there
    address: str | None = None
    # what its jobs may use besides devices, checked at its start: "code_sandbox" (code_tests)
    capabilities: list[str] = field(default_factory=list)
    # job id -> the device indices its child uses now, even for a job SQL no longer gives it
    jobs: dict[int, list[int]] = field(default_factory=dict)

    @property
    def free_devices(self) -> list[int]:
        busy = {device for devices in self.jobs.values() for device in devices}
        return [device for device in range(self.gpus) if device not in busy]

    def to_json(self) -> str:
        # free_devices is written for readers of the raw key; from_json derives it again.
        return json.dumps({**asdict(self), "free_devices": self.free_devices}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Heartbeat | None:
        """None for a heartbeat this version cannot read (no worker id): it is not counted."""
        data: dict[str, Any] = json.loads(raw)
        if not isinstance(data, dict) or not data.get("worker_id"):
            return None
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        if isinstance(known.get("jobs"), dict):  # JSON keys are strings
            known["jobs"] = {int(job): list(devices) for job, devices in known["jobs"].items()}
        return cls(**known)
