"""Reading a spec from YAML/JSON and turning validation failures into per-field messages.

Every function takes the spec's class: :class:`RunSpec` by default, or a spec built on it (the
service's job spec), so its fields are checked and its unknown fields hinted alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from grpo_core.errors import SpecError
from grpo_core.spec.field_hints import unknown_field_message
from grpo_core.spec.run_spec import RunSpec

MAX_SPEC_BYTES = 1024 * 1024
SpecT = TypeVar("SpecT", bound=RunSpec)


def field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "spec"


def validation_messages(exc: ValidationError, spec_type: type[RunSpec] = RunSpec) -> list[SpecError]:
    """One :class:`SpecError` per invalid field of a ``spec_type``, with pydantic's reason."""
    return [SpecError(field_path(err["loc"]), spec_error_reason(err, spec_type))
            for err in exc.errors(include_url=False)]


def spec_error_reason(err: Any, spec_type: type[RunSpec] = RunSpec) -> str:
    """Pydantic's message for one error of a ``spec_type`` (``loc`` inside the spec); a field the
    spec does not have is told as the name it probably meant, or where that name belongs."""
    if err["type"] == "extra_forbidden":
        return unknown_field_message(spec_type, tuple(err["loc"]))
    return err["msg"]


class InvalidSpec(Exception):  # noqa: N818 - it names the condition, like FileNotFoundError
    """A spec with one or more invalid fields."""

    def __init__(self, errors: list[SpecError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


def parse_spec(data: Any, spec_type: type[SpecT] = RunSpec) -> SpecT:
    if not isinstance(data, dict):
        raise InvalidSpec([SpecError("spec", "must be a mapping of fields")])
    try:
        return spec_type.model_validate(data)
    except ValidationError as exc:
        raise InvalidSpec(validation_messages(exc, spec_type)) from exc


def with_changes(spec: SpecT, changes: dict[str, Any]) -> SpecT:
    """``spec`` with ``changes`` applied and validated again; a nested mapping changes only the
    fields it names (``{"grpo": {"max_steps": 10}}``). An override (``--max-steps``, a new
    priority) goes into the spec itself so every reader sees the one value. Raises
    :class:`InvalidSpec`. The result is of ``spec``'s own class."""
    return parse_spec(merged_fields(spec.model_dump(), changes), type(spec))


def merged_fields(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Plain data: ``base`` with ``changes`` over it, nested mappings merged field by field (a
    list or a scalar in ``changes`` replaces the whole value)."""
    merged = dict(base)
    for key, value in changes.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = merged_fields(base[key], value) if nested else value
    return merged


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data, never objects or code) that also refuses anchors and
    aliases: a spec never needs them, and a few nested aliases expand exponentially once the
    data is copied or re-encoded as JSON (the "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not accepted in a spec",
                                              event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(raw: bytes | str) -> Any:
    """YAML (a superset of JSON) → plain data; raises ``yaml.YAMLError``."""
    return yaml.load(raw, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def read_spec_data(path: Path) -> Any:
    """A spec file's raw mapping (YAML or JSON), before validation; raises :class:`InvalidSpec`."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidSpec([SpecError("spec", f"cannot read {path}: {exc.strerror}")]) from exc
    if len(raw) > MAX_SPEC_BYTES:
        raise InvalidSpec([SpecError("spec", f"{path} is larger than {MAX_SPEC_BYTES} bytes")])
    try:
        return json.loads(raw) if path.suffix == ".json" else load_yaml(raw)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise InvalidSpec([SpecError("spec", f"{path} is not valid YAML/JSON: {exc}")]) from exc


def load_spec_file(path: Path, spec_type: type[SpecT] = RunSpec) -> SpecT:
    """YAML (a superset of JSON) file → a ``spec_type``; raises :class:`InvalidSpec`."""
    return parse_spec(read_spec_data(path), spec_type)
