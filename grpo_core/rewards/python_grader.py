"""``python``: a team's own grader, Python source in the spec, run in the sandbox.

The source defines ``grade(sample, item) -> float | None`` as OpenAI's Python grader does:
``sample["output_text"]`` is the completion's text (its answer, after any reasoning was parsed
off), ``sample["output_json"]`` that text as JSON (None when it is not), ``item`` the dataset
row: its columns, with ``prompt`` as the dataset gave it (text or chat messages); both built by
:mod:`grpo_core.rewards.grader_rows`, as the templates of the other OpenAI graders see them. A
number in [0, 1] is the score; None says the row does not apply (not scored, no warning);
anything else (a string, NaN, 1.5) or an exception leaves the row unscored and is
counted in the step's ``reward_unscored`` warning, as a verifier's failures are.

Only the standard library is available: ``args.requirements`` is refused rather than ignored. The
source is checked when the spec is (it compiles, defines ``grade`` at top level, at most
:data:`MAX_SOURCE_CHARS`, imports only the standard library), without running any of it: the
service parses it and nothing more. The imports are read from the syntax tree
(:func:`grpo_core.spec.source_checks.outside_stdlib`): every ``import``/``from ... import``
statement, at top level or in a function, against ``sys.stdlib_module_names`` of the Python
doing the check: the service's and the worker's, of the release the sandbox's system Python is
in the images (:func:`grpo_core.rewards.sandbox.interpreter`; a module that release lists but a build leaves
out, such as ``tkinter``, still fails at run time).
An import inside ``try`` with an ``except ImportError`` (or broader) is a fallback the grader
handles, so it passes. Names built at run time (``__import__(name)``, ``importlib.import_module``)
are not seen by a static check: they fail in the sandbox, as the rows' errors.

One call scores all rows of the step in **one** sandboxed interpreter
(:mod:`grpo_core.rewards.grader_harness`): starting a sandbox costs tens of milliseconds, so one
per row would cap a step at a few dozen rows a second, where a trivial grader scores thousands
(``benchmarks/python_grader_throughput.py``). The call's wall-clock limit is the job's
``reward_timeout_seconds`` (less the margin to wind down); rows not reached by then are unscored.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_core.errors import GRPOError
from grpo_core.rewards.grader_rows import grader_rows
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn
from grpo_core.rewards.sandbox import CAPABILITY, Limits, SandboxUnavailable, run_python, sandbox_problem
from grpo_core.rewards.scoring import PartlyScored
from grpo_core.spec.source_checks import MAX_SOURCE_CHARS, sandbox_source_tree

__all__ = ["MAX_SOURCE_CHARS", "PYTHON_GRADER", "GradedRows", "PythonGraderArgs", "grade_rows"]

_HARNESS = (Path(__file__).with_name("grader_harness.py")).read_text(encoding="utf-8")
_HARNESS_LINE_BYTES = 512  # a result line's most: the harness cuts its messages to 300 characters
_MESSAGE_CHARS = 300  # what is kept of a message the sandbox sent (it is the team's text)


def _defines_grade(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "grade":
            params = node.args
            return isinstance(node, ast.FunctionDef) and (
                len(params.posonlyargs) + len(params.args) >= 2 or params.vararg is not None)
    return False


def check_source(source: str) -> str:
    """``source`` when it compiles, defines ``grade(sample, item)`` at top level and imports only
    the standard library (:func:`sandbox_source_tree`), else a ValueError saying what is wrong (a
    syntax error or an import with its line). Parses, never runs."""
    tree = sandbox_source_tree(source, "grader.py", "python graders")
    if not _defines_grade(tree):
        raise ValueError("must define a function grade(sample, item) at top level (not async), "
                         "returning a float in [0, 1] or None")
    return source


class PythonGraderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS,
                        description="Python source defining grade(sample, item) -> float in [0, 1] or None; "
                                    "standard library only.")
    requirements: list[Annotated[str, Field(max_length=200)]] | None = Field(
        None, max_length=64,
        description="Refused when not empty: graders run with the standard library only.")
    timeout_seconds: float = Field(
        60.0, gt=0, le=600,
        description="Wall-clock limit of one call (all rows of a step) when the job sets no "
                    "reward_timeout_seconds; the job's budget wins when it does.")
    memory_mb: int = Field(512, ge=64, le=4096,
                           description="Address-space limit of the grader's process, MiB.")
    max_processes: int = Field(4, ge=1, le=64, description="Processes and threads the grader may have.")

    @field_validator("source")
    @classmethod
    def _compiles(cls, source: str) -> str:
        return check_source(source)

    @field_validator("requirements")
    @classmethod
    def _no_requirements(cls, requirements: list[str] | None) -> list[str] | None:
        if requirements:
            raise ValueError("python graders run with the standard library only; nothing is installed "
                             "for them: remove 'requirements' and vendor what you need into 'source'")
        return requirements


class GradedRows(PartlyScored):
    """The scores (None for unscored rows) with why each unscored row is (index -> message), for
    the dry run to show; ``unscored`` counts them for the step's warning."""

    def __init__(self, values: list[float | None], problems: dict[int, str]) -> None:
        super().__init__(values, len(problems))
        self.problems = problems


