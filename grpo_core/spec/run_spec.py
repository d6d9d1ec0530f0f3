"""``RunSpec``: what the core needs to run GRPO (the model, its prompts, the rewards, the
hyper-parameters, checkpoints, trackers, devices), read by ``grpo train`` from a YAML file and by
the worker. It knows nothing of the service: the service's job spec (``api.domain.job_spec.JobSpec``)
adds priority, pool, stall limit and ``job:`` sources on top of it. Every field carries a
description: it is what ``/docs`` (the OpenAPI schema) shows a user, and a test keeps it so.

Only shape and bounds are checked here; whether a ``path:`` exists, a reward name is known or a
dataset has the prompt column is checked by :func:`grpo_core.run.components.build_components`, which
needs the filesystem and the reward registry. Nothing in a spec is ever executed as code.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from grpo_core.errors import SpecWarning
from grpo_core.spec.alerts import AlertSpec
from grpo_core.spec.environment_spec import EnvironmentSpec
from grpo_core.spec.grpo_config import GRPOConfig, eval_metric_names
from grpo_core.spec.prompt_rows import prompt_problem, reserved_in
from grpo_core.spec.size_checks import prompts_over_rows
from grpo_core.spec.sources import split_source
from grpo_core.spec.tools_spec import ToolLimits, ToolSource, tools_of
from grpo_core.spec.trl_fields import ignored_message

# The name the environment's rewards go by among the job's rewards (metrics, samples, gate_by).
ENVIRONMENT_REWARD = "environment"
# A job whose rewards time out in this many consecutive steps fails `reward_timeout`: one slow
# batch is noise, a reward that never finishes in time only burns a device.
REWARD_TIMEOUT_STEPS = 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSpec(_Strict):
    """Train a LoRA adapter (peft) instead of the whole model."""

    r: int = Field(16, ge=1, le=1024, description="Rank of the adapter's low-rank update matrices.")
    alpha: float = Field(32.0, gt=0.0, le=4096.0, description="LoRA scaling: the update is multiplied by "
                         "alpha / r.")
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Accepted for peft's config; GRPO turns all dropout off so the on-policy ratio is 1.",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"], min_length=1,
        description="Names of the model's modules that get an adapter (peft's target_modules), e.g. "
        "q_proj, k_proj, v_proj, o_proj.")


class ModelSpec(_Strict):
    """The policy to train: where it comes from and how it is loaded."""

    source: str = Field(..., max_length=1024, description="path:FOLDER or hf:owner/name[@revision]")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="The weights' dtype once loaded. float32 weights train under bf16 autocast "
        "on a GPU (full precision on a CPU); bfloat16 and float16 weights run as they are.")
    lora: LoraSpec | None = Field(None, description="Train a LoRA adapter instead of every weight; null "
                                  "trains the whole model.")

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        split_source(value)
        return value


class DatasetSpec(_Strict):
    """The prompts: inline rows or a file or hub dataset (exactly one). A row's other columns reach
    the rewards by name (an answer to check, test cases to run)."""

    prompts: list[dict[str, Any]] | None = Field(
        None, min_length=1, description="Inline rows, each with the prompt column (a string, or a list "
        "of {role, content} chat messages) and any columns the rewards read.")
    source: str | None = Field(None, max_length=1024, description="path:FILE (.jsonl, .json, .csv or "
                               ".parquet; under the service's data root, or in grpo train relative to the "
                               "spec's folder) or hf:dataset-id[@revision]")
    prompt_field: str = Field("prompt", min_length=1, max_length=128,
                              description="The column that holds each row's prompt.")
    split: str = Field("train", min_length=1, max_length=64,
                       description="The split of an hf: dataset to load; files have none.")
    shuffle: bool = Field(True, description="Draw the prompts in an order shuffled by grpo.seed, anew "
                          "each epoch; false keeps the dataset's order.")

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is not None:
            split_source(value)
        return value

    @model_validator(mode="after")
    def _exactly_one_origin(self) -> DatasetSpec:
        if (self.prompts is None) == (self.source is None):
            raise ValueError("give exactly one of 'prompts' (inline rows) or 'source'")
        return self

    @model_validator(mode="after")
    def _inline_rows_are_usable(self) -> DatasetSpec:
        """Each inline row holds a usable prompt and no reserved column: checked here, at submit,
        rather than on the worker after the job waited in the queue and loaded its model."""
        for index, row in enumerate(self.prompts or ()):
            if self.prompt_field not in row:
                raise _located_error(type(self).__name__, ("prompts", index), row, "missing_prompt",
                                     "row has no '{field}' (dataset.prompt_field) column",
                                     {"field": self.prompt_field})
            problem = prompt_problem(row[self.prompt_field])
            if problem is not None:
                raise _located_error(type(self).__name__, ("prompts", index, self.prompt_field), "",
                                     "bad_prompt", "must be a non-empty string or a non-empty list of "
                                     "messages, got {problem}", {"problem": problem})
            clash = reserved_in(map(str, row))
            if clash:
                raise _located_error(type(self).__name__, ("prompts", index, clash[0]), "",
                                     "reserved_column", "'{name}' is reserved for a reward function "
                                     "argument; rename the column", {"name": clash[0]})
        return self


_SCORE_BOUND = 1e6  # clip and gate bounds: far beyond any reward's scale, finite for JSON


class RewardSpec(_Strict):
    """One reward of the job. Its score is clipped to [clip_min, clip_max], then gated (see
    :mod:`grpo_core.rewards.shaping`), then weighted into the sum the advantages are computed from."""

    name: str = Field(..., min_length=1, max_length=128,
                      description="A registered reward (GET /v1/rewards lists them, with their args).")
    weight: float = Field(1.0, ge=-1000.0, le=1000.0,
                          description="Its score's weight in the sum the advantages are computed from.")
    args: dict[str, Any] = Field(default_factory=dict, description="The reward's own arguments, checked "
                                 "against its schema (GET /v1/rewards).")
    clip_min: float | None = Field(None, ge=-_SCORE_BOUND, le=_SCORE_BOUND,
                                   description="Scores below it count as it (before weighting).")
    clip_max: float | None = Field(None, ge=-_SCORE_BOUND, le=_SCORE_BOUND,
                                   description="Scores above it count as it (before weighting).")
    gate_by: str | None = Field(
        None, min_length=1, max_length=136,
        description="Name of another reward of this job (a repeated name's later ones are NAME_2, "
        "NAME_3...): where its raw score is not above gate_threshold this reward scores 0; where it "
        "is unscorable, so is this one.")
    gate_threshold: float | None = Field(
        None, ge=-_SCORE_BOUND, le=_SCORE_BOUND,
        description="The gate passes where the gate reward's raw score is above it; default 0.")

    @model_validator(mode="after")
    def _coherent_shaping(self) -> RewardSpec:
        if self.clip_min is not None and self.clip_max is not None and self.clip_min > self.clip_max:
            raise _located_error(type(self).__name__, ("clip_min",), self.clip_min, "clip_order",
                                 "must not exceed clip_max ({high})", {"high": self.clip_max})
        if self.gate_threshold is not None and self.gate_by is None:
            raise _located_error(type(self).__name__, ("gate_threshold",), self.gate_threshold,
                                 "threshold_without_gate", "only means something with gate_by", {})
        return self


def reward_names(rewards: list[RewardSpec]) -> list[str]:
    """Each reward's name in metrics and in ``gate_by``: its own, and for a name that repeats,
    ``name_2``, ``name_3``... for the later ones."""
    used: set[str] = set()
    names = []
    for spec in rewards:
        name, suffix = spec.name, 2
        while name in used:
            name, suffix = f"{spec.name}_{suffix}", suffix + 1
        used.add(name)
        names.append(name)
    return names


class ReasoningSpec(_Strict):
    """How ``<think>`` blocks are treated before rewards see a completion."""

    enabled: bool = Field(True, description="Rewards see the answer with reasoning blocks removed (an "
                          "unclosed block leaves an empty answer); false: they see the whole completion.")
    open_tag: str = Field("<think>", min_length=1, max_length=64, description="Opens a reasoning block.")
    close_tag: str = Field("</think>", min_length=1, max_length=64, description="Closes a reasoning block.")


Sharding = Literal["ddp", "fsdp"]


class ResourcesSpec(_Strict):
    """Where the job runs."""

    gpus: int = Field(1, ge=1, le=64, description="Devices the job trains on, all on one worker, as that "
                      "many data-parallel ranks; grpo.prompts_per_step must divide among them.")
    sharding: Sharding = Field(
        "ddp",
        description=(
            "How the gpus share the model. ddp: every GPU holds the whole model and optimizer and "
            "gradients are all-reduced. fsdp: parameters, gradients and optimizer state are sharded "
            "across the GPUs (FSDP2, one shard group per decoder layer), for models whose training "
            "state does not fit one GPU; needs gpus >= 2. Both train exactly like one process."
        ),
    )

    @model_validator(mode="after")
    def _fsdp_shards_over_several_gpus(self) -> ResourcesSpec:
        if self.sharding == "fsdp" and self.gpus < 2:
            raise _located_error(
                type(self).__name__,
                ("sharding",),
                self.sharding,
                "fsdp_needs_several_gpus",
                "fsdp shards the model across GPUs and needs gpus >= 2 (got {gpus}); use ddp on one GPU",
                {"gpus": self.gpus},
            )
        return self


def _located_error(
    title: str, loc: tuple[str, ...], value: Any, kind: str, message: str, context: dict[str, Any]
) -> ValidationError:
    """A validation error placed on the field to fix (``loc``), not on the model that checked it,
    so an HTTP 422 names that field."""
    error = PydanticCustomError(kind, message, context)
    return ValidationError.from_exception_data(title, [InitErrorDetails(type=error, loc=loc, input=value)])


class ExportSpec(_Strict):
    """The model a job leaves at its end (``model/`` beside its checkpoints)."""

    merge_lora: bool = Field(
        False, description="With model.lora: the final model holds the base weights with the adapter "
        "merged in (a plain model any loader takes), and the adapter itself under adapter/.")
    # Left out of a dump when off, so a spec stored before it existed dumps (and hashes) as it did.
    card_includes_rewards: bool = Field(
        False, exclude_if=lambda value: not value,
        description="The model card (the model's README.md) shows the rewards' full definitions (a "
        "python grader's source, a verifier's name, every arg); by default it names each reward with "
        "its weight only, so a published model does not publish the team's grader.")


class RunSpec(_Strict):
    """A GRPO run: the model, its prompts, the rewards that score its completions and the
    hyper-parameters (``grpo``, with TRL's GRPOConfig names)."""

    name: str = Field(..., min_length=1, max_length=128, description="A name for people; need not be "
                      "unique.")
    model: ModelSpec = Field(..., description="The policy to train.")
    dataset: DatasetSpec = Field(..., description="The prompts.")
    eval_dataset: DatasetSpec | None = Field(
        None, exclude_if=lambda value: value is None,  # as the grpo section's eval fields: see there
        description="Prompts the policy is evaluated on during training (grpo.eval_strategy), with the "
        "same shapes and sources as dataset and the columns the rewards read; null: no evaluation.")
    rewards: list[RewardSpec] = Field(..., max_length=32, description="The rewards; each completion's "
                                      "reward is their clipped, gated and weighted sum (with an environment, "
                                      "plus its rewards; at least one of them).")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="Hyper-parameters, with TRL "
                             "GRPOConfig's names, meaning and defaults.")
    reasoning: ReasoningSpec = Field(default_factory=ReasoningSpec, description="How <think> blocks are "
                                     "treated before rewards see a completion.")
    checkpoint_every: int = Field(50, ge=1, le=10_000_000, description="Steps between checkpoints.")
    checkpoint_keep_last: int = Field(
        3,
        ge=1,
        le=1_000_000,
        description="Checkpoints kept on disk, newest first; older ones are deleted and only the newest "
        "keeps optimizer.pt (under fsdp each keeps its distributed/ state). The final checkpoint is "
        "always kept.",
    )
    log_completions_every: int = Field(10, ge=1, le=10_000_000, description="Steps between the sample "
                                       "completions kept (with their rewards and advantages); step 1's "
                                       "are always kept.")
    reward_timeout_seconds: float = Field(
        10.0, gt=0, le=3600,
        description="Time budget of each reward call (one reward over one batch). A call over it "
        "scores its rows as unscorable (advantage 0) with a `reward_timeout` warning event; "
        f"timeouts in {REWARD_TIMEOUT_STEPS} steps in a row fail the job `reward_timeout`. The "
        "service may cap it (GRPO_MAX_REWARD_TIMEOUT_SECONDS).")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Where the job runs.")
    export: ExportSpec = Field(default_factory=ExportSpec, description="The model the job leaves at its "
                               "end.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list, max_length=3,
        description="Experiment trackers (TRL's name) that also get every step's metrics: TensorBoard "
        "event files beside the run's checkpoints, a W&B run, an MLflow run (grpo_core.run.tracking).")
    tools: list[ToolSource] | None = Field(
        None, min_length=1, max_length=16, exclude_if=lambda value: value is None,
        description="Tools the model may call (multi-turn episodes): Python functions given as source, "
        "rendered into the prompt by the chat template (tools=) or this service's fallback format, called "
        "as <tool_call>{...}</tool_call> and run in the sandbox; generation goes on after each turn's "
        "results until the model answers without a call (grpo.max_tool_calling_iterations).")
    tool_limits: ToolLimits = Field(
        default_factory=ToolLimits, exclude_if=lambda limits: limits == ToolLimits(),  # as tools: see there
        description="The sandbox limits of the tool calls of one turn.")
    environment: EnvironmentSpec | None = Field(
        None, exclude_if=lambda value: value is None,  # as tools: see there
        description="A stateful environment the model acts in (multi-turn episodes): each episode gets its "
        "own Environment, reset on its dataset row; each model turn is an action, answered by an observation "
        "and a reward; the episode's reward is the sum of the environment's (a reward named 'environment', "
        "weight 1) and the spec's rewards over the whole trajectory.")

    alerts: list[AlertSpec] = Field(
        default_factory=list, max_length=16, exclude_if=lambda value: not value,  # as tools: see there
        description="Overrides of the health rules checked on every step's metrics (each rule runs with "
        "its conservative default, notify, unless listed here): {rule, threshold, window, action}; GET "
        "/v1/codes explains each rule.")

    def warnings(self) -> list[SpecWarning]:
        """Fields this spec was given that change nothing: TRL fields set to a value that asks for
        nothing (``push_to_hub: false``), dropped while parsing (a stored spec has none); and a
        round drawing more prompts than the inline rows (other datasets' rows are counted when the
        run loads them, which warns then)."""
        found = [SpecWarning(f"grpo.{name}", ignored_message(name, value))
                 for name, value in self.grpo.ignored_trl_fields.items()]
        if self.dataset.prompts is not None:
            over = prompts_over_rows(self.grpo, len(self.dataset.prompts))
            found += [over] if over is not None else []
        if self.eval_dataset is not None and self.grpo.eval_strategy == "no":
            # TRL too keeps an eval_dataset unused while eval_strategy is "no", its default.
            found.append(SpecWarning("eval_dataset", "not used: grpo.eval_strategy is 'no'; set it to "
                                     "'steps' with grpo.eval_steps to evaluate during training"))
        return found

    def known_steps(self) -> int | None:
        """The run's optimizer steps when the spec alone tells them: ``grpo.max_steps``, or with
        -1 its epochs over the inline rows; None for a file or hub dataset, which is only counted
        when the job loads it (:meth:`GRPOConfig.steps_for` either way)."""
        if self.grpo.max_steps > 0:
            return self.grpo.max_steps
        if self.dataset.prompts is None:
            return None
        return self.grpo.steps_for(len(self.dataset.prompts))

    @model_validator(mode="after")
    def _evaluation_has_prompts_and_a_cadence(self) -> RunSpec:
        if self.grpo.eval_strategy != "steps":
            return self
        if self.eval_dataset is None:
            raise _located_error(type(self).__name__, ("eval_dataset",), None, "eval_without_dataset",
                                 "grpo.eval_strategy 'steps' evaluates on eval_dataset: give one", {})
        if self.grpo.eval_steps is None:
            raise _located_error(type(self).__name__, ("grpo", "eval_steps"), None, "eval_without_steps",
                                 "grpo.eval_strategy 'steps' needs eval_steps: the optimizer steps between "
                                 "evaluations (or below 1, a fraction of the run)", {})
        return self

    @model_validator(mode="after")
    def _each_alert_rule_once(self) -> RunSpec:
        seen: set[str] = set()
        for index, alert in enumerate(self.alerts):
            if alert.rule in seen:
                raise _located_error(type(self).__name__, ("alerts", index, "rule"), alert.rule,
                                     "alert_rule_twice", "rule '{rule}' is listed twice: give one entry "
                                     "per rule", {"rule": alert.rule})
            seen.add(alert.rule)
        return self

    @model_validator(mode="after")
    def _best_model_metric_is_evaluated(self) -> RunSpec:
        """The best checkpoint is chosen among eval points by a metric they record."""
        metric = self.grpo.best_model_metric
        if metric is None:
            return self
        title, loc = type(self).__name__, ("grpo", "metric_for_best_model")
        if self.grpo.eval_strategy != "steps":
            raise _located_error(title, loc, metric, "best_model_without_eval",
                                 "choosing the best checkpoint (and early stopping) needs evaluation: set "
                                 "eval_dataset and grpo.eval_strategy 'steps' with grpo.eval_steps", {})
        names = reward_names(self.rewards) + ([ENVIRONMENT_REWARD] if self.environment is not None else [])
        known = eval_metric_names(names)
        if metric not in known:
            raise _located_error(title, loc, metric, "unknown_eval_metric",
                                 "'{metric}' is not an eval metric of this job; it has {known}",
                                 {"metric": metric, "known": ", ".join(known)})
        return self

    @model_validator(mode="after")
    def _episodes_are_usable(self) -> RunSpec:
        title = type(self).__name__
        if not self.rewards and self.environment is None:
            raise _located_error(title, ("rewards",), [], "too_short", "give at least one reward (or an "
                                 "environment, whose rewards score the episodes)", {})
        if self.tools is not None:
            try:
                tools_of(self.tools)
            except ValueError as exc:
                raise _located_error(title, ("tools",), None, "invalid_tools", str(exc), {}) from None
            if self.environment is not None:
                raise _located_error(title, ("environment",), None, "tools_with_environment",
                                     "give tools or an environment, not both: a job's episodes are one "
                                     "or the other", {})
        if self.environment is not None and ENVIRONMENT_REWARD in reward_names(self.rewards):
            raise _located_error(title, ("rewards",), None, "reward_named_environment", "a reward named "
                                 "'environment' would clash with the environment's own rewards: rename it",
                                 {})
        if (self.tools or self.environment) is not None and self.resources.sharding == "fsdp":
            # A sharded model is gathered for each turn's decode, a collective: ranks whose
            # episodes take different numbers of turns would wait on each other for ever.
            raise _located_error(title, ("resources", "sharding"), "fsdp", "tools_with_fsdp",
                                 "multi-turn episodes (tools, environments) do not run on a sharded model "
                                 "yet: use sharding ddp", {})
        return self

    @model_validator(mode="after")
    def _merge_needs_an_adapter(self) -> RunSpec:
        if self.export.merge_lora and self.model.lora is None:
            raise _located_error(type(self).__name__, ("export", "merge_lora"), True, "merge_needs_lora",
                                 "merges a LoRA adapter, but model.lora is not set", {})
        return self

    @model_validator(mode="after")
    def _gates_name_other_rewards(self) -> RunSpec:
        names = reward_names(self.rewards) + ([ENVIRONMENT_REWARD] if self.environment is not None else [])
        for index, reward in enumerate(self.rewards):
            gate = reward.gate_by
            if gate is None:
                continue
            if gate == names[index]:
                raise _located_error(type(self).__name__, ("rewards", index, "gate_by"), gate,
                                     "gate_is_self", "a reward cannot gate itself", {})
            if gate not in names:
                raise _located_error(type(self).__name__, ("rewards", index, "gate_by"), gate,
                                     "unknown_gate", "names no reward of this job; its rewards are "
                                     "{names}", {"names": ", ".join(names)})
        return self

    @model_validator(mode="after")
    def _save_total_limit_is_checkpoint_keep_last(self) -> RunSpec:
        """TRL's ``save_total_limit`` (under grpo:, where a pasted TRL config puts it) sets
        checkpoint_keep_last; both given must agree, so neither is silently ignored."""
        limit = self.grpo.save_total_limit
        if limit is None:
            return self
        if "checkpoint_keep_last" in self.model_fields_set and self.checkpoint_keep_last != limit:
            raise _located_error(
                type(self).__name__, ("grpo", "save_total_limit"), limit, "conflicting_checkpoint_limits",
                "is TRL's name for checkpoint_keep_last, which says {keep}: give one of them, or the same "
                "value",
                {"keep": self.checkpoint_keep_last})
        self.checkpoint_keep_last = limit
        return self

    @model_validator(mode="after")
    def _whole_groups_per_rank(self) -> RunSpec:
        """A k-GPU job trains as k data-parallel ranks, each generating and scoring whole groups,
        so every rank must get the same number of prompts."""
        gpus, prompts = self.resources.gpus, self.grpo.prompts_per_step
        if prompts % gpus:
            raise _located_error(
                type(self).__name__,
                ("grpo", "prompts_per_step"),
                prompts,
                "not_divisible_by_gpus",
                "must be divisible by resources.gpus ({gpus}): each GPU trains on whole groups of "
                "the same number of prompts",
                {"gpus": gpus},
            )
        return self
