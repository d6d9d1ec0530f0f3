"""Which reward functions exist, and how a job's ``rewards:`` list becomes callables.

Built-ins live in :mod:`grpo_core.rewards.builtins` and the modules named after them; the types
they share are in :mod:`grpo_core.rewards.reward_types`, so this catalog imports them one way.
Plugins are installed packages that declare an entry point in the ``grpo.rewards`` group; the
entry point's name is the reward's name and it loads to either a :class:`RewardDefinition` or a
plain function
``(completions, prompts, **columns) -> list[float | None]`` (which then takes no ``args``).

Name clashes are resolved without a warning, because neither side is wrong: a built-in always wins
over a plugin of the same name (a plugin must not silently change what ``exact_match`` means in an
existing spec), and between two plugins of one name the first one ``importlib.metadata`` lists
wins. A plugin that fails to load is skipped and logged so it cannot take the built-ins down with
it; asking for it by name then says why it is missing.

Nothing in a spec is executed: a spec only picks a registered name and passes ``args``, which are
validated by that reward's pydantic model before its ``build`` runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from grpo_core.errors import SpecError
from grpo_core.rewards.builtins import BUILTINS
from grpo_core.rewards.code_tests import CODE_TESTS
from grpo_core.rewards.http_verifier import HTTP_VERIFIER
from grpo_core.rewards.judge_args import LABEL_MODEL, SCORE_MODEL
from grpo_core.rewards.multi_grader import CompositeRewardDefinition, multi_grader
from grpo_core.rewards.python_grader import PYTHON_GRADER
from grpo_core.rewards.reward_model import REWARD_MODEL
from grpo_core.rewards.reward_types import BoundReward, RewardContext, RewardDefinition, RewardFn
from grpo_core.rewards.similarity import TEXT_SIMILARITY
from grpo_core.rewards.string_check import STRING_CHECK
from grpo_core.spec.run_spec import RewardSpec, reward_names

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_rewards",
    "bind_rewards",
    "check_reward_rows",
    "model_sources",
    "required_capabilities",
    "reward_catalog",
    "sandbox_footprints",
    "validate_reward_specs",
]

ENTRY_POINT_GROUP = "grpo.rewards"
logger = logging.getLogger(__name__)

class _NoArgs(BaseModel):
    """Args of a plugin given as a plain function: it has no way to receive any."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _reject_any(cls, data: Any) -> Any:
        if data:
            keys = ", ".join(sorted(map(str, data))) if isinstance(data, dict) else repr(data)
            raise ValueError(f"this reward is a plain function and takes no args; got {keys}")
        return data


def _wrap_function(name: str, fn: Callable[..., Any]) -> RewardDefinition:
    """A plain plugin function as a definition with no args and no declared columns."""
    doc = (getattr(fn, "__doc__", None) or "").strip()
    origin = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    description = doc.splitlines()[0] if doc else f"Plugin reward function {origin}."
    return RewardDefinition(name=name, description=description, args_model=_NoArgs, build=lambda _a, _c: fn)


@dataclass(frozen=True)
class _Registry:
    definitions: dict[str, RewardDefinition]
    builtin_names: frozenset[str]
    broken: dict[str, str]  # plugin name -> why it did not load


_state: _Registry | None = None


def _load_plugin(entry_point: Any) -> RewardDefinition:
    obj = entry_point.load()
    if isinstance(obj, RewardDefinition):
        # The entry-point name is what the package declared and what users type; it wins.
        return obj if obj.name == entry_point.name else dataclasses.replace(obj, name=entry_point.name)
    if callable(obj):
        return _wrap_function(entry_point.name, obj)
    raise TypeError(f"loads a {type(obj).__name__}, not a RewardDefinition or a function")