def grade_rows(source: str, rows: list[dict[str, Any]], limits: Limits) -> GradedRows:
    """Score ``rows`` (``{"sample", "item"}`` each) with the grader in one sandboxed run.
    A grader that does not load (an exception at import, no ``grade``) is the job's fault:
    a GRPOError ``reward_error`` with the grader's message.

    The harness only passes on what ``grade`` returned; each value is checked here, outside the
    sandbox's interpreter, where the team's code cannot reach the check (:func:`_score`). Its
    output is untrusted text: a line that is no JSON object, or a second result for a row, scores
    nothing."""
    payload = json.dumps({"source": source, "rows": rows}, default=str)
    sized = replace(limits, output_bytes=4096 + _HARNESS_LINE_BYTES * len(rows))
    outcome = run_python(_HARNESS, payload, sized)
    values: list[float | None] = [None] * len(rows)
    problems: dict[int, str] = {}
    seen: set[int] = set()
    for line in outcome.stdout.splitlines():
        record = _record(line)
        if record is None:
            continue  # a line cut by a kill, or not the harness's; its row is reported missing below
        if "load_error" in record:
            raise GRPOError(f"the python grader does not load: {_text(record['load_error'])}",
                            code="reward_error")
        index = record.get("i")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(rows):
            continue
        if index in seen:
            values[index], problems[index] = None, "more than one result for this row"
            continue
        seen.add(index)
        values[index], problem = _score(record)
        if problem is not None:
            problems[index] = problem
    missing = _why_missing(outcome)
    for index in range(len(rows)):
        if index not in seen:
            problems[index] = missing
    return GradedRows(values, problems)


def _record(line: str) -> dict[str, Any] | None:
    """One output line as a JSON object, or None for anything else (bad JSON, nesting too deep
    to parse, an integer past Python's digit limit, a bare value)."""
    try:
        # NaN and the infinities read as floats, for _score to refuse as not finite.
        record = json.loads(line, parse_constant=float)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _text(value: Any) -> str:
    return str(value)[:_MESSAGE_CHARS]


def _score(record: dict[str, Any]) -> tuple[float | None, str | None]:
    """A row's score and, when it has none, why: a number in [0, 1] scores; None does not
    apply (no problem); anything else is a problem, whatever the sandbox said about it."""
    if "error" in record:
        return None, _text(record["error"])
    if "value" not in record:
        return None, f"grade returned {_text(record.get('returned', 'nothing'))}, not a number"
    value = record["value"]
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"grade returned {type(value).__name__} {value!r:.60}, not a number"
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None, f"grade returned an integer of {value.bit_length()} bits, outside [0, 1]"
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        return None, f"grade returned {number!r}, outside [0, 1]"
    return number, None


def _why_missing(outcome: Any) -> str:
    if outcome.timed_out:
        return "not reached: the grader ran out of time"
    if outcome.truncated:
        return "not reached: the grader's output went over its limit"
    detail = outcome.stderr.strip().splitlines()[-1:] or [f"exit status {outcome.returncode}"]
    return f"not reached: the grader's process ended ({detail[0][:200]})"


def _limits(args: PythonGraderArgs, wall_seconds: float) -> Limits:
    return Limits(wall_seconds=wall_seconds, cpu_seconds=math.ceil(wall_seconds),
                  memory_bytes=args.memory_mb * 2**20, processes=args.max_processes)


def _build(args: PythonGraderArgs, context: RewardContext) -> RewardFn:
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailable(f"the python reward cannot run here: {problem}")
    budget = context.own_budget_seconds()
    limits = _limits(args, budget if budget is not None else args.timeout_seconds)

    def python(completions: list[str], prompts: list[str], **columns: Any) -> GradedRows:
        return grade_rows(args.source, grader_rows(completions, prompts, columns), limits)

    return python


PYTHON_GRADER = RewardDefinition(
    "python",
    "Your own grade(sample, item) -> float in [0, 1], Python source in the spec, run in a sandbox.",
    PythonGraderArgs,
    _build,
    capabilities=frozenset({CAPABILITY}),
    # One interpreter per call: every process's address space and its full /tmp (time is no factor).
    sandbox_bytes=lambda args: _limits(args, args.timeout_seconds).cgroup_memory_bytes,
)
