"""Every field of a job spec is described where a user finds it: the running service's OpenAPI
schema (``/openapi.json``, rendered at ``/docs``), walked from ``JobSpec`` through every nested
model, list item and nullable variant; the README and ``grpo train --help`` send the user there,
not to documents outside the repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doc_citations import outside_citations

from grpo_core.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return components[ref.rsplit("/", 1)[-1]] if ref else schema


def _nested(schema: dict[str, Any], components: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The object schemas inside a property's schema: itself, its items, its anyOf variants."""
    schema = _resolve(schema, components)
    if "properties" in schema:
        yield schema
    for variant in schema.get("anyOf", []) + schema.get("oneOf", []):
        yield from _nested(variant, components)
    if "items" in schema:
        yield from _nested(schema["items"], components)


def fields_without_description(components: dict[str, Any], root: str = "JobSpec") -> list[str]:
    """Dotted paths (``grpo.top_p``, ``rewards[].name``) of the fields under ``root`` with no
    description: none on the property, nor on the model it refers to (pydantic leaves out a
    field's description that repeats its model's)."""
    missing: list[str] = []
    seen: set[int] = set()

    def walk(schema: dict[str, Any], path: str) -> None:
        if id(schema) in seen:
            return
        seen.add(id(schema))
        for name, prop in schema["properties"].items():
            field = f"{path}{name}"
            if not prop.get("description") and not _resolve(prop, components).get("description"):
                missing.append(field)
            suffix = "[]." if "items" in _resolve(prop, components) else "."
            for inner in _nested(prop, components):
                walk(inner, field + suffix)

    walk(components[root], "")
    return missing


def test_the_checker_sees_a_field_without_description() -> None:
    components = {"JobSpec": {"properties": {"grpo": {"$ref": "#/components/schemas/G", "description": "d"}}},
                  "G": {"properties": {"top_p": {"type": "number"}, "seed": {"description": "s"}}}}
    assert fields_without_description(components) == ["grpo.top_p"]


def test_every_job_spec_field_has_a_description_in_the_openapi_schema(api) -> None:
    components = api.get("/openapi.json").json()["components"]["schemas"]
    missing = fields_without_description(components)
    assert not missing, f"give these JobSpec fields a description: {missing}"
    # The walk reached the nested models, not just the top level.
    grpo = _resolve(components["JobSpec"]["properties"]["grpo"], components)
    assert "top_p" in grpo["properties"] and "loss_type" in grpo["properties"]


def test_the_readme_and_grpo_train_help_send_the_user_to_the_described_fields(capsys) -> None:
    readme = README.read_text()
    outside = outside_citations(readme)
    assert not outside, f"the README points at documents that are not in the repository: {outside}"
    assert "`/docs` of any running service, schema `JobSpec`" in readme
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "/docs of a running service, schema JobSpec" in shown
