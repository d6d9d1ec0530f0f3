"""What to say about a field a spec does not have: the nearest name it does have ("did you mean
'num_generations'?"), or where a known name belongs (a ``grpo:`` field written at the top level).
Read by both readers of a spec's errors, ``grpo train`` and the API's 422."""

from __future__ import annotations

import difflib
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.trl_fields import REFUSED

# How alike a typo and a field name must be (difflib's ratio) to suggest the field: "num_generation"
# and "learning_rat" are far above it, two unrelated short names below it.
_SIMILAR = 0.75


def unknown_field_message(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """Pydantic's "extra inputs are not permitted" for the field at ``loc`` (its dotted path
    inside a ``root``), told as what to write instead."""
    parent, name = _model_at(root, loc[:-1]), str(loc[-1])
    if parent is None:
        return "unknown field"
    top_level = not loc[:-1]
    if top_level and name in GRPOConfig.model_fields:
        return f"belongs under grpo: write it as grpo.{name}"
    if top_level and name in REFUSED:
        return f"is a TRL GRPOConfig field: TRL's fields go under grpo: (grpo.{name})"
    if parent is GRPOConfig and name in root.model_fields:
        return f"belongs at the top level of the spec, not under grpo: ({name})"
    names = {field: field for field in parent.model_fields}
    if top_level:
        names.update({field: f"grpo.{field}" for field in GRPOConfig.model_fields})
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=_SIMILAR)
    if close:
        return f"unknown field; did you mean '{names[close[0]]}'?"
    return f"unknown field; the fields here are {', '.join(sorted(parent.model_fields))}"


def _model_at(root: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class whose fields are at ``path`` (list indexes skipped), or None when the path
    leads into something that is not a model (a reward's free-form args)."""
    annotation: Any = root
    for part in path:
        model = _model_in(annotation)
        if model is None:
            element = _list_element(annotation)
            if element is None or not isinstance(part, int):
                return None
            annotation = element
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
    return _model_in(annotation)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class in ``annotation``: itself, or the model of ``Model | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [arg for arg in get_args(annotation) if _model_in(arg) is not None]
        return _model_in(models[0]) if len(models) == 1 else None
    return None


def _list_element(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        lists = [arg for arg in get_args(annotation) if get_origin(arg) is list]
        annotation = lists[0] if len(lists) == 1 else annotation
    return get_args(annotation)[0] if get_origin(annotation) is list else None