def _discover() -> _Registry:
    definitions = {definition.name: definition
                   for definition in [*BUILTINS, CODE_TESTS, HTTP_VERIFIER, PYTHON_GRADER, REWARD_MODEL,
                                      TEXT_SIMILARITY, SCORE_MODEL, LABEL_MODEL, STRING_CHECK]}
    # multi finds its graders' rewards here (it cannot import this module: a cycle).
    definitions["multi"] = multi_grader(definitions.get)
    builtin_names = frozenset(definitions)
    broken: dict[str, str] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name in definitions:
            continue  # built-ins win; so does the first plugin of a name (not loaded at all)
        try:
            definitions[entry_point.name] = _load_plugin(entry_point)
        except Exception as exc:  # a broken plugin must not hide the built-ins or other plugins
            broken[entry_point.name] = f"{type(exc).__name__}: {exc}"
            logger.warning("reward plugin %r could not be loaded: %s", entry_point.name, exc)
    return _Registry(definitions, builtin_names, broken)


def _registry(refresh: bool = False) -> _Registry:
    global _state
    if _state is None or refresh:
        _state = _discover()
    return _state


def available_rewards(refresh: bool = False) -> dict[str, RewardDefinition]:
    """Every known reward by name. Discovery runs once per process; ``refresh`` reruns it."""
    return dict(_registry(refresh).definitions)


def reward_catalog() -> list[dict[str, Any]]:
    """Name, description and args JSON schema of each reward, sorted by name (for an HTTP catalog)."""
    state = _registry()
    return [
        {
            "name": name,
            "description": definition.description,
            "builtin": name in state.builtin_names,
            "args_schema": definition.args_model.model_json_schema(),
        }
        for name, definition in sorted(state.definitions.items())
    ]


def _lookup(state: _Registry, name: str, index: int) -> RewardDefinition:
    definition = state.definitions.get(name)
    if definition is not None:
        return definition
    if name in state.broken:
        reason = state.broken[name]
        raise SpecError(f"rewards.{index}.name", f"reward plugin '{name}' failed to load: {reason}")
    available = ", ".join(sorted(state.definitions))
    raise SpecError(f"rewards.{index}.name", f"unknown reward '{name}'; available: {available}")


def _validate_args(definition: RewardDefinition, args: dict[str, Any], index: int) -> BaseModel:
    """Validate ``args``; the first pydantic error becomes a SpecError at its dotted path."""
    try:
        return definition.args_model.model_validate(args)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        path = ".".join([f"rewards.{index}.args", *(str(part) for part in first["loc"])])
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise SpecError(path, f"{first['msg']}{more}") from exc


def validate_reward_specs(specs: list[RewardSpec], columns: set[str] | None = None) -> None:
    """Check each spec's name and ``args`` as :func:`bind_rewards` would, raising the same
    :class:`SpecError` (``rewards.N.name``, ``rewards.N.args.FIELD``), but build nothing: building
    may need the model's tokenizer, which the web service never loads. ``columns`` (inline rows'
    columns, when the spec has them) also checks the columns each reward reads."""
    state = _registry()
    checked = []
    for index, spec in enumerate(specs):
        definition = _lookup(state, spec.name, index)
        checked.append((definition, _validate_args(definition, spec.args, index)))
    # Columns last: a malformed reward is reported before a column the rows lack.
    for index, (definition, args) in enumerate(checked):
        _needed_columns(definition, args, columns, index)


def required_capabilities(specs: list[RewardSpec]) -> list[tuple[int, str]]:
    """``(index, capability)`` for each reward of ``specs`` that needs a worker capability (unknown
    names need none here: :func:`validate_reward_specs` reports them)."""
    definitions = _registry().definitions
    return [(index, capability) for index, spec in enumerate(specs)
            for capability in sorted(_capabilities(definitions[spec.name], spec.args)
                                     if spec.name in definitions else ())]


def _capabilities(definition: RewardDefinition, args: dict[str, Any]) -> frozenset[str]:
    """What a worker needs to run the reward: its own, and what its args add (a ``multi``'s
    graders'; args that do not validate add nothing: validate_reward_specs reports them)."""
    if not isinstance(definition, CompositeRewardDefinition):
        return definition.capabilities
    try:
        checked = definition.args_model.model_validate(args)
    except ValidationError:
        return definition.capabilities
    return definition.capabilities | definition.capabilities_of(checked)


