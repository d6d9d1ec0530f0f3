"""``reward_model``: a sequence-classification model scores prompt + completion, as TRL's reward
models do. The model is loaded once, when the job binds its rewards, onto the job's own device
(each rank of a multi-GPU job has its own copy and scores its own rows) in the job's dtype,
in eval mode with no gradients; its forward passes run in batches of ``batch_size``.

This module is torch-free (the API validates args and serves the catalog from it); loading and
scoring are in :mod:`grpo_core.rewards.reward_model_scoring`; the args both read are in
:mod:`grpo_core.rewards.reward_model_args`.
"""

from __future__ import annotations

from grpo_core.rewards.reward_model_args import RewardModelArgs
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn

__all__ = ["REWARD_MODEL"]


def _build(args: RewardModelArgs, context: RewardContext) -> RewardFn:
    # torch and transformers only here, on the worker: the web process never builds a reward.
    from grpo_core.rewards.reward_model_scoring import load_scorer

    return load_scorer(args, context)


REWARD_MODEL = RewardDefinition(
    "reward_model",
    "The logit of a local sequence-classification reward model on prompt + completion (with the "
    "reward model's chat template when the prompt is a list of messages), as TRL scores them.",
    RewardModelArgs,
    _build,
    model_sources=lambda args: {"model": args.model},
)
