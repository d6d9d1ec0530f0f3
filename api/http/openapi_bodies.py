"""The JobSpec schema in the OpenAPI components. ``POST /v1/jobs`` reads its body raw (to parse
it off the event loop, :mod:`api.http.spec_intake`), so FastAPI no longer sees a JobSpec
parameter and would leave the schema out; the route's ``requestBody`` refers to it, and clients,
``/docs`` and the schema fuzzer read it from here, as FastAPI would have written it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from api.domain.job_spec import JobSpec

_REF = "#/components/schemas/{model}"


def install(app: FastAPI) -> None:
    """Wrap ``app.openapi`` (already built by whatever installed it) to add the schema once."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        if "JobSpec" not in components:
            _, definitions = models_json_schema([(JobSpec, "validation")], ref_template=_REF)
            for name, definition in definitions.get("$defs", {}).items():
                components.setdefault(name, definition)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
