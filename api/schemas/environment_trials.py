"""Wire schemas of an environment dry run (``POST /v1/environments/run``): a spec's environment, a
dataset row and scripted actions in; what ``reset`` and each ``step`` gave back out, without a
model or a job."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.schemas.reward_trials import MAX_SPEC_CHARS, MAX_TEXT_CHARS
from grpo_core.spec.environment_spec import EnvironmentSpec

MAX_ACTIONS = 16
MAX_CALL_SECONDS = 10.0  # a dry run's reset and each step: a request answers within minutes at worst


class EnvironmentTrialRequest(BaseModel):
    """The environment to try: ``environment`` as in a spec, or a whole ``spec`` as text (JSON or
    YAML, as the dashboard's form holds it) of which ``environment:`` is used."""

    model_config = ConfigDict(extra="forbid")

    environment: EnvironmentSpec | None = Field(None, description="As in a spec's `environment:`; checked "
                                                "as at submit")
    spec: str | None = Field(None, max_length=MAX_SPEC_CHARS,
                             description="Instead of `environment`: a spec's text (JSON or YAML); its "
                                         "`environment:` is used")
    item: dict[str, Any] = Field(default_factory=dict, max_length=64,
                                 description="The dataset row reset(item) gets (its prompt and columns)")
    actions: list[Annotated[str, Field(max_length=MAX_TEXT_CHARS)]] = Field(
        min_length=1, max_length=MAX_ACTIONS,
        description="The model's turns, scripted: each is given to step(action) in turn, until the "
                    "environment says it is done")
    pool: str | None = Field(None, max_length=64, description="Whose workers run it where the API "
                             "relays (default: the default pool), and whose sandbox limits apply")

    @model_validator(mode="after")
    def _one_environment(self) -> EnvironmentTrialRequest:
        if (self.environment is None) == (self.spec is None):
            raise ValueError("give `environment` or `spec` (a spec's text with an environment:), not both")
        return self


class EnvironmentStepRead(BaseModel):
    action: str
    observation: str | None = Field(description="What step returned as the next observation")
    reward: float | None
    done: bool


class EnvironmentTrialRead(BaseModel):
    """What the environment gave back: reset's first observation (added to the prompt in a job),
    each step on the actions taken, the rewards' sum, and whether it said it was done."""

    first_observation: str | None
    steps: list[EnvironmentStepRead]
    total_reward: float = Field(description="The steps' rewards summed: the episode's `environment` reward")
    done: bool
    unused_actions: int = Field(description="Actions left after the environment said it was done")
