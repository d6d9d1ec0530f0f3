"""``http_verifier``: completions scored by a verifier service that an admin registered by name.

The spec names the verifier (``args.verifier``) and the dataset columns to send
(``args.columns``); where it answers, its auth header and its limits come from the registration,
handed over in :attr:`RewardContext.verifiers` by whoever builds the run (the worker from the
service's database, ``grpo train`` from ``--verifier NAME=URL``). Rows the verifier could not
score are unscorable (NaN, advantage 0) and counted for a warning event; a verifier that cannot be
reached within the call's budget leaves the whole call unscorable (``reward_unavailable``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_core.errors import SpecError
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn
from grpo_core.rewards.scoring import PartlyScored
from grpo_core.rewards.verifier_client import VerifierClient
from grpo_core.spec.run_spec import RewardSpec

__all__ = ["HTTP_VERIFIER", "HttpVerifierArgs", "VERIFIER_NAME_PATTERN", "verifier_names"]

# Lower case, digits, "_" and "-": a verifier's name goes into URL paths and the service's registry.
VERIFIER_NAME_PATTERN = r"^[a-z0-9][a-z0-9_\-]{0,62}$"


class HttpVerifierArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    verifier: str = Field(..., pattern=VERIFIER_NAME_PATTERN,
                          description="Name of a verifier registered for your team or the job's pool.")
    columns: list[str] = Field(default_factory=list, max_length=32,
                               description="Dataset columns sent with each row (e.g. tests, a reference).")

    @field_validator("columns")
    @classmethod
    def _distinct(cls, columns: list[str]) -> list[str]:
        if any(not 1 <= len(column) <= 128 for column in columns):
            raise ValueError("each column name has 1 to 128 characters")
        if len(set(columns)) != len(columns):
            raise ValueError("a column is named twice")
        return columns


def _build(args: HttpVerifierArgs, context: RewardContext) -> RewardFn:
    endpoint = context.verifiers.get(args.verifier)
    if endpoint is None:
        known = ", ".join(sorted(context.verifiers)) or "none"
        raise SpecError("verifier", f"no verifier '{args.verifier}' is registered for this job "
                                    f"(registered: {known})")
    client = VerifierClient(args.verifier, endpoint)
    budget = context.own_budget_seconds()  # its own "unavailable" comes before a plain timeout

    def http_verifier(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        items = [{"prompt": prompt, "completion": completion,
                  "columns": {name: columns[name][row] for name in args.columns}}
                 for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True))]
        scored = client.score(items, budget)
        return PartlyScored(scored.scores, scored.unscored)

    return http_verifier


HTTP_VERIFIER = RewardDefinition(
    "http_verifier",
    "Score from a verifier service registered by an admin (POSTs prompt, completion and the named "
    "columns in batches); rows it cannot score are left out.",
    HttpVerifierArgs,
    _build,
    required_columns=lambda args: list(args.columns),
)


def verifier_names(specs: list[RewardSpec]) -> dict[int, str]:
    """Index -> verifier name of each ``http_verifier`` reward: what must be registered for the job."""
    return {index: spec.args["verifier"] for index, spec in enumerate(specs)
            if spec.name == HTTP_VERIFIER.name and isinstance(spec.args.get("verifier"), str)}
