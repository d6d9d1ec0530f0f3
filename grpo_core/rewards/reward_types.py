"""The types every reward and the registry share: what a reward is (:class:`RewardDefinition`),
what it may use from the run (:class:`RewardContext`), the function it builds (``RewardFn``) and a
bound reward ready to score (:class:`BoundReward`).

A module of its own so that the rewards import their types from here and the registry imports
the rewards, one way: it imports no reward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from grpo_core.rewards.verifier_endpoint import VerifierEndpoint

__all__ = ["BoundReward", "RewardContext", "RewardDefinition", "RewardFn"]

# Called as fn(completions, prompts, **columns); one value per completion, None = not applicable.
RewardFn = Callable[..., list[float | None]]


@dataclass
class RewardContext:
    """What a reward may need from the run besides its args: the tokenizer (``length_target``
    counts tokens) and the budget of one call in seconds (``regex_match`` stops matching when it is
    spent; :func:`grpo_core.rewards.score_completions` stops waiting for any reward then), and
    the verifier services this run may call, by registered name (``http_verifier``).
    ``reward_model`` loads its model from ``models_root`` (the service's) or, without one, relative
    to ``base_dir`` (the spec's folder), onto this rank's ``device`` in the job's ``dtype``."""

    tokenizer: Any | None = None
    timeout_seconds: float | None = None
    verifiers: Mapping[str, VerifierEndpoint] = field(default_factory=dict)
    models_root: Path | None = None
    base_dir: Path | None = None
    device: Any | None = None  # a torch.device; None: the CPU (this module stays torch-free)
    dtype: str = "float32"

    def own_budget_seconds(self) -> float | None:
        """What a reward that stops itself (``code_tests``, ``http_verifier``) may spend of its
        budget: the rest is the margin to wind down (kill its sandboxes, drop its connections) and
        return before :func:`grpo_core.rewards.score_completions` stops waiting, which would count
        a timeout instead of the rows it did score. A tenth of the budget, at least a second, but
        never more than half of it (measured on a loaded 2-core machine: 0.2 s of a 2 s budget was
        too little, and so, once in a CI run, was 0.5 s for killing three sandboxes)."""
        if self.timeout_seconds is None:
            return None
        budget = self.timeout_seconds
        return max(budget / 2, budget - max(0.1 * budget, 1.0))


def _no_columns(args: BaseModel) -> list[str]:
    return []


def _no_sources(args: BaseModel) -> dict[str, str]:
    return {}


def _no_sandbox(args: BaseModel) -> int:
    return 0


@dataclass(frozen=True)
class RewardDefinition:
    """A named reward: its args model, how to build the function, and the columns it reads.

    ``args_model`` should forbid extra fields and give every field bounds and a description, since
    its JSON schema is the public catalog. ``build`` may raise :class:`SpecError` with ``field``
    relative to the args (``"pattern"``) or ``ValueError``; :func:`bind_rewards` adds the
    ``rewards.N.args`` prefix. ``required_columns`` lets a missing dataset column be reported
    before training instead of at the first scored batch. ``capabilities`` are what a worker must
    advertise to run it (``code_sandbox``); the service refuses a spec no worker of its pool can run.
    ``check_rows`` checks the values of the columns it reads (``code_tests``' test cases), raising
    ``ValueError`` naming the row, so bad data is refused at submit or before a model loads.
    ``model_sources`` maps args fields that name a model (``path:``/``hf:``) to it, so the service
    checks them at submit like ``model.source``. ``sandbox_bytes`` is the most memory the sandboxes
    of one call can hold at once (0: it runs none), so the service can cap it per pool.
    """

    name: str
    description: str
    args_model: type[BaseModel]
    build: Callable[[Any, RewardContext], RewardFn]
    required_columns: Callable[[Any], list[str]] = _no_columns
    model_sources: Callable[[Any], dict[str, str]] = _no_sources
    capabilities: frozenset[str] = frozenset()
    check_rows: Callable[[Any, list[dict[str, Any]]], None] | None = None
    sandbox_bytes: Callable[[Any], int] = _no_sandbox


@dataclass
class BoundReward:
    """A reward ready to score; ``name`` is unique within a job and used as the metric name."""

    name: str
    weight: float
    fn: RewardFn
    columns: list[str] = field(default_factory=list)
    timeout_seconds: float | None = None  # budget of one call; None: unbounded (tests, tools)
    clip_min: float | None = None
    clip_max: float | None = None
    gate_by: str | None = None  # another reward's name; see grpo_core.rewards.shaping
    gate_threshold: float = 0.0


