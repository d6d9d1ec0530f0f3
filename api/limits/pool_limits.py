"""What a pool allows a job to ask for: its admins' overrides (:class:`api.schemas.admin.PoolLimits`)
over the deployment's defaults (``GRPO_POOL_*``), and the check of a spec against them: at submit,
and for a run whose length is only known once its dataset is loaded (``max_steps: -1`` over a file
or hub dataset), its step limits again on the worker.

Every spec field is bounded on its own; these bound what the fields multiply to (tokens a step
holds in memory, checkpoints a run writes, rows a spec carries, memory its rewards' sandboxes
hold), which is what a careless or hostile spec uses to take a shared worker's memory or disk
from every other team.

Evaluation (``eval_dataset``) is counted too. An eval point generates ``eval_num_generations``
completions for every eval prompt on top of its step's training: its tokens are held to the same
per-step bound as a generation round's, so no eval set makes one step cost more than the pool's
largest training batch (and no eval batch, a part of that pass, holds more). Its inline rows
count with the training rows against the inline bytes: both are stored in the one spec.
"""

from __future__ import annotations

import json
import math

from api.domain.job_spec import JobSpec
from api.schemas.admin import PoolLimits
from api.settings import Settings
from grpo_core.agents.environment_runner import environment_sandbox_bytes
from grpo_core.agents.tool_runner import PARALLEL_SANDBOXES, tool_sandbox_bytes
from grpo_core.errors import SpecError
from grpo_core.rewards import available_rewards, sandbox_footprints
from grpo_core.spec.environment_spec import EnvironmentSpec
from grpo_core.spec.run_spec import RewardSpec

MIB = 2**20
# The args that size a reward's sandboxes, named in a refusal where the reward has them.
SANDBOX_SIZING_ARGS = ("memory_mb", "max_processes", "parallel")
EVAL_ROWS_FIELD = "eval_dataset.prompts"


def effective_limits(overrides: PoolLimits, settings: Settings) -> PoolLimits:
    """The overrides with every unset field at its default (job_memory_bytes stays None: the
    worker derives it from its own memory)."""
    defaults = PoolLimits(max_tokens_per_step=settings.pool_max_tokens_per_step,
                          max_steps=settings.pool_max_steps,
                          max_checkpoints_per_job=settings.pool_max_checkpoints_per_job,
                          max_inline_dataset_bytes=settings.pool_max_inline_dataset_bytes,
                          max_sandbox_memory_bytes=settings.pool_max_sandbox_memory_bytes)
    return defaults.model_copy(update=overrides.model_dump(exclude_none=True))


def tokens_per_step(spec: JobSpec) -> int:
    """Tokens of the largest batch a job holds at once: a generation round, which is one step's
    prompts unless steps_per_generation / generation_batch_size make it feed several steps."""
    grpo = spec.grpo
    sequence = grpo.max_prompt_length + grpo.max_completion_length
    return grpo.prompts_per_round * grpo.num_generations * sequence


def limit_problems(spec: JobSpec, limits: PoolLimits) -> list[SpecError]:
    """One error per limit the spec is over, on the field to change, with the figures. A run
    whose length is not known yet (max_steps -1 over a file or hub dataset) has its step limits
    checked by the worker once it has counted the prompts (:func:`step_limit_problems`)."""
    pool, problems = f"pool '{spec.resources.pool}'", []
    tokens = tokens_per_step(spec)
    if limits.max_tokens_per_step is not None and tokens > limits.max_tokens_per_step:
        rounds = spec.grpo.round_steps
        per_round = f" × {rounds} steps per generation round" if rounds > 1 else ""
        problems.append(SpecError("grpo", (
            f"prompts_per_step × num_generations × (max_prompt_length + max_completion_length){per_round} = "
            f"{tokens:,} tokens per step; {pool} allows at most {limits.max_tokens_per_step:,}: "
            "lower one of them")))
    steps = spec.known_steps()
    if steps is not None:
        problems += step_limit_problems(spec, steps, limits)
    evaluation = spec.eval_dataset if spec.grpo.eval_strategy != "no" else None  # unused otherwise
    if evaluation is not None and evaluation.prompts is not None:
        problems += eval_limit_problems(spec, len(evaluation.prompts), limits)
    if limits.max_inline_dataset_bytes is not None:
        problems += inline_bytes_problems(spec, limits.max_inline_dataset_bytes)
    if limits.max_sandbox_memory_bytes is not None:
        problems += sandbox_problems(spec.rewards, spec.resources.pool, spec.resources.gpus,
                                     limits.max_sandbox_memory_bytes)
        problems += tool_problems(spec, limits.max_sandbox_memory_bytes)
        episodes = spec.grpo.prompts_per_round * spec.grpo.num_generations
        problems += environment_problems(spec.environment, episodes, spec.resources.pool,
                                         limits.max_sandbox_memory_bytes)
    return problems


