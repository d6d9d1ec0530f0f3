"""The ``tools:`` section of a spec: Python functions (source) the model may call during an
episode, and the sandbox limits each turn's calls run under (:mod:`grpo_core.agents`). Checked
here from the syntax tree only (:func:`grpo_core.spec.tool_schemas.tool_set`): nothing of the
source runs outside the sandbox."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_core.spec.source_checks import MAX_SOURCE_CHARS
from grpo_core.spec.tool_schemas import ToolSet, ToolSourceError, source_schemas, tool_set


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolSource(_Strict):
    """Python source (the standard library only) whose top-level functions not starting with
    ``_`` are tools: type hints and a Google-style docstring describe each to the model."""

    source: str = Field(
        ...,
        min_length=1,
        max_length=MAX_SOURCE_CHARS,
        description="Python source defining the tools (top-level functions; names starting "
        "with _ are helpers). Each argument needs a type hint and a line under 'Args:' in "
        "the docstring, as transformers' get_json_schema reads them.",
    )

    @field_validator("source")
    @classmethod
    def _defines_tools(cls, source: str) -> str:
        try:
            source_schemas(source)
        except ToolSourceError as exc:
            raise ValueError(str(exc)) from None
        return source


class ToolLimits(_Strict):
    """The sandbox limits of one turn's tool calls (each sandboxed interpreter's)."""

    timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Wall-clock limit of a turn's calls; a "
        "call not answered by then gets an error as its result.",
    )
    memory_mb: int = Field(256, ge=16, le=16384, description="Address space of each process in the sandbox.")
    max_processes: int = Field(16, ge=1, le=256, description="Processes and threads in the sandbox.")


def tools_of(sources: list[ToolSource]) -> ToolSet:
    """The spec's tools, their names checked to be unique across sources (ValueError if not)."""
    try:
        return tool_set([item.source for item in sources])
    except ToolSourceError as exc:
        raise ValueError(str(exc)) from None
