"""``multi``: OpenAI's multi grader, several graders' scores combined by an arithmetic formula.

Its args are OpenAI's: ``graders``, named OpenAI grader objects (``string_check``,
``text_similarity``, ``python``, ``score_model``, ``label_model``; not ``multi``), and
``calculate_output``, arithmetic over their names (``0.7 * accuracy + 0.3 * format``; see
:mod:`grpo_core.rewards.grader_expressions`, which never runs it as Python).

Each grader is the registry's reward of its type, converted as the spec converter converts a
grader (:func:`grpo_core.spec.openai_graders.openai_grader_reward`), its args validated and built
exactly as :func:`grpo_core.rewards.bind_rewards` does for a reward of the spec: one
implementation per grader type, whichever way a spec names it. The registry imports this module,
so this module cannot import the registry back (a cycle); the registry hands it a lookup of the
definitions instead (:func:`multi_grader`). An error in a grader names its place,
``graders.NAME.FIELD``, which is also its place in the OpenAI grader object.

Scoring a row: every grader the formula reads scores it; a grader that could not (None) leaves the
row unscored, as does arithmetic without a real value (a division by zero, ``sqrt`` of a
negative): there is no score to give. The graders run at once, each in a thread of its own, since
they are independent and each may wait on something else (a sandbox, a judge model), so one
call's time budget covers them together rather than one after another; so their sandboxes can be
held at once, and ``sandbox_bytes`` is their sum. Graders the formula does not read are checked
but neither built nor run. What the graders need (dataset columns, worker capabilities, models,
sandbox memory, checks of the rows' values) is what the ``multi`` reward needs.
"""

from __future__ import annotations

import math
import numbers
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from grpo_core.errors import SpecError
from grpo_core.rewards.grader_expressions import (
    FUNCTIONS,
    MAX_EXPRESSION_CHARS,
    Expression,
    Unscorable,
    parse_expression,
)
from grpo_core.rewards.python_grader import GradedRows
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn
from grpo_core.spec.openai_graders import openai_grader_reward

__all__ = ["MAX_GRADERS", "CompositeRewardDefinition", "GraderLookup", "multi_grader"]

MAX_GRADERS = 16
GraderLookup = Callable[[str], RewardDefinition | None]  # a reward's definition by name, None if unknown
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _no_capabilities(args: Any) -> frozenset[str]:
    return frozenset()


@dataclass(frozen=True)
class CompositeRewardDefinition(RewardDefinition):
    """A reward whose worker capabilities depend on its args (a ``multi``: its graders'), which
    :func:`grpo_core.rewards.required_capabilities` adds to the fixed ``capabilities``."""

    capabilities_of: Callable[[Any], frozenset[str]] = _no_capabilities


@dataclass(frozen=True)
class SubGrader:
    """One grader of a ``multi``: its name in ``graders``, the reward of its type, its args."""

    name: str
    definition: RewardDefinition
    args: BaseModel


def _error(loc: tuple[str | int, ...], message: str, value: Any) -> InitErrorDetails:
    # The message goes in as context: a grader's text may hold braces ({{item.answer}}).
    return InitErrorDetails(type=PydanticCustomError("multi_grader", "{message}", {"message": message}),
                            loc=loc, input=value)


def _raise(errors: list[InitErrorDetails]) -> NoReturn:
    """Errors placed on the fields to fix (``graders.a.operation``), not on the args as a whole."""
    raise ValidationError.from_exception_data("MultiGraderArgs", errors)


def _sub_grader(name: str, grader: dict[str, Any], lookup: GraderLookup) -> SubGrader:
    """One grader checked as the registry checks a reward (the ValidationError of its own args)."""
    try:
        reward = openai_grader_reward(grader, nested=True)
    except SpecError as exc:
        _raise([_error(("graders", name, *filter(None, exc.field.split("."))), exc.reason, grader)])
    definition = lookup(reward["name"])
    if definition is None:
        _raise([_error(("graders", name, "type"), f"no '{reward['name']}' reward is registered here",
                       reward["name"])])
    try:
        args = definition.args_model.model_validate(reward["args"])
    except ValidationError as exc:
        _raise([_error(("graders", name, *error["loc"]), error["msg"], error.get("input"))
                for error in exc.errors()])
    return SubGrader(name, definition, args)


