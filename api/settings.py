"""One settings object for the service, read from ``GRPO_``-prefixed environment variables."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.redis_keys import NAMESPACE_PATTERN, RedisKeys, namespace_for
from api.storage.locations import parse_location
from api.vocabulary import (
    DEFAULT_POOL,
    MAX_GPU_HOURS,
    MAX_QUEUED_JOBS,
    MAX_RATE_PER_SECOND,
    POOL_NAME_PATTERN,
    BudgetPeriod,
    Priority,
)

# Refused as tokens: a default secret in production is worse than none at all.
_PLACEHOLDER_TOKENS = {"changeme", "change-me", "secret", "token", "password"}
# An operator token is an admin credential: short ones are guessable, and an empty one would
# match an empty presented token. 32 characters is what `openssl rand -hex 16` prints.
MIN_API_TOKEN_LENGTH = 32


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GRPO_", extra="ignore")

    database_url: str = Field("sqlite:///./grpo.db", description="SQLAlchemy URL; Postgres in production.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Broker, live streams and heartbeats.")
    namespace: str | None = Field(
        None, pattern=NAMESPACE_PATTERN, description="Prefix of every Redis key and Celery queue of this "
        "deployment, so stacks can share one Redis; unset: derived from the database URL (its password "
        "left out), which every process of one stack shares.")
    models_root: Path = Field(Path("./models"), description="`path:NAME` model sources resolve under this.")
    data_root: Path = Field(Path("./data"), description="`path:NAME` dataset sources resolve under this.")
    artifacts_root: Path = Field(Path("./artifacts"), description="Checkpoints are written under this.")
    storage_url: str | None = Field(
        None, description="Where artifacts and uploaded files are stored: `s3://BUCKET/PREFIX` (an "
        "S3-compatible bucket; endpoint, region and credentials from the standard `AWS_*` variables) or "
        "a local folder (a path or `file:///path`); unset: the folder `GRPO_ARTIFACTS_ROOT`.")
    worker_cache_dir: Path = Field(Path("./worker-cache"), description="Where a worker keeps the uploaded "
                                   "files (`file:ID` sources) its jobs use, one copy per content hash.")
    worker_cache_bytes: int = Field(50 * 2**30, ge=0, description="The most bytes `GRPO_WORKER_CACHE_DIR` "
                                    "holds: the least recently used files no running job uses are evicted.")
    storage_retry_seconds: float = Field(
        300.0, ge=0, description="A worker retries an upload to or a download from an unreachable "
        "`GRPO_STORAGE_URL` store for this long, backing off; a checkpoint's upload is retried while the "
        "job trains on (its row is written once it is stored), and a store away longer at the job's end "
        "or at its resume ends the attempt without failing the job, which is requeued.")
    # The JobSpec's pool pattern: a worker must serve a pool that a job can name.
    pool: str = Field(DEFAULT_POOL, pattern=POOL_NAME_PATTERN,
                      description="The GPU pool this worker serves.")
    worker_gpus: int = Field(1, ge=1, le=64, description="CPU slots a worker without CUDA advertises; "
                             "with CUDA it owns every device it sees.")
    worker_address: str = Field(
        "127.0.0.1", min_length=1, max_length=253,
        description="The address other workers of the pool reach this one at (a host name or IP): a job "
        "spanning several workers runs its rendezvous, and its ranks meet, at its first worker's address. "
        "The default serves workers on one machine only; set it on every worker of a multi-host pool.")
    api_host: str = Field("127.0.0.1", description="The address `grpo api` listens on (`--host` overrides "
                          "it).")
    api_port: int = Field(8000, ge=1, le=65535, description="The port `grpo api` and `grpo dev` serve on "
                          "(`--port` overrides it).")
    auth: Literal["keys", "none"] = Field(
        "keys", description="`keys`: every /v1 call needs a team API key (or the operator token); "
        "`none`: no auth, every caller is an admin of team `default` (local development only).")
    api_token: SecretStr | None = Field(
        None, description="Optional operator token: acts as an admin key of team `default` (bootstrap); "
        f"at least {MIN_API_TOKEN_LENGTH} characters, or unset for none.")
    auth_cache_seconds: float = Field(
        5.0, ge=0, description="How long a verified API key, and its team's limits, are trusted before "
        "they are looked up again; a revocation or a limit changed through another process takes "
        "effect within this.")
    stream_maxlen: int = Field(10_000, ge=100, description="Approximate cap of each job's Redis Stream.")
    # Writers publish every event and status change; these SQL re-reads only catch a failed publish.
    stream_block_seconds: float = Field(
        1.0, gt=0, le=5.0, description="A live stream reader re-reads the job in SQL after its Redis "
        "stream was quiet this long (at most 5: below the API's Redis socket timeout).")
    stream_recheck_seconds: float = Field(
        5.0, gt=0, description="A busy live stream's reader re-reads the job's row and events this often.")
    heartbeat_seconds: float = Field(2.0, gt=0, description="How often a worker renews its job lease.")
    lease_seconds: float = Field(30.0, gt=0, description="A job whose lease is older goes back to the queue.")
    claim_window_seconds: float = Field(
        30.0, gt=0, le=3600, description="A dispatched job its worker has not claimed this long after "
        "the dispatch (by the database's clock) is dispatched again at once, no attempt charged: its "
        "message was lost. A gang one of whose hosts has not joined by then is requeued. A late "
        "delivery of the old dispatch is refused.")
    scheduler_interval_seconds: float = Field(
        0.5, gt=0, description="Pause between two passes of the scheduler; its leader lock lives ten "
        "passes (at least 5 s), and no pass for twice that reads as `no_scheduler`.")
    max_attempts: int = Field(
        5, ge=1, description="An attempt that a machine fault ended (a rank process killed, at once; "
        "a worker gone silent, once its lease expires) sends its job back to the queue, until the "
        "job has had this many attempts since it was last queued cleanly (submit, retry, resume or a "
        "preemption); then it fails `too_many_attempts`.")
    db_retry_seconds: float = Field(
        60.0, ge=0, description="The worker retries a write or read its job's reporting needs through a "
        "transient database error (a dropped connection, a restart) for this long, backing off; a "
        "database away longer ends the attempt without failing the job, which resumes when it is back.")
    requeue_backoff_seconds: float = Field(
        5.0, ge=0, description="A job requeued after a fault or an expired lease is not dispatched "
        "again for this long, doubled per attempt it has had (`pending_reason: backoff` meanwhile).")
    requeue_backoff_max_seconds: float = Field(
        300.0, ge=0, description="The most a requeued job waits before it is dispatched again.")
    rank_timeout_seconds: float = Field(
        1800.0, gt=0, description="A rank of a multi-GPU job that waits longer than this on the others "
        "(at the rendezvous or in a collective) fails the attempt.")
    stall_seconds: float = Field(
        1800.0, gt=0, description="A job with no finished step for this long (its first step counts "
        "from the start of its process, model loading included) is killed and fails `stalled`; a "
        "spec's `stall_seconds` may only lower it.")
    cancel_grace_seconds: float = Field(
        300.0, gt=0, description="A running job asked to cancel or yield has this long to checkpoint "
        "and stop; then its process is ended (SIGTERM, then SIGKILL after `kill_grace_seconds`).")
    warm_job_process: bool = Field(
        True, description="Each worker keeps the next job's process started and past its imports (torch, "
        "transformers, the core), and a job's ranks are forked from a server past them too, so a "
        "dispatched job starts training seconds sooner; false starts each job's process when the job "
        "arrives, and each rank as a fresh interpreter.")
    kill_grace_seconds: float = Field(
        10.0, gt=0, description="Between the SIGTERM and the SIGKILL that end a job's process.")
    fair_share_half_life_seconds: float = Field(
        3600.0, gt=0, description="Half-life of a team's past GPU usage in the fair-share order.")
    max_request_bytes: int = Field(1024 * 1024, ge=1024, description="Largest request body the API "
                                   "accepts; a larger one is a 413 before anything parses it.")
    spec_validation_slots: int = Field(
        4, ge=1, le=64, description="Submissions and clones whose spec is parsed, checked and stored at "
        "once, each in a thread off the event loop; more wait their turn, so a flood of large specs "
        "neither stalls the loop nor takes every thread of the pool.")
    reward_trial_slots: int = Field(
        2, ge=1, le=16, description="Rewards dry runs (`POST /v1/rewards/run`) scored at once, each in a "
        "thread off the event loop; more wait their turn. A sandboxed grader scored in the API "
        "(`GRPO_REWARD_TRIAL_HOST`) runs as a process of its host.")
    reward_trial_slots_per_team: int = Field(
        1, ge=1, le=16, description="Rewards dry runs one team may have in progress at once, all API "
        "processes together (admin keys are not held to it); one more is a 429 with Retry-After. Keep "
        "it below `GRPO_REWARD_TRIAL_SLOTS`, so that another team's dry run starts at once while one "
        "team is at its share.")
    reward_trial_host: Literal["auto", "workers"] = Field(
        "auto", description="Where a rewards dry run's sandboxed rewards (`python`, `code_tests`) run: "
        "`auto`: in the API host's own sandbox when it has one, else on a worker of the request's pool "
        "that advertises `code_sandbox`; `workers`: always on such a worker. Rewards that need no "
        "sandbox always run in the API.")
    list_spec_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="`GET /v1/jobs?include=spec` ends a page early once its "
        "specs add up to this many bytes (as stored JSON; a page holds at least one job): a page of "
        "megabyte specs cannot take the API's memory. `next_after` continues as usual.")
    compare_diff_bytes: int = Field(
        256 * 1024, ge=1024, le=64 * 1024 * 1024, description="`GET /v1/jobs/compare` answers the spec "
        "fields that differ (dotted paths, each job's value) up to this many bytes of JSON: a difference "
        "that does not fit in the room left is left out and counted in `spec_diff_omitted`, so ten jobs "
        "of megabyte specs cannot make a megabyte answer.")
    # Per-team limits: the defaults; admins override them per team (PUT /v1/admin/teams/{team}/limits).
    # Admin keys are held to none of them but the queue cap and the GPU-hour budget.
    team_max_priority: Priority = Field(
        "normal", description="Highest priority class a team's members may give a job, at submit and "
        "every later change (clone, retry, resume, PATCH); admins may set any.")
    team_max_queued_jobs: int = Field(
        1_000, ge=0, le=MAX_QUEUED_JOBS, description="Most of a team's jobs waiting in the queue at once; "
        "a submit, clone, retry or resume past it is a 409 `queue_full`.")
    team_reads_per_second: float = Field(
        50.0, gt=0, le=MAX_RATE_PER_SECOND, description="Sustained rate of a team's reads (GET, opening a "
        "stream), all its keys and API processes together; past the burst, a 429 with Retry-After.")
    team_read_burst: int = Field(300, ge=1, le=MAX_QUEUED_JOBS,
                                 description="Reads a team may make at once before the rate applies.")
    team_writes_per_second: float = Field(
        10.0, gt=0, le=MAX_RATE_PER_SECOND, description="Sustained rate of a team's writes (POST, PATCH, "
        "PUT, DELETE); past the burst, a 429 with Retry-After.")
    team_write_burst: int = Field(100, ge=1, le=MAX_QUEUED_JOBS,
                                  description="Writes a team may make at once before the rate applies.")
    team_serve_idle_seconds: int = Field(
        300, ge=1, le=7 * 24 * 3600, description="A team's serving job (the job that answers "
        "`/v1/chat/completions` and `/v1/completions` from one of its models) ends, its model unloaded "
        "and its device freed, after this long without a request; admins set it per team "
        "(`serve_idle_seconds`).")
    team_gpu_hours_budget: float | None = Field(
        None, ge=0, le=MAX_GPU_HOURS, description="GPU-hours each team's jobs may use in a "
        "`GRPO_TEAM_BUDGET_PERIOD` (GPUs × hours held, all pools together); reached, the scheduler pauses "
        "the team's jobs and a submit, clone, retry or resume is a 422 `budget_exhausted` until the next "
        "period. Unset: no budget. Admins set it per team (`gpu_hours_budget`).")
    team_budget_period: BudgetPeriod = Field(
        "month", description="The calendar period, in UTC, a team's GPU-hour budget renews each: `day` "
        "(from 00:00), `week` (from Monday) or `month` (from the 1st); admins set it per team "
        "(`budget_period`).")
    # A job's GPU-hours estimated before it runs (api.limits.gpu_estimate).
    estimate_tokens_per_gpu_second: float = Field(
        1000.0, gt=0, le=1e9, description="The rate a GPU-hour estimate (`POST /v1/jobs?dry_run=true`) "
        "assumes, with no start-up time, for a pool none of whose jobs has succeeded yet (`basis: "
        "default`); once some have, their rate and start-up are measured on them instead.")
    auto_migrate: bool = Field(
        True, description="`grpo api`, `grpo scheduler` and `grpo admin` bring a database that is behind "
        "the code's schema to it at start; false: they refuse, naming the command to run.")
    # Per-pool limits: the defaults; admins override them per pool (PUT /v1/admin/pools/{pool}/limits).
    # Each spec field is bounded on its own; these bound what they multiply to, so no team's
    # job can take a worker's memory or disk from the others.
    pool_max_tokens_per_step: int = Field(
        8 * 1024 * 1024, ge=1, description="Most prompts_per_step × num_generations × "
        "(max_prompt_length + max_completion_length) a job of a pool may ask for; an eval point's "
        "inline eval prompts × eval_num_generations × the same lengths too.")
    pool_max_steps: int = Field(1_000_000, ge=1, description="Most grpo.max_steps a pool's job may ask for.")
    pool_max_checkpoints_per_job: int = Field(
        1_000, ge=1, description="Most checkpoints a job may write (max_steps / checkpoint_every).")
    pool_max_inline_dataset_bytes: int = Field(
        8 * 1024 * 1024, ge=1, description="Most bytes (as JSON) of a spec's inline dataset rows, "
        "its dataset's and eval_dataset's together.")
    # 80 GiB admits code_tests' defaults (4 × (8 × 256 + 16) MiB ≈ 8.1 GiB a rank) on a whole
    # 8-GPU host and refuses what no host spares (one rank of 16 × 8 × 1 GiB is 128 GiB).
    pool_max_sandbox_memory_bytes: int = Field(
        80 * 2**30, ge=1, description="Most memory the sandboxes of a job's rewards may hold at once: its "
        "largest reward's parallel × (max_processes × memory_mb + 16 MiB of /tmp), times resources.gpus; "
        "a tools job's turn, 4 × (tool_limits.max_processes × memory_mb + 16 MiB), and an environment job's "
        "round, a sandbox per 16 episodes of (16 × environment.max_processes + 2) × memory_mb + 16 MiB, are "
        "held to it too.")
    pool_job_memory_fraction: float = Field(
        0.9, gt=0, le=1, description="Without a pool's job_memory_bytes, a job may use this fraction of "
        "its worker's memory times its share of the worker's devices; beyond it the job's processes are "
        "killed and it fails `out_of_memory`.")
    allow_hub: bool = Field(
        True, description="false: `hf:` sources are refused at submit (air-gapped deployments).")
    max_reward_timeout_seconds: float = Field(
        60.0, gt=0, description="The most a spec's `reward_timeout_seconds` (each reward call's time "
        "budget) may ask for; a larger one is refused at submit.")

    # Uploads (``POST /v1/files``): each is spooled to a local file while it streams in, checked,
    # then stored; the limits bound that file and the time its checks take.
    max_dataset_upload_bytes: int = Field(
        512 * 1024 * 1024, ge=1024, description="Largest dataset file `POST /v1/files` accepts; its "
        "rows are checked one at a time (JSONL, CSV), so memory stays bounded. A JSON array or Parquet "
        "file is read whole, so at most 64 MiB of one is taken.")
    max_model_upload_bytes: int = Field(
        64 * 2**30, ge=1024, description="Largest model archive `POST /v1/files` accepts (as uploaded, "
        "compressed or not).")
    upload_max_unpacked_bytes: int = Field(
        64 * 2**30, ge=1024, description="Most a model archive's files may add up to unpacked (as a worker "
        "unpacks it), told from its members' headers before their data is decompressed; more is a 422. "
        "A model counts against its team's artifact quota by this unpacked size.")
    max_uploads_per_team: int = Field(
        2, ge=1, le=1000, description="Most uploads of one team in flight at once, all API processes "
        "together; another is a 429 `rate_limited` before its body is read, so one team's uploads cannot "
        "fill the spool disk (`GRPO_UPLOAD_SPOOL_DIR`) every team's need.")
    max_uploads_in_flight: int = Field(
        16, ge=1, le=10_000, description="Most uploads one API process receives at once, all teams "
        "together; another is a 503 `unavailable` with Retry-After before its body is read (per-team "
        "fairness is `GRPO_MAX_UPLOADS_PER_TEAM`'s).")
    upload_min_bytes_per_second: float = Field(
        64 * 1024, gt=0, description="An upload's body must arrive at least this fast, after "
        "`GRPO_UPLOAD_GRACE_SECONDS` it may fall behind by; one slower (a client trickling its body, or "
        "sending nothing more) is a 408 `upload_too_slow` and gives back its place and its team's slot.")
    upload_grace_seconds: float = Field(
        30.0, gt=0, le=3600, description="How far behind `GRPO_UPLOAD_MIN_BYTES_PER_SECOND` an upload's "
        "body may be (a slow start, a pause) before it is stopped.")
    upload_spool_dir: Path | None = Field(
        None, description="Where an upload is spooled while it is checked (it needs room for the "
        "largest upload at once per upload in flight, `GRPO_MAX_UPLOADS_PER_TEAM` per team uploading); "
        "a full one is a 503 `spool_full`; unset: the system's temporary folder.")

    # Webhooks (``POST /v1/webhooks``), sent by the scheduler process (api.scheduling.webhook_sender).
    webhook_allowed_hosts: str = Field(
        "", description="Comma-separated hosts a webhook URL may name (exactly, case-insensitive); "
        "empty: any host. Checked when a webhook is registered, on top of the address rules "
        "(`GRPO_WEBHOOK_ALLOWED_NETWORKS`), which every host must also pass.")
    webhook_allowed_networks: str = Field(
        "", description="Comma-separated CIDR networks a webhook may reach besides public addresses "
        "(e.g. `10.20.0.0/16` for a receiver inside your network, `127.0.0.0/8,::1/128` for a test on "
        "loopback); empty: public unicast addresses only. Checked at registration and on the address "
        "each delivery connects to.")
    environment_allowed_networks: str = Field(
        "", description="Comma-separated CIDR networks an environment server (registered with "
        "/v1/admin/verifiers, named by a spec's environment.server) may be in besides public addresses, "
        "e.g. the cluster's own network; empty: public unicast addresses only. Checked on the address "
        "each episode's session connects to (the egress guard).")
    webhook_timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="One webhook request's deadline, connect, send and answer "
        "together; a slower receiver's delivery is cut there and retried later. Redirects are never "
        "followed.")
    webhook_max_in_flight: int = Field(
        32, ge=1, le=1024, description="Most webhook requests one scheduler process has in flight.")
    webhook_max_in_flight_per_team: int = Field(
        4, ge=1, le=1024, description="Most webhook requests of one team in flight in one scheduler "
        "process, so a team's slow receivers delay only its own deliveries; keep it below "
        "`GRPO_WEBHOOK_MAX_IN_FLIGHT`.")
    webhook_max_in_flight_per_destination: int = Field(
        2, ge=1, le=1024, description="Most webhook requests to one host and port in flight in one "
        "scheduler process.")
    webhook_max_per_team: int = Field(
        20, ge=1, le=10_000, description="Most webhooks one team may register; another is a 409 naming "
        "this limit.")
    secret_key: SecretStr | None = Field(
        None, description="Comma-separated Fernet keys that encrypt webhook secrets at rest (make one "
        "with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`"
        "): the first encrypts, every one decrypts, so a new key goes first and the old one stays "
        "until the scheduler has re-encrypted (docs/operators.md). Required once webhooks exist.")
    webhook_max_attempts: int = Field(
        8, ge=1, le=50, description="A webhook delivery not answered 2xx after this many attempts is "
        "marked `failed`.")
    webhook_retry_seconds: float = Field(
        600.0, ge=0, description="Wait before a failed webhook delivery's second attempt, doubled per "
        "attempt (with jitter): 8 attempts span about a day.")
    webhook_retry_max_seconds: float = Field(
        43_200.0, ge=0, description="The longest wait between two attempts of a webhook delivery.")
    webhook_poll_seconds: float = Field(
        1.0, gt=0, description="How often the scheduler process looks for webhook deliveries due.")
    storage_sweep_seconds: float = Field(
        300.0, gt=0, description="How often the scheduler process removes from storage what no job or "
        "file row names any more (a deletion whose storage step failed, a failed upload's object), a "
        "bounded batch each time.")

    # Chat with a job's model (``/v1/chat/completions``, ``/v1/completions``): served by a serving job.
    serve_wait_seconds: float = Field(
        120.0, gt=0, le=3600, description="How long a chat request waits for its serving job to take it "
        "(while the job waits for a device and loads the model); then a 503 `unavailable` with "
        "Retry-After, and the request is withdrawn.")
    serve_max_tokens: int = Field(
        4096, ge=1, le=1_000_000, description="The most tokens a chat request may ask to generate "
        "(`max_tokens`); a request that names none gets this many, or fewer where the model's positions "
        "end first.")
    serve_max_input_chars: int = Field(
        200_000, ge=1, le=100_000_000, description="The most characters of text a chat request may send "
        "(its messages' contents, or its prompt, together); more is a 422 naming the field.")
    serve_max_batch: int = Field(
        8, ge=1, le=256, description="The most requests a serving job generates at once (one batch on the "
        "loaded model); more wait in its queue.")

    @model_validator(mode="after")
    def _derive_namespace(self) -> Settings:
        if self.namespace is None:
            self.namespace = namespace_for(self.database_url)
        return self

    @field_validator("storage_url")
    @classmethod
    def _storage_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_location(value)  # a typo fails when the settings load, not at the first upload
        return value

    @property
    def storage_location(self) -> str:
        """What :func:`api.storage.open_store` opens: ``storage_url``, else the artifacts folder."""
        return self.storage_url or str(self.artifacts_root)

    def max_upload_bytes(self, purpose: str | None) -> int:
        """The limit of an upload of ``purpose`` (None: not told yet, the larger one)."""
        # OpenAI's `fine-tune` purpose is a dataset (OpenAI's JSONL), held to the dataset's limit.
        limits = {"dataset": self.max_dataset_upload_bytes, "fine-tune": self.max_dataset_upload_bytes,
                  "model": self.max_model_upload_bytes}
        return limits.get(purpose or "", max(limits.values()))

    @field_validator("secret_key")
    @classmethod
    def _no_empty_key(cls, value: SecretStr | None) -> SecretStr | None:
        # `GRPO_SECRET_KEY=` (compose's `${GRPO_SECRET_KEY:-}`) is no key, not a malformed one.
        return value if value is None or value.get_secret_value().strip() else None

    @field_validator("webhook_allowed_networks", "environment_allowed_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        for cidr in (c.strip() for c in value.split(",")):
            if cidr:
                ipaddress.ip_network(cidr, strict=False)  # ValueError names the bad one
        return value

    @property
    def webhook_networks(self) -> tuple[str, ...]:
        """``webhook_allowed_networks`` as a tuple of CIDR texts."""
        return tuple(c.strip() for c in self.webhook_allowed_networks.split(",") if c.strip())

    @property
    def environment_networks(self) -> tuple[str, ...]:
        """``environment_allowed_networks`` as a tuple of CIDR texts."""
        return tuple(c.strip() for c in self.environment_allowed_networks.split(",") if c.strip())

    @property
    def webhook_hosts(self) -> frozenset[str]:
        """``webhook_allowed_hosts`` as a set of lower-case names (empty: any host)."""
        return frozenset(h.strip().lower() for h in self.webhook_allowed_hosts.split(",") if h.strip())

    @property
    def redis_keys(self) -> RedisKeys:
        """The names of this deployment's Redis keys and Celery queues."""
        return RedisKeys(self.namespace or namespace_for(self.database_url))

    @field_validator("api_token")
    @classmethod
    def _no_weak_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        token = value.get_secret_value()
        if token.strip().lower() in _PLACEHOLDER_TOKENS:
            raise ValueError("GRPO_API_TOKEN is a placeholder; set a real secret or leave it unset")
        if len(token.strip()) < MIN_API_TOKEN_LENGTH:
            raise ValueError(f"GRPO_API_TOKEN must be at least {MIN_API_TOKEN_LENGTH} characters "
                             "(e.g. `openssl rand -hex 16`), or unset for no operator token")
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