def environment_problems(environment: EnvironmentSpec | None, episodes: int, pool: str,
                         limit: int) -> list[SpecError]:
    """An environment's sandboxes over the pool's sandbox memory: each live episode holds one.
    A job's generation round has its episodes live at once (all ranks' together here: the
    prompts it draws × num_generations); a dry run plays one."""
    if environment is None or environment.source is None:  # a server's episodes hold no sandbox here
        return []
    held = environment_sandbox_bytes(environment, episodes)
    if held <= limit:
        return []
    what = f"a generation round's {episodes} episodes (prompts × num_generations)" if episodes > 1 else \
        "an episode"
    return [SpecError("environment", (
        f"{what} may hold {held / MIB:,.0f} MiB, a sandbox each of max_processes × memory_mb and its "
        f"/tmp; pool '{pool}' allows at most {limit / MIB:,.0f} MiB: lower environment.memory_mb or "
        "max_processes"))]


def tool_problems(spec: JobSpec, limit: int) -> list[SpecError]:
    """A tools job's sandboxes over the pool's sandbox memory: a turn's calls run in up to
    PARALLEL_SANDBOXES sandboxes at once on each rank (rewards and tools never run together, so
    each is held to the limit alone)."""
    if spec.tools is None:
        return []
    ranks = spec.resources.gpus
    held = tool_sandbox_bytes(spec.tool_limits) * ranks
    if held <= limit:
        return []
    on_ranks = f" on {ranks} ranks (resources.gpus)" if ranks > 1 else ""
    return [SpecError("tool_limits", (
        f"a turn's tool calls may hold {held / MIB:,.0f} MiB{on_ranks} ({PARALLEL_SANDBOXES} sandboxes of "
        f"max_processes × memory_mb and their /tmp); pool '{spec.resources.pool}' allows at most "
        f"{limit / MIB:,.0f} MiB: lower tool_limits.memory_mb or max_processes"))]


def eval_tokens_per_point(spec: JobSpec, eval_prompts: int) -> int:
    """Tokens one eval point generates: every eval prompt's ``eval_num_generations`` sequences,
    counted as a round's are, prompt and completion (the prompt is held while its completion is
    generated)."""
    grpo = spec.grpo
    return eval_prompts * grpo.eval_num_generations * (grpo.max_prompt_length + grpo.max_completion_length)


def eval_limit_problems(spec: JobSpec, eval_prompts: int, limits: PoolLimits,
                        field: str = EVAL_ROWS_FIELD) -> list[SpecError]:
    """An eval point of ``eval_prompts`` prompts over the per-step token bound, on ``field``.
    Checked at submit for inline rows; a file or hub eval set by the worker once it has counted
    its prompts (``worker.counted_steps``, on ``eval_dataset.source``)."""
    tokens = eval_tokens_per_point(spec, eval_prompts)
    if limits.max_tokens_per_step is None or tokens <= limits.max_tokens_per_step:
        return []
    grpo = spec.grpo
    sequence = grpo.max_prompt_length + grpo.max_completion_length
    return [SpecError(field, (
        f"{eval_prompts:,} eval prompts × grpo.eval_num_generations {grpo.eval_num_generations} × "
        f"(max_prompt_length + max_completion_length) {sequence:,} "
        f"= {tokens:,} tokens per eval point; pool '{spec.resources.pool}' allows at most "
        f"{limits.max_tokens_per_step:,} per step: use fewer eval prompts or lower one of them"))]