def _check_names(graders: dict[str, Any]) -> None:
    for name in graders:
        if not _NAME.fullmatch(name) or name in FUNCTIONS:
            why = ("is a function of calculate_output" if name in FUNCTIONS
                   else "is not a name calculate_output can use")
            _raise([_error(("graders", name), f"'{name[:80]}' {why}: letters, digits and _, not "
                           f"starting with a digit, at most 64, none of {', '.join(FUNCTIONS)}", name)])


class MultiGraderArgs(BaseModel):
    """The shape of a ``multi``'s args; :func:`multi_grader` adds the checks that need the registry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    graders: dict[str, dict[str, Any]] = Field(..., min_length=1, max_length=MAX_GRADERS, description=(
        "The graders by name, each an OpenAI grader object: {type: string_check | text_similarity | "
        "python | score_model | label_model, ...its fields}."))
    calculate_output: str = Field(..., min_length=1, max_length=MAX_EXPRESSION_CHARS, description=(
        "Arithmetic over the graders' names: numbers, + - * /, ^ (power), parentheses, min, max, abs, "
        "floor, ceil, exp, sqrt, log; e.g. 0.7 * accuracy + 0.3 * format."))

    _graders: tuple[SubGrader, ...] = PrivateAttr(default=())
    _expression: Expression | None = PrivateAttr(default=None)

    def checked(self, lookup: GraderLookup) -> MultiGraderArgs:
        """Self with every grader checked against the registry and the formula parsed."""
        _check_names(self.graders)
        graders = tuple(_sub_grader(name, grader, lookup) for name, grader in self.graders.items())
        try:
            expression = parse_expression(self.calculate_output, set(self.graders))
        except ValueError as exc:
            _raise([_error(("calculate_output",), str(exc), self.calculate_output)])
        self._graders = tuple(grader for grader in graders if grader.name in expression.names)
        self._expression = expression
        return self

    @property
    def used(self) -> tuple[SubGrader, ...]:
        """The graders ``calculate_output`` reads, in the order of ``graders``."""
        return self._graders

    @property
    def expression(self) -> Expression:
        assert self._expression is not None, "validated through multi_grader's args model"
        return self._expression


def _args_model(lookup: GraderLookup) -> type[MultiGraderArgs]:
    """The args model with the registry's checks: a class per registry, closing over its lookup
    (pydantic validates without a way to pass one in)."""

    class CheckedMultiGraderArgs(MultiGraderArgs):
        model_config = ConfigDict(title="MultiGraderArgs")

        @model_validator(mode="after")
        def _check(self) -> CheckedMultiGraderArgs:
            self.checked(lookup)
            return self

    return CheckedMultiGraderArgs


@dataclass
class _Outcome:
    values: list[float | None] = field(default_factory=list)
    problems: dict[int, str] = field(default_factory=dict)
    unscored: int = 0
    error: BaseException | None = None


def _number(name: str, index: int, value: Any) -> float | None:
    """A grader's value as a float, None where it has none; a bool or a non-number is a bug."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"grader '{name}' returned {type(value).__name__} {value!r:.40} at index {index}")
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _score(name: str, fn: RewardFn, n: int, completions: list[str], prompts: list[str],
           columns: dict[str, list[Any]], outcome: _Outcome) -> None:
    try:
        # Copies: the graders run at once, and one must not see what another did to its inputs.
        values = fn(list(completions), list(prompts), **{key: list(value) for key, value in columns.items()})
        if not isinstance(values, Sequence) and callable(getattr(values, "tolist", None)):
            values = values.tolist()
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or len(values) != n:
            size = len(values) if isinstance(values, Sequence) else type(values).__name__
            raise ValueError(f"grader '{name}' returned {size} values for {n} completions")
        outcome.values = [_number(name, index, value) for index, value in enumerate(values)]
        outcome.problems = dict(getattr(values, "problems", None) or {})
        outcome.unscored = int(getattr(values, "unscored", 0) or 0)
    except BaseException as exc:  # handed to the calling thread, which raises it
        outcome.error = exc


