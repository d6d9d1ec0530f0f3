"""``POST /v1/jobs`` also takes the spec as YAML (``Content-Type: application/yaml``), as
``grpo submit`` and ``grpo train`` read it from files, so a spec pastes into the dashboard's form
or a ``curl --data-binary @spec.yaml`` unchanged. The submission parses it off the event loop
(:mod:`api.http.spec_intake`), after the size limit, into plain data (PyYAML's safe constructor),
then validates it as the JSON path does, so defaults and error messages are the same.

The loader is libyaml's scanner and parser (C, where PyYAML was built with it) under PyYAML's own
composer (Python): a half-megabyte spec in pure-Python PyYAML took most of a second of CPU, and
libyaml's composer, in C, holds the interpreter for the whole document (a quarter of a second for
a megabyte of small scalars), which stalls every request of the process even from a thread; the
Python composer lets the event loop in between nodes. The composer refuses, as a 422 naming
``body``: nesting deeper than :data:`MAX_DEPTH` (it recurses per level), aliases (a few nested
expand exponentially once copied or re-encoded as JSON), and, in the constructor, an integer
longer than Python converts (4,300 digits).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

MAX_DEPTH = 32  # a JobSpec nests 4 deep (rewards.0.args.FIELD); reward args may add a few more
YAML_MEDIA_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})


class _Guarded:
    """The composer's checks, mixed in before PyYAML's ``Composer``."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
            raise ComposerError(None, None, "YAML aliases (*name) are not accepted in a spec",
                                self.peek_event().start_mark)  # type: ignore[attr-defined]
        opens = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)  # type: ignore[attr-defined]
        if opens:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            if opens:
                self._depth -= 1


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _SpecLoader(_Guarded, Composer, CParser, SafeConstructor, Resolver):
        def __init__(self, stream: bytes) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

else:  # pragma: no cover - PyYAML built without libyaml

    class _SpecLoader(_Guarded, yaml.SafeLoader):  # type: ignore[no-redef]
        pass


def parse_yaml(raw: bytes) -> object:
    """The document as plain data; ``yaml.YAMLError`` or ``ValueError`` (too deep, an integer
    too long to convert) for what cannot be one."""
    return yaml.load(raw, Loader=_SpecLoader)  # noqa: S506 - a safe constructor, aliases refused