def inline_bytes_problems(spec: JobSpec, limit: int) -> list[SpecError]:
    """Inline rows over ``limit`` bytes (as JSON). The training and eval rows count together: the
    limit bounds what one spec carries into the jobs table and every reader of it, and counting
    each alone would let a spec carry twice the limit. The eval rows are named when they are what
    takes the total over."""
    pool, problems = f"pool '{spec.resources.pool}'", []
    train = _json_bytes(spec.dataset.prompts)
    held_out = _json_bytes(spec.eval_dataset.prompts if spec.eval_dataset is not None else None)
    advice = "put the rows in a dataset file under the data root"
    if train > limit:
        problems.append(SpecError("dataset.prompts", f"{train:,} bytes of inline rows; {pool} allows at most "
                                                     f"{limit:,}: {advice}"))
    if held_out and train + held_out > limit:
        with_train = f", {train + held_out:,} with dataset.prompts' {train:,}" if train else ""
        problems.append(SpecError(EVAL_ROWS_FIELD, (
            f"{held_out:,} bytes of inline eval rows{with_train}; {pool} allows at most {limit:,} for the "
            f"two together: {advice}")))
    return problems


def _json_bytes(rows: list[dict] | None) -> int:
    return 0 if rows is None else len(json.dumps(rows, separators=(",", ":")).encode())


def sandbox_problems(rewards: list[RewardSpec], pool: str, ranks: int, limit: int) -> list[SpecError]:
    """The sandbox memory of ``rewards`` over ``limit``: they are called one after another, so
    the largest reward's footprint, held by each of ``ranks`` at once (all on one host). A job's
    ranks are its ``resources.gpus``; a rewards dry run scores in one process (one rank), and is
    held to the same limit by this same check."""
    footprints = sandbox_footprints(rewards)
    if not footprints:
        return []
    index, largest = max(footprints, key=lambda footprint: footprint[1])
    if largest * ranks <= limit:
        return []
    name = rewards[index].name
    fields = available_rewards()[name].args_model.model_fields
    knobs = " or ".join(arg for arg in SANDBOX_SIZING_ARGS if arg in fields) or "its args"
    held = f"{largest / MIB:,.0f} MiB at once"
    if ranks > 1:
        held += f" on each of {ranks} ranks (resources.gpus): {largest * ranks / MIB:,.0f} MiB"
        knobs += " or resources.gpus"
    return [SpecError(f"rewards.{index}.args", (
        f"{name}'s sandboxes may hold {held}; pool '{pool}' allows at most "
        f"{limit / MIB:,.0f} MiB ({limit:,} bytes): lower {knobs}"))]


def step_limit_problems(spec: JobSpec, steps: int, limits: PoolLimits) -> list[SpecError]:
    """The limits on a run of ``steps`` optimizer steps: steps, and checkpoints written."""
    pool, problems = f"pool '{spec.resources.pool}'", []
    # Steps that came from num_train_epochs say so: the user never wrote the number.
    counted = "" if spec.grpo.max_steps > 0 else f" (grpo.num_train_epochs = {spec.grpo.num_train_epochs:g})"
    if limits.max_steps is not None and steps > limits.max_steps:
        problems.append(SpecError("grpo.max_steps", f"{steps:,} steps{counted}; {pool} allows at most "
                                                    f"{limits.max_steps:,}"))
    checkpoints = math.ceil(steps / spec.checkpoint_every)
    if limits.max_checkpoints_per_job is not None and checkpoints > limits.max_checkpoints_per_job:
        fewest_between = math.ceil(steps / limits.max_checkpoints_per_job)
        problems.append(SpecError("checkpoint_every", (
            f"writes {checkpoints:,} checkpoints over {steps:,} steps{counted}; {pool} allows at "
            f"most {limits.max_checkpoints_per_job:,} per job: checkpoint every {fewest_between:,} steps "
            "or more")))
    return problems
