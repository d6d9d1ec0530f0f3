"""TRL ``GRPOConfig`` fields this service does not take: what to use instead, and which of their
values ask for nothing.

A TRL user pastes their config under ``grpo:``. The fields whose meaning we share are accepted
(:class:`grpo_core.spec.grpo_config.GRPOConfig`). Every other field of TRL's ``GRPOConfig`` (which includes
all of ``transformers.TrainingArguments``) is refused with the advice below rather than pydantic's
bare "extra inputs are not permitted", so the user learns where the setting went, unless it holds
its value in :data:`OFF`: TRL's default where that default asks for nothing this service does not
already do. Such a field is dropped with a warning (:func:`ignored_message`), so a pasted config
that only repeats TRL's defaults (``push_to_hub: false``, ``use_vllm: false``) is taken. Tests load
the installed TRL and check that each of its fields is accepted or listed here, and that every
value in :data:`OFF` is TRL's default.

Plain data: TRL is a test-only dependency and is never imported at run time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

_BATCH = ("the batch is grpo.prompts_per_step prompts x grpo.num_generations completions per optimizer "
          "step, split over resources.gpus")
_DTYPE = "set model.dtype (float32 | bfloat16 | float16)"
_MANAGED_OUTPUT = ("the service manages where a job writes and logs: every step's metrics are kept "
                   "(GET /v1/jobs/{id}/metrics, the dashboard); add trackers with the top-level report_to")
_HUB = ("the service keeps the final model (download it from GET /v1/jobs/{id}/model) and does not "
        "push to the Hugging Face Hub")
_EVAL = ("evaluation is grpo.eval_strategy (no | steps), eval_steps, eval_on_start, eval_num_generations, "
         "eval_temperature and eval_pass_threshold, on the top-level eval_dataset")
_PLACEMENT = ("the worker places the job: set resources.gpus and resources.sharding (ddp | fsdp); "
              "ranks are launched for you")
_DATA_LOADING = "prompts are drawn by the core's own seeded sampler (dataset.shuffle, grpo.seed)"
_OPTIMIZER = ("the optimizer is AdamW: grpo.learning_rate, weight_decay, adam_beta1, adam_beta2, "
              "adam_epsilon, max_grad_norm")
_ENGINE = ("not configurable: generation and training run in the core's own loops "
           "(grpo.gradient_checkpointing is the memory switch)")
_MODEL_LOADING = "load options come from the model: section (source, dtype, lora); no remote code is run"
_SAMPLING = ("set grpo.temperature, top_p, top_k, min_p and repetition_penalty; other generate() options "
             "are not taken")
_VLLM = "not supported: generation runs in the core's own sampling loop, not vLLM"
_NOT_IMPLEMENTED = "not implemented by this service's GRPO core"
_COMPLETION_LOGS = ("sample completions are kept every log_completions_every steps (top level) and shown on "
                    "the dashboard")

# field name -> what to use instead. Grouped by where the setting lives in this service.
REFUSED: dict[str, str] = {
    # batch size
    **dict.fromkeys(("per_device_train_batch_size", "auto_find_batch_size"), _BATCH),
    # precision
    **dict.fromkeys(("bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "torch_dtype"), _DTYPE),
    "tf32": "not configurable: TF32 matmuls follow PyTorch's defaults on the worker",
    "cast_lm_head_to_fp32": f"not configurable; {_DTYPE}",
    # checkpoints
    **dict.fromkeys(("save_strategy", "save_steps"),
                    "use checkpoint_every (steps between checkpoints, top level)"),
    **dict.fromkeys(("save_only_model", "save_on_each_node", "enable_jit_checkpoint"),
                    "checkpoints are full (model, optimizer, data position) and written by the job itself; "
                    "see checkpoint_every and checkpoint_keep_last (top level)"),
    "resume_from_checkpoint": ("a job resumes from its newest checkpoint by itself; to start from another "
                               "job's weights set model.source to job:ID or job:ID@STEP"),
    "ignore_data_skip": "a resumed job continues the exact data order from its checkpoint",
    "restore_callback_states_from_checkpoint": "a resumed job restores all of its state from its checkpoint",
    # outputs and logging
    **dict.fromkeys(("output_dir", "logging_dir", "overwrite_output_dir", "logging_strategy", "logging_steps",
                     "logging_first_step", "log_on_each_node", "logging_nan_inf_filter", "log_level",
                     "log_level_replica", "disable_tqdm", "run_name", "project", "trackio_space_id",
                     "trackio_bucket_id", "trackio_static_space_id", "include_num_input_tokens_seen",
                     "skip_memory_metrics"), _MANAGED_OUTPUT),
    "report_to": ("report_to belongs at the top level of the spec (tensorboard | wandb | mlflow), "
                  "not under grpo:"),
    **dict.fromkeys(("log_completions", "log_multimodal", "num_completions_to_print", "log_unique_prompts"),
                    _COMPLETION_LOGS),
    # the hub
    **dict.fromkeys(("push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy",
                     "hub_always_push", "hub_revision", "log_completions_hub_repo"), _HUB),
    # evaluation
    **dict.fromkeys(("eval_delay", "per_device_eval_batch_size", "prediction_loss_only",
                     "eval_do_concat_batches", "eval_use_gather_object", "eval_accumulation_steps",
                     "include_for_metrics", "batch_eval_metrics", "do_eval", "do_predict"), _EVAL),
    "num_generations_eval": "use grpo.eval_num_generations (its default here is 1, not num_generations)",
    "do_train": "a job always trains; leave it out",
    # devices and distribution
    **dict.fromkeys(("use_cpu", "local_rank", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
                     "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend", "ddp_timeout", "fsdp",
                     "fsdp_config", "deepspeed", "accelerator_config", "parallelism_config",
                     "ds3_gather_for_generation", "debug"), _PLACEMENT),
    # data loading
    **dict.fromkeys(("dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory",
                     "dataloader_persistent_workers", "dataloader_prefetch_factor",
                     "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns",
                     "label_names", "train_sampling_strategy", "length_column_name"), _DATA_LOADING),
    "shuffle_dataset": "use dataset.shuffle",
    "data_seed": "grpo.seed also seeds the prompt order",
    # optimizer and schedule
    **dict.fromkeys(("optim", "optim_args", "optim_target_modules", "label_smoothing_factor",
                     "average_tokens_across_devices"), _OPTIMIZER),
    "lr_scheduler_kwargs": ("grpo.lr_scheduler_type's schedules take no extra arguments "
                            "(cosine is half a cycle)"),
    "warmup_ratio": ("set grpo.warmup_steps below 1: it is then a fraction of the total steps "
                     "(as in transformers 5)"),
    # engine switches
    **dict.fromkeys(("torch_compile", "torch_compile_backend", "torch_compile_mode", "use_liger_kernel",
                     "liger_kernel_config", "use_cache", "torch_empty_cache_steps", "neftune_noise_alpha",
                     "full_determinism", "pad_to_multiple_of", "cache_implementation",
                     "use_transformers_continuous_batching", "transformers_continuous_batching_config",
                     "use_transformers_paged"), _ENGINE),
    **dict.fromkeys(("activation_checkpointing", "activation_checkpointing_kwargs",
                     "gradient_checkpointing_kwargs"), "use grpo.gradient_checkpointing (true | false)"),
    # model loading
    **dict.fromkeys(("model_init_kwargs", "trust_remote_code", "router_aux_loss_coef"), _MODEL_LOADING),
    "disable_dropout": "dropout is always off while training (GRPO needs the on-policy ratio to be 1)",
    # generation
    "generation_kwargs": _SAMPLING,
    **dict.fromkeys(("use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode",
                     "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_server_host",
                     "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
                     "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
                     "vllm_importance_sampling_correction",
                     "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                     "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap"), _VLLM),
    # rewards
    "reward_weights": "give each reward its weight in rewards[].weight",
    "multi_objective_aggregation": ("rewards are summed with their weights (rewards[].weight), then "
                                    "normalized per grpo.scale_rewards"),
    # loss variants
    "use_bias_correction_kl": "always on: the KL term is multiplied by the importance ratio, TRL's default",
    **dict.fromkeys(("sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos",
                     "vespo_k_neg", "vespo_lambda_neg", "sync_ref_model", "ref_model_mixup_alpha",
                     "ref_model_sync_steps", "top_entropy_quantile", "entropy_coef", "use_adaptive_entropy",
                     "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
                     "off_policy_mask_threshold"), _NOT_IMPLEMENTED),
}


# --- values that ask for nothing ----------------------------------------------------------------
# field -> TRL 1.16's default, grouped by why setting it to that changes nothing here. A field not
# listed (or set to anything else) is refused: TRL defaults that do ask for something stay refused,
# e.g. per_device_train_batch_size 8 (a batch size), bf16 None (TRL then trains in bf16),
# save_steps 500 and logging_steps 10 (cadences unlike ours), disable_dropout false (ours is always
# off), shuffle_dataset true (dataset.shuffle may say otherwise), ddp_timeout 1800 (the service's
# rank timeout is the operator's).
_SWITCHED_OFF = "leaves a feature off"
_UNSET = "leaves the option unset"
_UNUSED_HERE = ("is only read while a feature is on that this service does not have (TRL's eval batching "
                "and delay, the hub, vLLM, DeepSpeed, Neuron, trackio, images, TRL's other loss types, "
                "adaptive entropy)")
_ALREADY_SO = "asks for what this service does anyway"
_OFF_GROUPS: dict[str, dict[str, Any]] = {
    _SWITCHED_OFF: {
        **dict.fromkeys(("auto_find_batch_size", "fp16", "bf16_full_eval", "fp16_full_eval",
                         "cast_lm_head_to_fp32", "save_on_each_node", "enable_jit_checkpoint",
                         "restore_callback_states_from_checkpoint",
                         "logging_first_step", "log_completions", "log_unique_prompts", "push_to_hub",
                         "hub_always_push", "prediction_loss_only", "eval_use_gather_object",
                         "batch_eval_metrics", "do_eval", "do_predict", "do_train", "use_cpu",
                         "torch_compile", "use_liger_kernel", "full_determinism",
                         "use_transformers_continuous_batching", "use_transformers_paged",
                         "trust_remote_code", "use_vllm", "sync_ref_model", "use_adaptive_entropy",
                         "dataloader_persistent_workers"), False),
        "skip_memory_metrics": True,
        "include_num_input_tokens_seen": "no",
        "report_to": "none",  # under grpo:; the trackers are the top-level report_to
        "debug": "",
        "label_smoothing_factor": 0.0,
        "entropy_coef": 0.0,
        "dataloader_num_workers": 0,
    },
    _UNSET: {
        **dict.fromkeys(("output_dir", "lr_scheduler_kwargs", "optim_args", "optim_target_modules",
                         "activation_checkpointing", "activation_checkpointing_kwargs",
                         "gradient_checkpointing_kwargs", "torch_compile_backend", "torch_compile_mode",
                         "liger_kernel_config", "neftune_noise_alpha", "torch_empty_cache_steps",
                         "disable_tqdm", "run_name", "trackio_space_id", "trackio_bucket_id",
                         "trackio_static_space_id", "eval_accumulation_steps", "hub_token",
                         "hub_private_repo", "hub_model_id", "hub_revision",
                         "accelerator_config", "parallelism_config",
                         "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "label_names",
                         "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
                         "ddp_static_graph", "ddp_backend", "fsdp", "fsdp_config", "deepspeed",
                         "resume_from_checkpoint", "model_init_kwargs", "router_aux_loss_coef",
                         "num_generations_eval", "generation_kwargs",
                         "cache_implementation", "transformers_continuous_batching_config", "reward_weights",
                         "off_policy_mask_threshold",
                         "num_completions_to_print", "log_completions_hub_repo"), None),
        "include_for_metrics": [],
        "local_rank": -1,
    },
    _UNUSED_HERE: {
        "hub_strategy": "every_save", "project": "huggingface",  # the hub, trackio
        "per_device_eval_batch_size": 8, "eval_do_concat_batches": True, "eval_delay": 0,
        "log_multimodal": True, "ds3_gather_for_generation": True, "pad_to_multiple_of": "auto",
        "length_column_name": "length",  # group_by_length, which TRL's GRPOTrainer does not use
        # TRL's GRPOTrainer samples prompts with its own sampler, whatever this says
        "train_sampling_strategy": "random",
        "vllm_mode": "colocate", "vllm_model_impl": "vllm", "vllm_enable_sleep_mode": False,
        "vllm_structured_outputs_regex": None, "vllm_server_base_url": None,
        "vllm_server_host": "0.0.0.0", "vllm_server_port": 8000, "vllm_server_timeout": 240.0,
        "vllm_group_port": 51216, "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": None,
        "vllm_tensor_parallel_size": 1, "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 3.0,
        "vllm_importance_sampling_clip_min": None, "vllm_importance_sampling_cap": None,
        # loss_type sapo and vespo, sync_ref_model, use_adaptive_entropy
        "sapo_temperature_neg": 1.05, "sapo_temperature_pos": 1.0,
        "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0,
        "ref_model_mixup_alpha": 0.6, "ref_model_sync_steps": 512,
        "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005, "entropy_target": 0.2,
        # prompts are rows tokenized in the loop: no DataLoader
        "dataloader_pin_memory": True, "dataloader_in_order": True,
        # a job's ranks are all on one worker
        "log_on_each_node": True,
    },
    _ALREADY_SO: {
        "save_strategy": "steps",  # checkpoints every checkpoint_every steps
        "save_only_model": False,  # checkpoints hold the optimizer and data position too
        "ignore_data_skip": False,  # a resumed job continues the exact data order
        "dataloader_drop_last": False,  # an epoch's last, partial batch of prompts is trained
        "remove_unused_columns": False,  # a row's other columns reach the rewards
        "data_seed": None,  # grpo.seed also seeds the prompt order
        "tf32": None,  # PyTorch's defaults
        "optim": "adamw_torch_fused",  # torch's AdamW, fused where the parameters allow
        "average_tokens_across_devices": True,  # a step's loss is normalised over all its ranks' tokens
        "logging_strategy": "steps",  # metrics are kept for every step
        "log_level": "passive",  # the library's log levels are left alone
        "multi_objective_aggregation": "sum_then_normalize",  # rewards[].weight, then scale_rewards
        "use_bias_correction_kl": True,  # the KL term is multiplied by the importance ratio
        "top_entropy_quantile": 1.0,  # every completion token is in the loss
        "use_cache": False,  # training forward passes keep no KV cache
    },
}
OFF: dict[str, Any] = {name: value for group in _OFF_GROUPS.values() for name, value in group.items()}
_WHY_OFF = {name: why for why, group in _OFF_GROUPS.items() for name in group}


def is_off(name: str, value: Any) -> bool:
    """Whether ``name: value`` is a refused TRL field holding its value in :data:`OFF` (YAML's
    ``false`` is not ``0``; ``240`` is ``240.0``)."""
    if name not in OFF:
        return False
    off = OFF[name]
    if isinstance(off, bool) or isinstance(value, bool):
        return type(value) is type(off) and value == off
    return value == off


def ignored_message(name: str, value: Any) -> str:
    """Why ``name: value`` is ignored, and where the setting lives in this service."""
    return (f"ignored: {json.dumps(value)} is TRL's default and {_WHY_OFF[name]}; this service does not "
            f"take '{name}': {REFUSED[name]}")


def _prompts_per_step_advice(value: Any, config: Mapping[str, Any]) -> str:
    """TRL's batch is per_device_train_batch_size completions per device per micro-batch; ours is
    prompts_per_step prompts of num_generations completions per optimizer step."""
    formula = ("set grpo.prompts_per_step = per_device_train_batch_size × resources.gpus × "
               "gradient_accumulation_steps / num_generations")
    generations, accumulation = config.get("num_generations", 8), config.get("gradient_accumulation_steps", 1)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
               for n in (value, generations, accumulation)):
        return formula
    completions = value * accumulation
    worked = f"{value} × 1 × {accumulation} / {generations}"
    if completions % generations:
        return (f"{formula} ({worked} on one GPU is not a whole number of prompts: TRL's batch must hold "
                "whole groups of num_generations completions)")
    return f"{formula} ({worked} = {completions // generations} on one GPU)"


# Advice that depends on the value and the rest of the grpo: section.
_COMPUTED_ADVICE: dict[str, Callable[[Any, Mapping[str, Any]], str]] = {
    "per_device_train_batch_size": _prompts_per_step_advice,
}


def refusal(name: str, value: Any = None, config: Mapping[str, Any] | None = None) -> str:
    """The message for a refused TRL field: it names the field and what to use instead.
    ``config``: the whole ``grpo:`` section, for advice worked out from its values."""
    compute = _COMPUTED_ADVICE.get(name)
    advice = REFUSED[name] if compute is None else compute(value, config or {})
    return f"'{name}' is a TRL GRPOConfig field this service does not take: {advice}"


def refused_among(names: Iterable[str]) -> list[str]:
    """The names in ``names`` that are refused TRL fields, in their order."""
    return [name for name in names if name in REFUSED]