def _run_all(graders: list[tuple[str, RewardFn]], completions: list[str], prompts: list[str],
             columns: dict[str, list[Any]]) -> dict[str, _Outcome]:
    """Every grader's outcome; the first grader's exception (in ``graders``' order) is raised."""
    n = len(completions)
    outcomes = {name: _Outcome() for name, _ in graders}
    if len(graders) == 1:
        name, fn = graders[0]
        _score(name, fn, n, completions, prompts, columns, outcomes[name])
    else:
        # Daemon threads, as the scorer's own: one that never returns must not keep the job alive.
        threads = [threading.Thread(target=_score, name=f"grader-{name}", daemon=True,
                                    args=(name, fn, n, completions, prompts, columns, outcomes[name]))
                   for name, fn in graders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for outcome in outcomes.values():
        if outcome.error is not None:
            raise outcome.error
    return outcomes


def _combine(expression: Expression, outcomes: dict[str, _Outcome], n: int) -> GradedRows:
    values: list[float | None] = [None] * n
    problems: dict[int, str] = {}
    silent_failures = sum(o.unscored for o in outcomes.values() if not o.problems)
    for row in range(n):
        scores = {name: outcome.values[row] for name, outcome in outcomes.items()}
        failed = [f"grader '{name}': {outcome.problems[row]}" for name, outcome in outcomes.items()
                  if row in outcome.problems]
        if failed:
            problems[row] = "; ".join(failed)
        if any(value is None for value in scores.values()):
            continue  # a grader without a score for the row: no formula of it has one
        try:
            values[row] = expression.value(scores)  # type: ignore[arg-type]
        except Unscorable as exc:
            problems[row] = str(exc)
    result = GradedRows(values, problems)
    # A grader that counted failures without saying on which rows (a verifier): counted, not placed.
    unplaced = sum(1 for row, value in enumerate(values) if value is None and row not in problems)
    result.unscored += min(silent_failures, unplaced)
    return result


def _build(args: MultiGraderArgs, context: RewardContext) -> RewardFn:
    graders: list[tuple[str, RewardFn]] = []
    for grader in args.used:
        try:
            graders.append((grader.name, grader.definition.build(grader.args, context)))
        except SpecError as exc:  # its class kept (a source that cannot be reached is no spec error)
            raise type(exc)(f"graders.{grader.name}.{exc.field}", exc.reason) from exc
        except ValueError as exc:
            raise SpecError(f"graders.{grader.name}", str(exc)) from exc
    expression = args.expression

    def multi(completions: list[str], prompts: list[str], **columns: Any) -> GradedRows:
        return _combine(expression, _run_all(graders, completions, prompts, columns), len(completions))

    return multi


def _required_columns(args: MultiGraderArgs) -> list[str]:
    seen: dict[str, None] = {}
    for grader in args.used:
        seen.update(dict.fromkeys(grader.definition.required_columns(grader.args)))
    return list(seen)


def _capabilities(args: MultiGraderArgs) -> frozenset[str]:
    found: set[str] = set()
    for grader in args.used:
        found |= grader.definition.capabilities
        if isinstance(grader.definition, CompositeRewardDefinition):
            found |= grader.definition.capabilities_of(grader.args)
    return frozenset(found)


def _model_sources(args: MultiGraderArgs) -> dict[str, str]:
    return {f"graders.{grader.name}.{key}": source for grader in args.used
            for key, source in grader.definition.model_sources(grader.args).items()}


def _check_rows(args: MultiGraderArgs, rows: list[dict[str, Any]]) -> None:
    for grader in args.used:
        if grader.definition.check_rows is not None:
            try:
                grader.definition.check_rows(grader.args, rows)
            except ValueError as exc:
                raise ValueError(f"graders.{grader.name}: {exc}") from exc


def multi_grader(lookup: GraderLookup) -> CompositeRewardDefinition:
    """The ``multi`` reward, finding its graders' rewards with ``lookup`` (the registry's)."""
    return CompositeRewardDefinition(
        "multi",
        "OpenAI's multi grader: named graders (string_check, text_similarity, python, score_model, "
        "label_model) combined by calculate_output, arithmetic over their names.",
        _args_model(lookup),
        _build,
        required_columns=_required_columns,
        model_sources=_model_sources,
        # Its graders' sandboxes may be held at once: they run together.
        sandbox_bytes=lambda args: sum(grader.definition.sandbox_bytes(grader.args) for grader in args.used),
        check_rows=_check_rows,
        capabilities_of=_capabilities,
    )
