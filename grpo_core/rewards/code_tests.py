"""``code_tests``: run the completion's Python code against the row's test cases in a sandbox.

The code is the **last** fenced block of the completion that is Python (```` ```python ````,
```` ```py ````, ```` ```python3 ```` or a bare ```` ``` ````): a model often sketches first and
gives its final version last. No such block scores 0.0.

The test cases come from a dataset column (``field``, default ``tests``): per row, a list (or the
JSON text of a list, as CSV and some JSONL files hold it) of 1 to 64 cases, each either

* ``{"input": "...", "output": "..."}``: the program runs with ``input`` on stdin (``input`` may
  be left out: empty); it passes when it exits 0 and its stdout equals ``output``, compared line by
  line without trailing whitespace or trailing blank lines; or
* a string of Python statements, typically ``assert add(2, 3) == 5``, run after the code in the
  same program; it passes when the program exits 0.

The reward is passed / total. A row whose column is null is not scored (None); a malformed one
is an error naming the column, row and case. Every case is its own run of
:func:`grpo_core.rewards.sandbox.run_python` (no network, read-only system files, private /tmp, limits),
at most ``parallel`` at a time, and nothing is started once the call's budget
(``reward_timeout_seconds``) is spent: a row whose cases did not all run is not scored. Nothing
runs outside the sandbox: where it cannot run, building the reward fails (``grpo train`` refuses
to start) and the service refuses such a spec unless a worker of its pool advertises
:data:`grpo_core.rewards.sandbox.CAPABILITY`.

The limits are per process (no cgroup is assumed to be available), so the most memory one call
can hold is ``parallel`` x ``max_processes`` x ``memory_mb`` (plus 16 MiB of /tmp per run): 8 GiB
with the defaults, and what a worker's host must be able to spare for a job with this reward
(``sandbox_bytes``, which the service caps per pool).
"""

from __future__ import annotations

import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grpo_core.rewards.columns import aligned_column
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn
from grpo_core.rewards.sandbox import (
    CAPABILITY,
    Limits,
    Outcome,
    SandboxUnavailable,
    run_python,
    sandbox_problem,
)

__all__ = ["CODE_TESTS", "CodeTestsArgs", "extract_code", "parse_cases"]

MAX_CASES = 64
_PYTHON_FENCE = re.compile(r"```(?:python3?|py)?[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


class CodeTestsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field("tests", min_length=1, max_length=128, description="Dataset column of test cases.")
    block: Literal["last", "first"] = Field("last", description="Which Python block of the completion runs.")
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="Wall-clock limit of one test case's run.")
    memory_mb: int = Field(256, ge=32, le=8192, description="Address-space limit of each process, MiB.")
    max_processes: int = Field(8, ge=1, le=256, description="Processes and threads the program may have.")
    max_output_kb: int = Field(64, ge=1, le=1024, description="Output kept per stream; more fails the case.")
    parallel: int = Field(4, ge=1, le=16, description="Test-case runs at once across the batch.")


def extract_code(completion: str, block: str = "last") -> str | None:
    """The chosen Python fenced block's text, or None when there is none."""
    blocks = _PYTHON_FENCE.findall(completion)
    if not blocks:
        return None
    return blocks[-1] if block == "last" else blocks[0]


def _bad(field: str, row: int, why: str) -> ValueError:
    return ValueError(f"column '{field}' row {row}: {why}")


def _check_case(case: Any, field: str, row: int, index: int) -> dict[str, str] | str:
    if isinstance(case, str):
        return case
    if not isinstance(case, dict) or not isinstance(case.get("output"), str):
        raise _bad(field, row, f"case {index} is neither a string of Python statements nor "
                               "{'input': text, 'output': text}")
    extra = set(case) - {"input", "output"}
    if extra or not isinstance(case.get("input", ""), str):
        raise _bad(field, row, f"case {index} may only have a text 'input' and 'output'; got {sorted(case)}")
    return {"input": case.get("input", ""), "output": case["output"]}


def parse_cases(value: Any, field: str, row: int) -> list[dict[str, str] | str] | None:
    """The row's test cases checked for shape; None for a null value (the row is not scored)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _bad(field, row, f"a text value must be a JSON list of test cases ({exc})") from exc
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_CASES:
        raise _bad(field, row, f"must be a list of 1 to {MAX_CASES} test cases")
    return [_check_case(case, field, row, index) for index, case in enumerate(value)]


def _check_rows(args: CodeTestsArgs, rows: list[dict[str, Any]]) -> None:
    for row, values in enumerate(rows):
        parse_cases(values.get(args.field), args.field, row)


def _normalized(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _passes(case: dict[str, str] | str, outcome: Outcome) -> bool:
    if isinstance(case, str):
        return outcome.ok
    return outcome.ok and _normalized(outcome.stdout) == _normalized(case["output"])


def _run_case(code: str, case: dict[str, str] | str, limits: Limits, deadline: float) -> bool | None:
    """Whether the case passed; None when the budget was spent before it could run in full."""
    wall = min(limits.wall_seconds, deadline - time.monotonic())
    if wall <= 0:
        return None
    source, stdin = (f"{code}\n\n{case}\n", "") if isinstance(case, str) else (code, case["input"])
    outcome = run_python(source, stdin, replace(limits, wall_seconds=wall))
    if outcome.timed_out and wall < limits.wall_seconds:
        return None  # stopped by the call's budget, not by the case's own limit
    return _passes(case, outcome)


def _limits(args: CodeTestsArgs) -> Limits:
    return Limits(wall_seconds=args.timeout_seconds, cpu_seconds=math.ceil(args.timeout_seconds),
                  memory_bytes=args.memory_mb * 2**20, processes=args.max_processes,
                  output_bytes=args.max_output_kb * 1024)


def _build(args: CodeTestsArgs, context: RewardContext) -> RewardFn:
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailable(f"code_tests cannot run here: {problem}")
    limits = _limits(args)
    # A little of the budget is kept for collecting results, so the call returns inside it.
    budget = context.own_budget_seconds()

    def code_tests(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        deadline = time.monotonic() + (budget if budget is not None else math.inf)
        values = aligned_column(columns, args.field, len(completions))
        cases = [parse_cases(value, args.field, row) for row, value in enumerate(values)]
        codes = [extract_code(text, args.block) for text in completions]
        with ThreadPoolExecutor(max_workers=args.parallel, thread_name_prefix="code-tests") as pool:
            runs = [[pool.submit(_run_case, code, case, limits, deadline) for case in row_cases]
                    if code is not None and row_cases is not None else None
                    for code, row_cases in zip(codes, cases, strict=True)]
            results = [None if row is None else [run.result() for run in row] for row in runs]
        scores: list[float | None] = []
        for code, row_cases, passed in zip(codes, cases, results, strict=True):
            if row_cases is None:
                scores.append(None)
            elif code is None:
                scores.append(0.0)
            elif passed is None or any(result is None for result in passed):
                scores.append(None)
            else:
                scores.append(sum(passed) / len(passed))
        return scores

    return code_tests


CODE_TESTS = RewardDefinition(
    "code_tests",
    "Fraction of the row's test cases the completion's last ```python block passes, run in a sandbox.",
    CodeTestsArgs,
    _build,
    required_columns=lambda args: [args.field],
    capabilities=frozenset({CAPABILITY}),
    check_rows=_check_rows,
    # Each of `parallel` runs at once may hold every process's address space and its full /tmp.
    sandbox_bytes=lambda args: args.parallel * _limits(args).cgroup_memory_bytes,
)
