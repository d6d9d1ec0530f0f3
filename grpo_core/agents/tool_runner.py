"""Tool calls run in the sandbox the python graders use (:mod:`grpo_core.rewards.sandbox`): a
turn's calls, all episodes' together, in a few sandboxed interpreters at once
(:data:`CALLS_PER_SANDBOX` calls each, at most :data:`PARALLEL_SANDBOXES` at a time), each with
the job's time, memory and process limits. What a tool returned becomes the tool message's text
(``str`` of it, as TRL does); an exception, an unknown tool, a call the model wrote wrong or one the
limits cut off becomes ``{'error': '...'}`` (TRL's form) and counts as a tool error.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grpo_core.agents.tool_calls import ToolCall
from grpo_core.errors import GRPOError
from grpo_core.rewards.sandbox import Limits, Outcome, run_python
from grpo_core.spec.tools_spec import ToolLimits

CALLS_PER_SANDBOX = 16
PARALLEL_SANDBOXES = 4
_HARNESS = Path(__file__).with_name("tool_harness.py").read_text(encoding="utf-8")
_LINE_BYTES = 4400  # a result line's most: the harness cuts results to 4,000 characters


@dataclass(frozen=True)
class ToolResult:
    """A call's tool message text, and whether the call failed."""

    content: str
    failed: bool


def sandbox_limits(limits: ToolLimits) -> Limits:
    """The spec's ``tool_limits`` as the sandbox takes them."""
    return Limits(
        wall_seconds=limits.timeout_seconds,
        cpu_seconds=max(1, round(limits.timeout_seconds)),
        memory_bytes=limits.memory_mb * 2**20,
        processes=limits.max_processes,
    )


def tool_sandbox_bytes(limits: ToolLimits) -> int:
    """The most memory a turn's tool calls hold at once on one rank: :data:`PARALLEL_SANDBOXES`
    sandboxes, each its processes' address space and its /tmp (what the pool's sandbox limit counts)."""
    return PARALLEL_SANDBOXES * sandbox_limits(limits).cgroup_memory_bytes


def error_result(message: str) -> ToolResult:
    return ToolResult(str({"error": message}), True)


def run_tool_calls(sources: tuple[str, ...], calls: list[ToolCall], limits: Limits) -> list[ToolResult]:
    """Each call's result, in order. Tools that do not load (an exception when their source runs)
    are the job's fault: a GRPOError ``tool_error``."""
    results = {index: error_result(call.error) for index, call in enumerate(calls) if call.error}
    runnable = [index for index, call in enumerate(calls) if call.error is None]
    batches = [
        runnable[start : start + CALLS_PER_SANDBOX] for start in range(0, len(runnable), CALLS_PER_SANDBOX)
    ]
    if batches:
        with ThreadPoolExecutor(min(PARALLEL_SANDBOXES, len(batches)), thread_name_prefix="tools") as pool:
            answers = list(
                pool.map(lambda batch: _run_batch(sources, [calls[i] for i in batch], limits), batches)
            )
        for batch, answer in zip(batches, answers, strict=True):
            for index, result in zip(batch, answer, strict=True):
                results[index] = result
    return [results[index] for index in range(len(calls))]  # each batch answers every call it was given


def _run_batch(sources: tuple[str, ...], calls: list[ToolCall], limits: Limits) -> list[ToolResult]:
    payload = json.dumps(
        {"sources": list(sources), "calls": [{"name": c.name, "arguments": c.arguments} for c in calls]},
        default=str,
    )
    outcome = run_python(_HARNESS, payload, replace(limits, output_bytes=4096 + _LINE_BYTES * len(calls)))
    found: dict[int, ToolResult] = {}
    for line in outcome.stdout.splitlines():
        record = _record(line)
        if record is None:
            continue
        if "load_error" in record:
            raise GRPOError(f"the tools do not load: {str(record['load_error'])[:500]}", code="tool_error")
        index = record.get("i")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(calls)
            or index in found
        ):
            continue
        if isinstance(record.get("result"), str):
            found[index] = ToolResult(record["result"], False)
        else:
            found[index] = error_result(str(record.get("error", "the tool gave no result"))[:4000])
    missing = _why_missing(outcome)
    return [found.get(index) or error_result(missing) for index in range(len(calls))]


def _record(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _why_missing(outcome: Outcome) -> str:
    if outcome.timed_out:
        return "the tool ran out of time"
    if outcome.truncated:
        return "the tool's output went over its limit"
    return f"the tool's process ended (exit status {outcome.returncode})"