def _validated(specs: list[RewardSpec]) -> Iterator[tuple[int, RewardDefinition, BaseModel]]:
    """``(index, definition, args)`` of each reward whose name and args are valid; the others are
    skipped: :func:`validate_reward_specs` is what reports them."""
    definitions = _registry().definitions
    for index, spec in enumerate(specs):
        definition = definitions.get(spec.name)
        if definition is None:
            continue
        try:
            yield index, definition, definition.args_model.model_validate(spec.args)
        except ValidationError:
            continue


def check_reward_rows(specs: list[RewardSpec], rows: list[dict[str, Any]]) -> None:
    """Run each reward's ``check_rows`` over the dataset's rows; a bad value is a SpecError at
    ``rewards.N.args``."""
    for index, definition, args in _validated(specs):
        if definition.check_rows is None:
            continue
        try:
            definition.check_rows(args, rows)
        except ValueError as exc:
            raise SpecError(f"rewards.{index}.args", str(exc)) from exc


def _needed_columns(definition: RewardDefinition, args: BaseModel, columns: set[str] | None,
                    index: int) -> list[str]:
    """The columns the reward reads; a SpecError when ``columns`` (if known) lacks one."""
    needed = list(definition.required_columns(args))
    missing = [] if columns is None else [column for column in needed if column not in columns]
    if missing:
        present = ", ".join(sorted(columns or ())) or "(none)"
        raise SpecError(f"rewards.{index}.args",
                        f"needs dataset column '{missing[0]}'; columns present: {present}")
    return needed


def model_sources(specs: list[RewardSpec]) -> list[tuple[str, str]]:
    """``(rewards.N.args.FIELD, source)`` for every model a reward names, for the submit checks of
    sources."""
    return [(f"rewards.{index}.args.{name}", source) for index, definition, args in _validated(specs)
            for name, source in definition.model_sources(args).items()]


def sandbox_footprints(specs: list[RewardSpec]) -> list[tuple[int, int]]:
    """``(index, bytes)`` for each reward of ``specs`` that runs sandboxes: the most memory they
    can hold at once during one call (rewards with invalid args are left to
    :func:`validate_reward_specs`)."""
    return [(index, footprint) for index, definition, args in _validated(specs)
            if (footprint := definition.sandbox_bytes(args))]


def _build(definition: RewardDefinition, args: BaseModel, context: RewardContext, index: int) -> RewardFn:
    try:
        return definition.build(args, context)
    except SpecError as exc:  # its class kept: a source that cannot be reached is no spec error
        raise type(exc)(f"rewards.{index}.args.{exc.field}", exc.reason) from exc
    except ValueError as exc:
        raise SpecError(f"rewards.{index}.args", str(exc)) from exc


def bind_rewards(
    specs: list[RewardSpec], context: RewardContext, columns: set[str] | None = None
) -> list[BoundReward]:
    """Turn specs into callables, failing with a :class:`SpecError` on the first bad one.

    ``columns`` (the dataset's columns, when known) enables the missing-column check. A name may
    repeat (two ``regex_match`` rewards); later ones are named ``name_2``, ``name_3``... so that
    metric names stay unique. Every spec is validated before any is built: building one may load
    a model.
    """
    state = _registry()
    checked = []
    for index, spec in enumerate(specs):
        definition = _lookup(state, spec.name, index)
        args = _validate_args(definition, spec.args, index)
        checked.append((definition, args, _needed_columns(definition, args, columns, index)))
    bound: list[BoundReward] = []
    for index, (spec, name, (definition, args, needed)) in enumerate(zip(specs, reward_names(specs), checked,
                                                                         strict=True)):
        fn = _build(definition, args, context, index)
        bound.append(BoundReward(name, spec.weight, fn, needed, context.timeout_seconds, spec.clip_min,
                                 spec.clip_max, spec.gate_by, spec.gate_threshold or 0.0))
    return bound
