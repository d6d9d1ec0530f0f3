"""Everything a run needs, built from a ``RunSpec`` and checked before the first step.

Order matters for the user: cheap checks first (dataset, rewards and their columns), the
model last, so a typo in a reward name fails in milliseconds rather than after a model load.
:class:`RunComponents` only holds what was built: the trainer hands each function the pieces
it uses, and nothing below the trainer reads the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpo_core.agents.environment_runner import environment_reward
from grpo_core.agents.environment_setup import EnvironmentSetup
from grpo_core.agents.rendering import Conversations
from grpo_core.agents.tool_runner import sandbox_limits
from grpo_core.algorithm.episodes import AgentSetup
from grpo_core.algorithm.optim import build_optimizer, build_scheduler
from grpo_core.egress import EgressPolicy
from grpo_core.errors import SpecError
from grpo_core.io.model_loading import (
    PolicyAndReference,
    build_policy_and_reference,
    load_tokenizer,
    resolve_model_location,
)
from grpo_core.io.prompt_data import PromptSampler, PromptSet, columns_of, load_rows
from grpo_core.parallel.distributed import SINGLE, Ranks, in_process_group
from grpo_core.parallel.placement import Placement, place
from grpo_core.parallel.sharding import shard_models
from grpo_core.rewards import (
    BoundReward,
    RewardContext,
    bind_rewards,
    check_reward_rows,
    validate_reward_specs,
)
from grpo_core.rewards.sandbox import SandboxUnavailable, sandbox_problem
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.spec.prompt_rows import reserved_in
from grpo_core.spec.run_spec import ENVIRONMENT_REWARD, RunSpec
from grpo_core.spec.size_checks import positions_problem
from grpo_core.spec.tool_schemas import ToolSet
from grpo_core.spec.tools_spec import tools_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class RunComponents:
    spec: RunSpec
    placement: Placement
    tokenizer: PreTrainedTokenizerBase
    models: PolicyAndReference
    prompts: PromptSet
    rewards: list[BoundReward]
    sampler: PromptSampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    eos_ids: torch.Tensor
    eval_prompts: PromptSet | None = None  # the eval_dataset's, when the spec evaluates
    agent: AgentSetup | None = None  # the spec's tools: episodes are multi-turn

    @property
    def device(self) -> torch.device:
        return self.placement.device


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module) -> list[int]:
    """EOS ids from the tokenizer and the generation config (chat models often have several)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


