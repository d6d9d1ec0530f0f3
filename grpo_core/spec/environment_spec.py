"""The ``environment:`` section of a spec: a stateful environment the model acts in, turn after
turn, given as Python source (the standard library only) defining ``class Environment``. Checked
here from the syntax tree only: nothing of the source runs outside the sandbox
(:mod:`grpo_core.agents.environment_runner` runs it, one process per episode)."""

from __future__ import annotations

import ast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.spec.source_checks import MAX_SOURCE_CHARS, sandbox_source_tree

ENVIRONMENT_CLASS = "Environment"
_METHODS = {"reset": 2, "step": 2}  # each takes self and one argument: the item, the action


def _environment_class(tree: ast.Module) -> ast.ClassDef | None:
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == ENVIRONMENT_CLASS]
    return found[-1] if found else None


def check_environment_source(source: str) -> str:
    """``source`` when it compiles, imports only the standard library and defines ``class
    Environment`` with ``reset(self, item)`` and ``step(self, action)`` at its top level; else a
    ValueError saying what is missing. Parses, never runs."""
    tree = sandbox_source_tree(source, "environment.py", "environments")
    found = _environment_class(tree)
    if found is None:
        raise ValueError(
            "must define class Environment at top level, with reset(self, item) and step(self, action)"
        )
    methods = {node.name: node for node in found.body if isinstance(node, ast.FunctionDef)}
    for name, count in _METHODS.items():
        method = methods.get(name)
        params = None if method is None else method.args
        if params is None or (len(params.posonlyargs) + len(params.args) < count and params.vararg is None):
            argument = "item" if name == "reset" else "action"
            raise ValueError(
                f"class Environment (line {found.lineno}) needs a method {name}(self, {argument}) (not async)"
            )
    return source


class EnvironmentSpec(BaseModel):
    """A stateful environment: each episode gets its own ``Environment()`` in a process of its own
    (``source``), or its own session of a registered OpenEnv server (``server``); ``reset`` starts
    it on the dataset row (its optional first observation is added to the prompt), then each
    model turn is ``step``'s action."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(
        None,
        exclude_if=lambda value: value is None,
        min_length=1,
        max_length=MAX_SOURCE_CHARS,
        description="Python source (standard library only) defining class Environment with "
        "reset(self, item) -> str | None (the dataset row; an optional first observation, added to "
        "the prompt) and step(self, action: str) -> dict with observation (str or None), reward "
        "(float or None) and done (bool). Or give server.",
    )
    server: str | None = Field(
        None, min_length=1, max_length=64, exclude_if=lambda value: value is None,
        description="Instead of source: the name of an OpenEnv environment server an admin registered "
        "(/v1/admin/verifiers) for your team or pool. Each episode is a session of its own "
        "(OpenEnv's WebSocket protocol: reset, step, close).")
    action_field: str = Field(
        "message", min_length=1, max_length=64, exclude_if=lambda value: value == "message",
        description="With server: the field of the step's action that holds the model's turn.")
    observation_field: str | None = Field(
        None, min_length=1, max_length=64, exclude_if=lambda value: value is None,
        description="With server: the field of the observation whose text the model sees; null: the "
        "whole observation as JSON (its reward, done and metadata left out).")
    reset_columns: list[str] = Field(
        default_factory=list, max_length=32, exclude_if=lambda value: not value,
        description="With server: the dataset columns given to reset (as its data, e.g. seed).")
    max_turns: int = Field(
        8, ge=1, le=64, description="The most model turns of an episode; one not done by then ends there."
    )
    timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Wall-clock limit of each reset and step call; a call over it fails the job "
        "`environment_error`.",
    )
    memory_mb: int = Field(
        256, ge=16, le=16384, description="Address space of each process of an episode (each runs in a "
        "process of its own, forked in a sandbox that serves up to 16 of the job's episodes)."
    )
    max_processes: int = Field(4, ge=1, le=64, description="Processes and threads of each episode.")

    @field_validator("source")
    @classmethod
    def _defines_environment(cls, source: str | None) -> str | None:
        return None if source is None else check_environment_source(source)

    @model_validator(mode="after")
    def _source_or_server(self) -> EnvironmentSpec:
        if (self.source is None) == (self.server is None):
            raise ValueError("give source (an Environment class run in the sandbox) or server (a registered "
                             "OpenEnv server's name), not both")
        return self
