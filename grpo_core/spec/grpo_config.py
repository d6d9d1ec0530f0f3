"""``GRPOConfig``: the ``grpo:`` section of a job spec, validated before any step runs.

Field names follow TRL's ``GRPOConfig`` so a TRL user can paste theirs: where a field shares TRL's
name it has TRL's meaning and default (a test compares them with the installed TRL), and TRL's
other fields are refused with what to use instead (:mod:`grpo_core.spec.trl_fields`). Every field has
bounds; unknown fields are rejected. Cross-field rules (``epsilon_high >= epsilon``, ``delta`` above
the upper clip, batch divisible by the accumulation steps) are validators too, so a bad config never
reaches the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from grpo_core.spec.trl_fields import is_off, refusal, refused_among

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none"]
# transformers' schedule names (``get_scheduler``), with their meaning (grpo_core.algorithm.optim).
# TRL's "epoch" is refused: runs are counted in optimizer steps (:meth:`GRPOConfig._steps_only`).
EvalStrategy = Literal["no", "steps"]
LRSchedulerType = Literal["linear", "cosine", "constant", "constant_with_warmup"]
# The name of lr_scheduler_type before it took TRL's name; specs stored then still carry it.
LEGACY_LR_SCHEDULER = "lr_scheduler"


def _is(default: object) -> Callable[[object], bool]:
    """``exclude_if`` for a field added after specs were stored: true at its default."""
    return lambda value: value is default or (value == default and type(value) is type(default))


# An eval point adds its metrics to its step's record under these names (eval_reward, eval_pass@k,
# eval_rewards/{fn}/mean, ..., and timing/eval): how the model card and job.eval webhooks find them.
EVAL_METRIC_PREFIX, EVAL_TIMING = "eval_", "timing/eval"


DEFAULT_BEST_MODEL_METRIC = "eval_reward"


def eval_metric_names(reward_names: list[str]) -> list[str]:
    """Every eval metric an eval point records for rewards named ``reward_names``
    (:mod:`grpo_core.algorithm.eval_metrics`), which metric_for_best_model may name."""
    per_reward = [f"eval_rewards/{name}/{stat}" for name in reward_names for stat in ("mean", "std")]
    lengths = [f"eval_completions/{name}" for name in
               ("mean_length", "min_length", "max_length", "clipped_ratio", "mean_terminated_length")]
    return ["eval_reward", "eval_reward_std", "eval_pass@k", *per_reward, *lengths]


def eval_metrics_of(record: dict[str, Any]) -> dict[str, Any]:
    """The eval metrics of a step's record; empty for a step that was not an eval point."""
    return {name: value for name, value in record.items()
            if name.startswith(EVAL_METRIC_PREFIX) or name == EVAL_TIMING}


