"""Built-in rewards. Each scores in [0, 1] and returns ``None`` for rows it cannot judge.

``None`` (not 0.0) when the reference is missing, so a row with no usable answer is left out of the
group statistics instead of punishing every completion. Only ``re``/``regex``/``json``/``math``
are used: patterns from a spec are compiled, never evaluated.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.errors import RewardTimeout, SpecError
from grpo_core.rewards.answers import parse_number, reference_number
from grpo_core.rewards.columns import aligned_column
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn

__all__ = ["BUILTINS", "parse_number"]

Builder = Callable[[Any, RewardContext], RewardFn]
BUILTINS: list[RewardDefinition] = []


def _field_columns(args: Any) -> list[str]:
    return [args.field] if args.field is not None else []


def _builtin(
    name: str, description: str, args_model: type[BaseModel], reads_field: bool = False
) -> Callable[[Builder], Builder]:
    """Register the decorated build function as a built-in; ``reads_field``: needs ``args.field``."""

    def register(build: Builder) -> Builder:
        definition = RewardDefinition(name, description, args_model, build)
        BUILTINS.append(replace(definition, required_columns=_field_columns) if reads_field else definition)
        return build

    return register


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _answer_field() -> Any:
    """A fresh FieldInfo per model (pydantic may adjust the one it is given)."""
    return Field("answer", min_length=1, max_length=128, description="Dataset column with the reference.")


class NumericMatchArgs(_Args):
    field: str = _answer_field()
    rel_tol: float = Field(1e-6, ge=0.0, le=1.0, description="Relative tolerance of math.isclose.")
    abs_tol: float = Field(1e-9, ge=0.0, le=1e12, description="Absolute tolerance of math.isclose.")


@_builtin(
    "numeric_match",
    "1.0 if the last \\boxed{} number (else the last number) equals the reference's ('#### n' ok).",
    NumericMatchArgs,
    reads_field=True,
)
def _build_numeric(args: NumericMatchArgs, context: RewardContext) -> RewardFn:
    def numeric_match(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        refs = aligned_column(columns, args.field, len(completions))
        scores: list[float | None] = []
        for completion, ref in zip(completions, map(reference_number, refs), strict=True):
            pred = None if ref is None else parse_number(completion)
            close = pred is not None and math.isclose(pred, ref, rel_tol=args.rel_tol, abs_tol=args.abs_tol)
            scores.append(None if ref is None else float(close))
        return scores

    return numeric_match


# --- text ----------------------------------------------------------------------------------------
class ExactMatchArgs(_Args):
    field: str = _answer_field()
    strip: bool = Field(True, description="Strip surrounding whitespace from both sides first.")
    case_sensitive: bool = Field(True, description="False compares casefolded text.")


@_builtin("exact_match", "1.0 if the answer equals the reference column.", ExactMatchArgs, reads_field=True)
def _build_exact(args: ExactMatchArgs, context: RewardContext) -> RewardFn:
    def norm(text: str) -> str:
        text = text.strip() if args.strip else text
        return text if args.case_sensitive else text.casefold()

    def exact_match(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        refs = aligned_column(columns, args.field, len(completions))
        pairs = zip(completions, refs, strict=True)
        return [None if ref is None else float(norm(text) == norm(str(ref))) for text, ref in pairs]

    return exact_match


class RegexMatchArgs(_Args):
    pattern: str = Field(..., min_length=1, max_length=512, description="Python regular expression.")
    mode: Literal["search", "fullmatch"] = Field("search", description="Match anywhere, or the whole text.")
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = Field(
        default_factory=list, max_length=3, description="re flags to compile the pattern with."
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        """At submit, so a pattern that cannot compile never waits in the queue (none of the
        allowed flags changes what compiles)."""
        _check_repeat_counts(pattern)
        _compile(pattern, 0)
        return pattern


# Compiling unrolls counted repeats: (?:a{65535}){65535} compiles for ever, in the API's process.
# Every {m,n} counts, nested or not (a bound that needs no parser), and patterns of real rewards
# stay far below it; at the bound compiling takes well under 0.1 s.
MAX_REPEAT_PRODUCT = 100_000
_COUNTED_REPEAT = regex.compile(r"\{(\d*)(?:,(\d*))?\}")


def _check_repeat_counts(pattern: str) -> None:
    product = 1
    for match in _COUNTED_REPEAT.finditer(pattern):
        low, high = match.group(1), match.group(2)
        count = int(high) if high else int(low or 0)  # {m,} unrolls m copies
        product *= max(count, 1)
        if product > MAX_REPEAT_PRODUCT:
            raise ValueError(f"its counted repeats ({{m,n}}) multiply to over {MAX_REPEAT_PRODUCT:,} "
                             "copies, too many to compile")


def _compile(pattern: str, flags: int) -> regex.Pattern:
    try:
        return regex.compile(pattern, flags)
    except (regex.error, OverflowError, RecursionError, ValueError) as exc:
        raise ValueError(f"invalid regular expression: {exc}") from exc


@_builtin("regex_match", "1.0 if the answer matches a regular expression.", RegexMatchArgs)
def _build_regex(args: RegexMatchArgs, context: RewardContext) -> RewardFn:
    """Matched with the ``regex`` package and its ``timeout``: a pattern that backtracks
    catastrophically (``(.|.)*(?!)``) stops at the call's budget instead of holding the process
    (and the GIL) for ever, and the call then counts as timed out."""
    flags = 0
    for name in args.flags:
        flags |= getattr(regex, name)
    compiled = _compile(args.pattern, flags)
    match = compiled.search if args.mode == "search" else compiled.fullmatch
    budget = context.timeout_seconds

    def regex_match(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        deadline = None if budget is None else time.monotonic() + budget
        scores: list[float | None] = []
        for text in completions:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                scores.append(float(match(text, concurrent=True, timeout=left) is not None))
            except TimeoutError as exc:
                raise RewardTimeout(f"regex_match took over {budget:g} s") from exc
        return scores

    return regex_match


class ContainsArgs(_Args):
    text: str | None = Field(None, min_length=1, max_length=1024, description="Fixed text to look for.")
    field: str | None = Field(None, min_length=1, max_length=128, description="Or a column holding it.")
    case_sensitive: bool = Field(True, description="False compares casefolded text.")

    @model_validator(mode="after")
    def _one_source(self) -> ContainsArgs:
        if (self.text is None) == (self.field is None):
            raise ValueError("give exactly one of 'text' (a fixed string) or 'field' (a dataset column)")
        return self


@_builtin("contains", "1.0 if the answer contains a fixed text or a column's text.", ContainsArgs, True)
def _build_contains(args: ContainsArgs, context: RewardContext) -> RewardFn:
    def fold(text: str) -> str:
        return text if args.case_sensitive else text.casefold()

    def contains(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        n = len(completions)
        needles = [args.text] * n if args.field is None else aligned_column(columns, args.field, n)
        # An empty needle is in every text and would reward anything: treat it as no reference.
        return [
            None if needle is None or str(needle) == "" else float(fold(str(needle)) in fold(text))
            for text, needle in zip(completions, needles, strict=True)
        ]

    return contains


# --- shape ---------------------------------------------------------------------------------------
class ThinkAnswerFormatArgs(_Args):
    open_tag: str = Field("<think>", min_length=1, max_length=64, description="Reasoning open tag.")
    close_tag: str = Field("</think>", min_length=1, max_length=64, description="Reasoning close tag.")
    answer_open: str | None = Field(None, min_length=1, max_length=64, description="Answer open tag, if any.")
    answer_close: str | None = Field(None, min_length=1, max_length=64, description="Answer close tag.")

    @model_validator(mode="after")
    def _answer_tags_paired(self) -> ThinkAnswerFormatArgs:
        if (self.answer_open is None) != (self.answer_close is None):
            raise ValueError("give both 'answer_open' and 'answer_close', or neither")
        return self


def _well_formed(text: str, args: ThinkAnswerFormatArgs) -> bool:
    """One closed reasoning block, then non-empty answer text (inside the answer tags when given)."""
    text = text.strip()
    if not text.startswith(args.open_tag):
        return False
    body, closed, answer = text[len(args.open_tag) :].partition(args.close_tag)
    if not closed or args.open_tag in body or args.open_tag in answer or args.close_tag in answer:
        return False
    answer = answer.strip()
    opened, shut = args.answer_open, args.answer_close
    if opened is None or shut is None:
        return bool(answer)
    if not (answer.startswith(opened) and answer.endswith(shut) and len(answer) >= len(opened) + len(shut)):
        return False
    inner = answer[len(opened) : len(answer) - len(shut)]
    return bool(inner.strip()) and opened not in inner and shut not in inner


@_builtin(
    "think_answer_format",
    "1.0 for exactly one closed reasoning block followed by a non-empty answer (raw completion).",
    ThinkAnswerFormatArgs,
)
def _build_think(args: ThinkAnswerFormatArgs, context: RewardContext) -> RewardFn:
    def think_answer_format(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        raw = columns.get("raw_completions", completions)
        if len(raw) != len(completions):
            raise ValueError(f"raw_completions has {len(raw)} values for {len(completions)} completions")
        # Templates such as DeepSeek-R1's end the prompt with the open tag; the completion starts inside.
        starts_inside = [isinstance(p, str) and p.rstrip().endswith(args.open_tag) for p in prompts]
        pairs = zip(raw, starts_inside, strict=True)
        return [float(_well_formed(args.open_tag * inside + text, args)) for text, inside in pairs]

    return think_answer_format


class LengthTargetArgs(_Args):
    target: int = Field(..., ge=1, le=100_000, description="Length scoring 1.0; 0.0 at 0 and at 2x target.")
    unit: Literal["chars", "tokens"] = Field("chars", description="Count characters or tokenizer tokens.")


@_builtin("length_target", "max(0, 1 - |len - target| / target) of the answer.", LengthTargetArgs)
def _build_length(args: LengthTargetArgs, context: RewardContext) -> RewardFn:
    tokenizer = context.tokenizer
    if args.unit == "tokens" and not callable(getattr(tokenizer, "encode", None)):
        raise SpecError("unit", "unit 'tokens' needs the model's tokenizer, and none was given")

    def measure(text: str) -> int:
        return len(text) if args.unit == "chars" else len(tokenizer.encode(text, add_special_tokens=False))

    def length_target(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        return [max(0.0, 1.0 - abs(measure(text) - args.target) / args.target) for text in completions]

    return length_target


class JsonValidArgs(_Args):
    require_object: bool = Field(False, description="Also require a JSON object (a dict) at the top level.")


_FENCE = re.compile(r"\A```(?:json)?[ \t]*\n(.*?)\n?[ \t]*```\Z", re.DOTALL | re.IGNORECASE)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's json accepts NaN/Infinity; JSON does not


def _json_score(text: str, require_object: bool) -> float:
    fenced = _FENCE.match(text.strip())
    try:
        value = json.loads(fenced.group(1) if fenced else text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return 0.0
    return float(isinstance(value, dict) or not require_object)


@_builtin("json_valid", "1.0 if the answer (optionally in a ```json fence) parses as JSON.", JsonValidArgs)
def _build_json(args: JsonValidArgs, context: RewardContext) -> RewardFn:
    def json_valid(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        return [_json_score(text, args.require_object) for text in completions]

    return json_valid
