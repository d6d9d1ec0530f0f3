"""Reward functions: a registry of built-ins and ``grpo.rewards`` plugins, binding and scoring.

Torch-free on purpose, so the API and the CLI can validate reward specs and serve the catalog
without loading the training stack. ``sandbox`` runs untrusted code (``code_tests``) under
bubblewrap.

May import: ``grpo_core.io`` (a reward model is loaded like a policy), ``grpo_core.spec``, the
top-level foundations and this package.
"""

from grpo_core.rewards.registry import (
    available_rewards,
    bind_rewards,
    check_reward_rows,
    model_sources,
    required_capabilities,
    reward_catalog,
    sandbox_footprints,
    validate_reward_specs,
)
from grpo_core.rewards.reward_types import BoundReward, RewardContext, RewardDefinition
from grpo_core.rewards.scoring import RESERVED_COLUMNS, RowFailure, Scores, score_completions

__all__ = [
    "RESERVED_COLUMNS",
    "BoundReward",
    "RewardContext",
    "RewardDefinition",
    "RowFailure",
    "Scores",
    "available_rewards",
    "bind_rewards",
    "check_reward_rows",
    "model_sources",
    "required_capabilities",
    "reward_catalog",
    "sandbox_footprints",
    "score_completions",
    "validate_reward_specs",
]