class GRPOConfig(BaseModel):
    """Hyper-parameters of one GRPO run, with TRL GRPOConfig's names, meaning and defaults."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    num_generations: int = Field(8, ge=2, le=1024, description="G: completions sampled per prompt.")
    prompts_per_step: int = Field(8, ge=1, le=4096, description="B: prompts per optimizer step.")
    max_prompt_length: int = Field(256, ge=1, le=131072, description="Prompts are left-truncated to this.")
    max_completion_length: int = Field(512, ge=1, le=131072, description="Completions stop here.")
    temperature: float = Field(
        1.0, gt=0.0, le=10.0, description="Sampling temperature; log-probs use it too."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: keep the fewest most likely "
                         "tokens whose probability adds up to top_p; 1 disables it.")
    top_k: int = Field(0, ge=0, le=100000, description="0 disables top-k filtering.")
    min_p: float | None = Field(
        None, ge=0.0, le=1.0, description="Drop tokens less likely than min_p times the most likely one "
        "(after temperature, top-k and top-p, as transformers' MinPLogitsWarper); null disables it.")
    repetition_penalty: float = Field(
        1.0, gt=0.0, le=100.0, description="Sampling only: logits of tokens already in the prompt or the "
        "completion are divided by it (multiplied when negative), as transformers' "
        "RepetitionPenaltyLogitsProcessor; 1 disables it. Log-probs ignore it, as in TRL.")
    max_tool_calling_iterations: int | None = Field(
        None, exclude_if=_is(None), ge=0, le=1000,
        description="With tools: the most turns of an episode whose tool calls are run (TRL's name); the "
        "turn after the last is the model's answer. null: no limit but the token budgets.")
    max_trajectory_length: int | None = Field(
        None, exclude_if=_is(None), ge=2, le=1_048_576,
        description="With tools or an environment: the most tokens of an episode, prompt, turns and tool "
        "results (observations) together; a turn or a result that would not fit ends the episode (as "
        "truncated). null: the model's positions "
        "(max_position_embeddings).")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, exclude_if=_is(None),
        description="Extra keyword arguments for the tokenizer's chat template when prompts and tool "
        "results are rendered (e.g. {enable_thinking: false}), as TRL's.")
    beta: float = Field(0.0, ge=0.0, le=100.0, description="KL coefficient; 0 builds no reference model.")
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="Lower clip range epsilon_low.")
    epsilon_high: float | None = Field(
        None, gt=0.0, le=10.0, description="Upper clip range; defaults to epsilon."
    )
    delta: float | None = Field(None, gt=1.0, le=1000.0, description="Dual-clip upper bound on the ratio.")
    loss_type: LossType = Field(
        "dapo", description="How the per-token loss is averaged: grpo (each completion's mean, then the "
        "mean over completions), bnpo (mean over the step's tokens), dr_grpo (sum over the number of "
        "completions times max_completion_length: no length bias), dapo (mean over the generation round's "
        "tokens per step; bnpo unless a round feeds several steps).")
    scale_rewards: ScaleRewards = Field(
        "group", description="How each reward is divided by a standard deviation before it becomes an "
        "advantage: group (the std of its prompt's group), batch (the std over the whole step) or none "
        "(not at all: Dr. GRPO). TRL's true and false mean group and none.")
    num_iterations: int = Field(1, ge=1, le=64, description="mu: optimizer passes per generation batch.")
    mask_truncated_completions: bool = Field(
        False, description="Leave out of the loss the completions cut at max_completion_length (no EOS), "
        "as DAPO recommends; they still count in the group's reward statistics.")
    drop_zero_std_groups: bool = Field(
        False, description="DAPO dynamic sampling: resample groups whose rewards are all equal."
    )
    max_resample_batches: int = Field(
        2, ge=0, le=64, description="Cap on extra generation batches per step for drop_zero_std_groups."
    )
    learning_rate: float = Field(1.0e-6, gt=0.0, le=1.0, description="AdamW's peak learning rate.")
    lr_scheduler_type: LRSchedulerType = Field(
        "linear", description="The learning rate over the run, after warmup_steps of linear warmup from 0: "
        "linear (decays to 0), cosine (half a cosine down to 0), constant (no warmup either), "
        "constant_with_warmup.")
    warmup_steps: float = Field(
        0, ge=0, le=10_000_000, description="Linear warmup from 0: a whole number of steps, or below 1 the "
        "fraction of the total steps (rounded up), as in transformers 5.")
    weight_decay: float = Field(0.0, ge=0.0, le=10.0, description="AdamW's decoupled weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0,
                              description="AdamW's decay of the gradient's running mean.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0,
                              description="AdamW's decay of the squared gradient's running mean.")
    adam_epsilon: float = Field(1.0e-8, gt=0.0, le=1.0, description="AdamW's term added to the denominator.")
    max_grad_norm: float = Field(1.0, ge=0.0, le=1.0e6, description="0 disables clipping.")
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=4096, description="Micro-batches an optimizer step's completions are split into, to "
        "save memory; the step's gradient is the same whatever the split.")
    max_steps: int = Field(
        -1, ge=-1, le=10_000_000, description="Optimizer steps to train; -1: num_train_epochs passes over "
        "the dataset's prompts (resolved once the dataset is loaded, see steps_for).")
    num_train_epochs: float = Field(
        3.0, gt=0.0, le=1_000_000.0, description="With max_steps -1: passes over the prompts. One pass is "
        "ceil(prompts / prompts_per_step) generation batches of num_iterations steps each.")
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Seeds the prompt order, the sampling and any "
                      "random initialisation (a LoRA adapter's).")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass "
                                         "instead of keeping them: less memory, slower steps.")
    save_total_limit: int | None = Field(
        None, ge=1, le=1_000_000, description="TRL's name for checkpoint_keep_last (top level): how many "
        "checkpoints are kept. Giving both with different values is an error.")

    # --- evaluation during training (TRL's eval_strategy, eval_steps, eval_on_start) ---------
    # Each is left out of a dumped spec at its default (exclude_if): a spec without evaluation dumps
    # as it did before these fields existed, so stored specs and idempotency keys stay the same.
    eval_strategy: EvalStrategy = Field(
        "no", exclude_if=_is("no"),
        description="When the policy is evaluated on the spec's eval_dataset: no (never), or steps "
        "(every eval_steps optimizer steps, and always at the final step).")
    eval_steps: float | None = Field(
        None, exclude_if=_is(None), gt=0, le=10_000_000,
        description="With eval_strategy steps: optimizer steps between "
        "evaluations, a whole number, or below 1 the fraction of the total steps (rounded up), as in TRL.")
    eval_on_start: bool = Field(False, exclude_if=_is(False),
                                description="Also evaluate the untrained policy, as step 0.")
    eval_num_generations: int = Field(
        1, exclude_if=_is(1), ge=1, le=1024,
        description="k: completions generated per eval prompt; eval_pass@k counts a prompt "
        "as passed when any of its k reaches eval_pass_threshold. TRL's num_generations_eval.")
    eval_temperature: float = Field(
        0.0, exclude_if=_is(0.0), ge=0.0, le=10.0,
        description="Sampling temperature of the eval completions; 0 is greedy (the "
        "most likely token each time). Sampling uses top_p, top_k and min_p as training does.")
    eval_pass_threshold: float = Field(
        1.0, exclude_if=_is(1.0), ge=-1e6, le=1e6,
        description="An eval completion passes when its reward (the weighted sum) "
        "is at least this; a prompt passes when one of its completions does (eval_pass@k).")

    # --- the best checkpoint and early stopping (transformers' names and meanings) ----------
    metric_for_best_model: str | None = Field(
        None, exclude_if=_is(None), min_length=1, max_length=160,
        description="The eval metric that decides the best checkpoint (eval_reward, eval_pass@k, "
        "eval_rewards/NAME/mean, ...; the eval_ prefix may be left out). Each new best eval point is "
        "checkpointed and never removed by retention. Default: eval_reward when load_best_model_at_end "
        "or early_stopping_patience is set.")
    greater_is_better: bool | None = Field(
        None, exclude_if=_is(None),
        description="Whether a higher metric_for_best_model is better; default: true unless the "
        "metric's name ends in 'loss' (transformers' rule).")
    load_best_model_at_end: bool = Field(
        False, exclude_if=_is(False),
        description="Export the best checkpoint's weights (by metric_for_best_model) as the job's "
        "final model instead of the last step's; the model card names its step.")
    early_stopping_patience: int | None = Field(
        None, exclude_if=_is(None), ge=1, le=100_000,
        description="End the run (as finished) after this many eval points in a row that did not "
        "improve metric_for_best_model on the best so far by more than early_stopping_threshold "
        "(transformers' EarlyStoppingCallback).")
    early_stopping_threshold: float = Field(
        0.0, exclude_if=_is(0.0), ge=0.0, le=1e12, allow_inf_nan=False,
        description="How much better than the best so far an eval point must be to count as an "
        "improvement for early_stopping_patience.")

    # TRL fields dropped because their value asks for nothing (grpo_core.spec.trl_fields.OFF), with
    # that value: the submit and `grpo train` warn about each. Not part of the config itself.
    _ignored_trl_fields: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _trl_names(cls, data: Any, handler: ModelWrapValidatorHandler[GRPOConfig]) -> GRPOConfig:
        """Drop TRL fields set to a value that asks for nothing, refuse the other TRL fields we
        do not take, each with what to use instead, and read the old name of lr_scheduler_type
        (specs stored before the rename carry it)."""
        if not isinstance(data, dict):
            return handler(data)
        foreign = [name for name in refused_among(map(str, data)) if name not in cls.model_fields]
        ignored = {name: data[name] for name in foreign if is_off(name, data[name])}
        refused = [name for name in foreign if name not in ignored]
        if refused:
            advice = [PydanticCustomError("trl_field_refused", "{advice}",
                                          {"advice": refusal(name, data[name], data)}) for name in refused]
            raise ValidationError.from_exception_data(cls.__name__, [
                InitErrorDetails(type=error, loc=(name,), input=data[name])
                for name, error in zip(refused, advice, strict=True)])
        data = {name: value for name, value in data.items() if name not in ignored}
        if LEGACY_LR_SCHEDULER in data:
            legacy = data.pop(LEGACY_LR_SCHEDULER)
            if "lr_scheduler_type" in data:
                raise ValueError(f"give lr_scheduler_type only; {LEGACY_LR_SCHEDULER} is its old name")
            # The old "constant" warmed up when warmup_steps was set: that is transformers'
            # constant_with_warmup (whose "constant" never warms up).
            warmup = data.get("warmup_steps") or 0
            data["lr_scheduler_type"] = "constant_with_warmup" if legacy == "constant" and warmup else legacy
        config = handler(data)
        config._ignored_trl_fields = ignored
        return config

    @property
    def ignored_trl_fields(self) -> dict[str, Any]:
        """TRL fields the input set to a value that asks for nothing, dropped, with that value."""
        return dict(self._ignored_trl_fields)

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _trl_boolean_scaling(cls, value: Any) -> Any:
        # TRL 1.16 also spells group and none as true and false (Dr. GRPO's recipe writes false).
        if isinstance(value, bool):
            return "group" if value else "none"
        return value

    def steps_for(self, num_prompts: int) -> int:
        """The optimizer steps this config trains on a dataset of ``num_prompts`` prompts:
        ``max_steps``, or with -1 ``ceil(num_train_epochs * steps per epoch)`` as transformers
        resolves it, where an epoch is one pass over the prompts: ``ceil(num_prompts /
        prompts_per_round)`` generation rounds, each feeding ``round_steps`` optimizer steps
        ``num_iterations`` times."""
        if self.max_steps > 0:
            return self.max_steps
        per_epoch = math.ceil(num_prompts / self.prompts_per_round) * self.round_steps * self.num_iterations
        return max(1, math.ceil(self.num_train_epochs * per_epoch))

    def resolved(self, num_prompts: int) -> GRPOConfig:
        """This config with ``max_steps`` set to :meth:`steps_for` ``num_prompts``."""
        return self.model_copy(update={"max_steps": self.steps_for(num_prompts)})

    def warmup_steps_for(self, total_steps: int) -> int:
        """Warmup steps in a run of ``total_steps``: transformers' rule for a whole count or a ratio."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(total_steps * self.warmup_steps)

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

    @field_validator("warmup_steps")
    @classmethod
    def _whole_steps_or_a_ratio(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("must be a whole number of steps, or below 1 for a fraction of the total steps")
        return value

    @field_validator("eval_strategy", mode="before")
    @classmethod
    def _steps_only(cls, value: Any) -> Any:
        if value == "epoch":
            raise ValueError("'epoch' is not supported: use 'steps' with eval_steps (a fraction below 1 "
                             "of the run's steps works too)")
        return value

    @field_validator("eval_steps")
    @classmethod
    def _whole_eval_steps_or_a_ratio(cls, value: float | None) -> float | None:
        if value is not None and value >= 1 and value != int(value):
            raise ValueError("must be a whole number of steps, or below 1 for a fraction of the total steps")
        return value

    @property
    def best_model_metric(self) -> str | None:
        """The eval metric the best checkpoint is chosen by, with its ``eval_`` prefix; None when the
        run keeps no best (no metric, no load_best_model_at_end, no early stopping)."""
        metric = self.metric_for_best_model
        if metric is None:
            wanted = self.load_best_model_at_end or self.early_stopping_patience is not None
            return DEFAULT_BEST_MODEL_METRIC if wanted else None
        return metric if metric.startswith(EVAL_METRIC_PREFIX) else EVAL_METRIC_PREFIX + metric

    @property
    def best_model_greater_is_better(self) -> bool:
        if self.greater_is_better is not None:
            return self.greater_is_better
        return not (self.best_model_metric or "").endswith("loss")

    def eval_interval_for(self, total_steps: int) -> int | None:
        """Optimizer steps between evaluations in a run of ``total_steps`` (None: no evaluation);
        a fraction is rounded up, as transformers' Trainer does."""
        if self.eval_strategy == "no" or self.eval_steps is None:
            return None
        if self.eval_steps >= 1:
            return int(self.eval_steps)
        return max(1, math.ceil(total_steps * self.eval_steps))

    @field_validator("max_steps")
    @classmethod
    def _positive_or_by_epochs(cls, value: int) -> int:
        if value == 0:
            raise ValueError("must be >= 1, or -1 to train for num_train_epochs passes over the prompts")
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
    # TRL counts in micro-batches ("steps"): an optimizer step is gradient_accumulation_steps of
    # them, and one generation round of generation_batch_size completions is split into
    # steps_per_generation of them, replayed num_iterations times. Here an optimizer step is
    # prompts_per_step*num_generations rows split into gradient_accumulation_steps micro-batches,
    # which is TRL's per_device_train_batch_size*num_processes*gradient_accumulation_steps. So a
    # round feeds k = steps_per_generation / gradient_accumulation_steps
    #   = generation_batch_size / (prompts_per_step*num_generations)
    # optimizer steps per pass and k*num_iterations in all, in TRL's order (parts 0..k-1, then
    # again for each further iteration). The old log-probs are the generating policy's whenever
    # k*num_iterations > 1, as TRL's are, so the ratio is 1 on the round's first step only. Each
    # step trains whole groups (k*B prompts drawn per round, step j takes prompts j*B..j*B+B-1);
    # TRL shuffles rows across its micro-batches instead, which changes which rows share a step
    # but not how many generations a step sees nor how stale they are.
    steps_per_generation: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="TRL: micro-batches per generation round (default gradient_accumulation_steps); "
        "a multiple of gradient_accumulation_steps, so one round feeds "
        "steps_per_generation/gradient_accumulation_steps optimizer steps per num_iterations pass. "
        "Exclusive with generation_batch_size.",
    )
    generation_batch_size: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="TRL: completions sampled per generation round (default "
        "prompts_per_step*num_generations); a multiple of it, so one round feeds "
        "generation_batch_size/(prompts_per_step*num_generations) optimizer steps per num_iterations "
        "pass. Exclusive with steps_per_generation.",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="token: one importance ratio per token; sequence (GSPO): exp of the mean over the "
        "completion's tokens of logprobs - old_logprobs, shared by its tokens and clipped the same way.",
    )

    @property
    def round_steps(self) -> int:
        """k: optimizer steps one pass over a generation round takes (1 unless batching is set)."""
        if self.generation_batch_size is not None:
            return self.generation_batch_size // (self.prompts_per_step * self.num_generations)
        if self.steps_per_generation is not None:
            return self.steps_per_generation // self.gradient_accumulation_steps
        return 1

    @property
    def prompts_per_round(self) -> int:
        """Prompts drawn for one generation round: k optimizer steps' worth."""
        return self.round_steps * self.prompts_per_step

    @field_validator("steps_per_generation")
    @classmethod
    def _whole_optimizer_steps(cls, value: int | None, info: ValidationInfo) -> int | None:
        accumulation = info.data.get("gradient_accumulation_steps")
        if value is not None and accumulation is not None and value % accumulation != 0:
            raise ValueError(
                f"must be a multiple of gradient_accumulation_steps ({accumulation}) so a generation "
                "round feeds whole optimizer steps"
            )
        if value is not None and accumulation is not None:
            _refuse_resampling_across_steps(value // accumulation, info)
        return value

    @field_validator("generation_batch_size")
    @classmethod
    def _whole_steps_of_rows(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is None:
            return value
        if info.data.get("steps_per_generation") is not None:
            raise ValueError("set either generation_batch_size or steps_per_generation, not both")
        b, g = info.data.get("prompts_per_step"), info.data.get("num_generations")
        if b is not None and g is not None and value % (b * g) != 0:
            raise ValueError(
                f"must be a multiple of prompts_per_step*num_generations = {b * g} (one optimizer "
                "step's completions) so a generation round feeds whole optimizer steps"
            )
        if b is not None and g is not None:
            _refuse_resampling_across_steps(value // (b * g), info)
        return value


def _refuse_resampling_across_steps(round_steps: int, info: ValidationInfo) -> None:
    """drop_zero_std_groups resamples to fill one step's batch; a round that feeds several steps
    would need it to fill each of them, which is not built."""
    if round_steps > 1 and info.data.get("drop_zero_std_groups"):
        raise ValueError("cannot be combined with drop_zero_std_groups yet: set one or the other")