def build_components(
    spec: RunSpec,
    *,
    models_root: Path | None = None,
    data_root: Path | None = None,
    base_dir: Path | None = None,
    device: str | None = None,
    ranks: Ranks = SINGLE,
    reward_models_root: Path | None = None,
    verifiers: Mapping[str, VerifierEndpoint] | None = None,
    egress: EgressPolicy | None = None,
) -> RunComponents:
    """``reward_models_root``: where rewards' ``path:`` models are (default ``models_root``; the
    service's models root when the policy comes from a job's artifacts). ``verifiers``: the
    verifier services ``http_verifier`` rewards and an environment's ``server`` may name (the
    service's registrations for the job, or ``grpo train --verifier``); ``egress``: the networks an
    environment server's sessions may reach besides public addresses (none by default)."""
    rows = load_rows(spec.dataset, data_root=data_root, base_dir=base_dir)
    # max_steps -1 (train by epochs) becomes a step count now that the prompts are counted: every
    # reader below (schedule, trainer, progress) sees the one number.
    spec = spec.model_copy(update={"grpo": spec.grpo.resolved(len(rows))})
    columns = columns_of(rows)
    clash = reserved_in(columns)
    if clash:
        raise SpecError("dataset", f"column names {clash} are reserved for the reward function arguments")
    validate_reward_specs(spec.rewards, columns)  # cheap; binding may load a reward model
    eval_rows = _eval_rows(spec, data_root=data_root, base_dir=base_dir)
    location = resolve_model_location(spec.model, models_root, base_dir)
    tokenizer = load_tokenizer(location)
    check_reward_rows(spec.rewards, rows)
    tools = tools_of(spec.tools) if spec.tools is not None else None
    sandboxed = tools is not None or (spec.environment is not None and spec.environment.source is not None)
    if sandboxed and (problem := sandbox_problem()) is not None:
        what = "tools" if tools is not None else "environment"
        raise SandboxUnavailable(f"the job's {what} cannot run here: {problem}")
    conversations = Conversations(tokenizer, tools, spec.grpo.chat_template_kwargs)
    prompts = PromptSet(rows, [conversations.prompt_text(row["prompt"]) for row in rows])
    eval_prompts = None
    if eval_rows is not None:
        check_reward_rows(spec.rewards, eval_rows)
        eval_prompts = PromptSet(eval_rows, [conversations.prompt_text(row["prompt"]) for row in eval_rows])
    placement = place(device, spec.model.dtype, ranks)
    context = RewardContext(tokenizer=tokenizer, timeout_seconds=spec.reward_timeout_seconds,
                            models_root=reward_models_root or models_root, base_dir=base_dir,
                            device=placement.device, dtype=spec.model.dtype, verifiers=dict(verifiers or {}))
    rewards = bind_rewards(spec.rewards, context, columns)
    if spec.environment is not None:
        rewards.append(BoundReward(ENVIRONMENT_REWARD, 1.0, environment_reward))
    torch.manual_seed(spec.grpo.seed)  # after any reward model's load, so it draws nothing of the policy's
    # Sharded wherever the ranks form a process group: k ranks, or one launched rank (a 1-GPU
    # measurement of FSDP's own cost); a plain process has no group to shard over.
    sharded = spec.resources.sharding == "fsdp" and in_process_group()
    # A sharded model is loaded on the CPU: fully_shard moves it to the device one layer at a time
    # and keeps only this rank's shard there, so no GPU ever holds the whole policy and reference.
    load_device = torch.device("cpu") if sharded else placement.device
    models = build_policy_and_reference(
        spec.model, location, spec.grpo.beta, load_device, spec.grpo.gradient_checkpointing
    )
    # The service checks this at submit where it can read the model's config.json; an hf: model
    # (or an upload whose config it did not reach) is checked here, before the first step.
    too_long = positions_problem(spec.grpo.max_prompt_length, spec.grpo.max_completion_length,
                                 models.policy.config.to_dict())
    if too_long is not None:
        raise too_long
    models.policy.train()
    if sharded:
        shard_models(models, ranks)  # before the optimizer, which must hold the shards
    optimizer = build_optimizer(models.policy, spec.grpo)
    eos = eos_token_ids(tokenizer, models.policy)
    if not eos:
        raise SpecError("model.source", "neither the tokenizer nor the generation config names an EOS token")
    return RunComponents(
        spec=spec,
        placement=placement,
        tokenizer=tokenizer,
        models=models,
        prompts=prompts,
        rewards=rewards,
        sampler=PromptSampler(
            len(rows), spec.grpo.prompts_per_round, spec.grpo.seed, shuffle=spec.dataset.shuffle
        ),
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, spec.grpo),
        eos_ids=torch.tensor(eos, device=placement.device),
        eval_prompts=eval_prompts,
        agent=_agent_setup(spec, conversations, tools, models.policy.config.max_position_embeddings,
                           verifiers, egress),
    )


def _agent_setup(
    spec: RunSpec, conversations: Conversations, tools: ToolSet | None, positions: int,
    servers: Mapping[str, VerifierEndpoint] | None, egress: EgressPolicy | None,
) -> AgentSetup | None:
    """What the job's episodes need, when they are multi-turn (tools or an environment; a
    registered environment server is looked up in ``servers`` and reached through ``egress``)."""
    if tools is None and spec.environment is None:
        return None
    environment = None if spec.environment is None else EnvironmentSetup.of(spec.environment, servers, egress)
    return AgentSetup(
        conversations, tools, sandbox_limits(spec.tool_limits), spec.grpo.max_tool_calling_iterations,
        spec.grpo.max_trajectory_length or positions,
        environment=environment,
        max_prompt_length=spec.grpo.max_prompt_length,
    )


def _eval_rows(
    spec: RunSpec, *, data_root: Path | None, base_dir: Path | None
) -> list[dict[str, Any]] | None:
    """The eval_dataset's rows when the spec evaluates (none otherwise: an unused eval_dataset is
    not loaded), checked as the dataset's are: no reserved column, the columns the rewards read."""
    if spec.eval_dataset is None or spec.grpo.eval_strategy == "no":
        return None
    rows = load_rows(spec.eval_dataset, data_root=data_root, base_dir=base_dir)
    columns = columns_of(rows)
    clash = reserved_in(columns)
    if clash:
        raise SpecError("eval_dataset", f"column names {clash} are reserved for the reward function "
                        "arguments")
    validate_reward_specs(spec.rewards, columns)
    return rows
