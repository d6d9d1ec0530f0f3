"""``POST /v1/jobs`` also takes the spec as YAML (``Content-Type: application/yaml``), as
``grpo submit`` and ``grpo train`` read it from files, so a spec pastes into the dashboard's form
or a ``curl --data-binary @spec.yaml`` unchanged.

An ASGI middleware inside :class:`api.http.errors.BodySizeLimit` (so the size limit applies
first): it parses the YAML with the specs' own loader (plain data only, no aliases) and hands the
route the same mapping as JSON, so validation, defaults and error messages are the JSON path's,
and every other request passes through untouched.

Before composing, the token stream (read without recursion) is checked for nesting deeper than
:data:`MAX_DEPTH`, since the composer recurses per level and would exhaust the stack; an integer
longer than Python converts (4,300 digits) is refused the same way: a 422 naming ``body``.
"""

from __future__ import annotations

import json

import yaml
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.errors import error_response, replay_body
from grpo_core.specfile import load_yaml

MAX_DEPTH = 32  # a JobSpec nests 4 deep (rewards.0.args.FIELD); reward args may add a few more
_OPENS = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
          yaml.FlowSequenceStartToken)
_CLOSES = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
YAML_MEDIA_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})
SUBMIT_PATH = "/v1/jobs"


def parse_yaml(raw: bytes) -> object:
    """The document as plain data; ``yaml.YAMLError`` or ``ValueError`` (too deep, an integer
    too long to convert) for what cannot be one."""
    depth = 0
    for token in yaml.scan(raw):
        if isinstance(token, _OPENS):
            depth += 1
            if depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(token, _CLOSES):
            depth -= 1
    return load_yaml(raw)


def _media_type(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            return value.decode("latin-1").split(";", 1)[0].strip().lower()
    return ""


class YamlSpecBody:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != SUBMIT_PATH
                or _media_type(scope) not in YAML_MEDIA_TYPES):
            await self.app(scope, receive, send)
            return
        message = await receive()  # BodySizeLimit hands the whole (bounded) body over at once
        try:
            data = parse_yaml(message.get("body", b""))
        except (yaml.YAMLError, ValueError) as exc:
            await error_response(422, "invalid_spec", f"not valid YAML: {exc}", "body")(scope, receive, send)
            return
        # default=str: YAML has types JSON has not (dates); validation then names the field.
        body = json.dumps(data, default=str).encode()
        headers = [(name, value) for name, value in scope["headers"]
                   if name not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await self.app({**scope, "headers": headers}, replay_body(body, receive), send)
