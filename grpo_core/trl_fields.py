"""TRL ``GRPOConfig`` fields this service does not take, each with what to use instead.

A TRL user pastes their config under ``grpo:``. The fields whose meaning we share are accepted
(:class:`grpo_core.config.GRPOConfig`); every other field of TRL's ``GRPOConfig`` (which includes
all of ``transformers.TrainingArguments``) is refused with the advice below rather than pydantic's
bare "extra inputs are not permitted", so the user learns where the setting went. A test loads the
installed TRL and checks that each of its fields is accepted or listed here.

Plain data: TRL is a test-only dependency and is never imported at run time.
"""

from __future__ import annotations

from collections.abc import Iterable

_BATCH = ("the batch is grpo.prompts_per_step prompts x grpo.num_generations completions per optimizer "
          "step, split over resources.gpus")
_DTYPE = "set model.dtype (float32 | bfloat16 | float16)"
_MANAGED_OUTPUT = ("the service manages where a job writes and logs: every step's metrics are kept "
                   "(GET /v1/jobs/{id}/metrics, the dashboard); add trackers with the top-level report_to")
_HUB = ("the service keeps the final model (download it from GET /v1/jobs/{id}/model) and does not "
        "push to the Hugging Face Hub")
_NO_EVAL = "there is no evaluation loop; watch the training metrics or evaluate the final model yourself"
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
    **dict.fromkeys(("load_best_model_at_end", "metric_for_best_model", "greater_is_better"), _NO_EVAL),
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
    **dict.fromkeys(("eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size",
                     "prediction_loss_only", "eval_on_start", "eval_do_concat_batches",
                     "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics",
                     "batch_eval_metrics", "do_eval", "do_predict", "num_generations_eval"), _NO_EVAL),
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
    **dict.fromkeys(("generation_kwargs", "chat_template_kwargs"), _SAMPLING),
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
                     "max_tool_calling_iterations", "off_policy_mask_threshold"), _NOT_IMPLEMENTED),
}


def refusal(name: str) -> str:
    """The message for a refused TRL field: it names the field and what to use instead."""
    return f"'{name}' is a TRL GRPOConfig field this service does not take: {REFUSED[name]}"


def refused_among(names: Iterable[str]) -> list[str]:
    """The names in ``names`` that are refused TRL fields, in their order."""
    return [name for name in names if name in REFUSED]
