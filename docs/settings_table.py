"""Writes the settings table of ``docs/operators.md`` from ``api/settings.py``, so every ``GRPO_*``
setting is listed once, with the default and description the code has.

    python docs/settings_table.py          # rewrite the table between its markers
    python docs/settings_table.py --check  # exit 1 if the committed table is stale

``tests/test_settings_docs.py`` fails while the committed table differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
from enum import Enum
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

REPO = Path(__file__).resolve().parent.parent
OPERATORS_GUIDE = REPO / "docs" / "operators.md"
BEGIN = "<!-- settings:begin (written by `python docs/settings_table.py`; edit api/settings.py instead) -->"
END = "<!-- settings:end -->"
HEADER = ("| variable | default | allowed | what it does |", "|---|---|---|---|")


def _default(field: FieldInfo) -> str:
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"  # as the environment spells it
    if isinstance(value, Path) and not value.is_absolute():
        return f"`./{value}`"
    return f"`{value.value if isinstance(value, Enum) else value}`"


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))


def _allowed(field: FieldInfo) -> str:
    """The field's bounds, choices or pattern, as the settings object checks them."""
    if get_origin(field.annotation) is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(field.annotation))
    if field.annotation is bool:
        return "`true`, `false`"
    parts = []
    for constraint in field.metadata:
        parts += [f"{sign} {getattr(constraint, name)}" for name, sign in _BOUNDS
                  if getattr(constraint, name, None) is not None]
        pattern = getattr(constraint, "pattern", None)
        if pattern:
            parts.append(f"`{pattern}`")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_rows(settings_class: type[BaseModel]) -> list[str]:
    """One table row per field of ``settings_class``; a field without a description is an error,
    since its row would tell an operator nothing."""
    prefix = settings_class.model_config.get("env_prefix", "")
    rows = []
    for name, field in settings_class.model_fields.items():
        if not field.description:
            raise ValueError(f"{prefix}{name.upper()} has no description in {settings_class.__name__}: "
                             "give its Field one")
        cells = (f"`{prefix}{name.upper()}`", _default(field), _allowed(field), field.description)
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return rows


def settings_table(settings_class: type[BaseModel]) -> str:
    return "\n".join((BEGIN, *HEADER, *settings_rows(settings_class), END))


def committed_table(text: str) -> str:
    """The table between the markers of ``text`` (the guide), markers included."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"the guide needs exactly one {BEGIN} ... {END}")
    return text[text.index(BEGIN):text.index(END) + len(END)]


def with_table(text: str, table: str) -> str:
    return text.replace(committed_table(text), table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the table is current")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))  # run as a script from anywhere: the checkout's api package
    from api.settings import Settings

    text = OPERATORS_GUIDE.read_text()
    updated = with_table(text, settings_table(Settings))
    if args.check:
        stale = updated != text
        print(f"{OPERATORS_GUIDE.relative_to(REPO)}: the settings table is {'stale' if stale else 'current'}")
        return 1 if stale else 0
    OPERATORS_GUIDE.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
