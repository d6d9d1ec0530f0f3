"""``POST /v1/jobs`` also takes the spec as YAML (``Content-Type: application/yaml``), as
``grpo submit`` and ``grpo train`` read it from files, so a spec pastes into the dashboard's form
or a ``curl --data-binary @spec.yaml`` unchanged. The submission parses it off the event loop
(:mod:`api.http.spec_intake`), after the size limit, with the specs' own loader (plain data only,
no aliases), then validates it as the JSON path does, so defaults and error messages are the same.

Before composing, the token stream (read without recursion) is checked for nesting deeper than
:data:`MAX_DEPTH`, since the composer recurses per level and would exhaust the stack; an integer
longer than Python converts (4,300 digits) is refused the same way: a 422 naming ``body``.
"""

from __future__ import annotations

import yaml

from grpo_core.specfile import load_yaml

MAX_DEPTH = 32  # a JobSpec nests 4 deep (rewards.0.args.FIELD); reward args may add a few more
_OPENS = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
          yaml.FlowSequenceStartToken)
_CLOSES = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
YAML_MEDIA_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})


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
