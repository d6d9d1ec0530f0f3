"""Every ``GRPO_*`` setting is listed once, in ``docs/operators.md``, as ``api/settings.py`` has it:
the table there is what ``docs/settings_table.py`` writes from the settings object, so a setting
added without a description, or a row for one that no longer exists, fails here. And no guide
names a ``GRPO_*`` variable that nothing reads."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from doc_citations import GUIDES, REPO, repository_files
from pydantic import Field

from api.settings import Settings

VARIABLE = re.compile(r"\bGRPO_[A-Z0-9_]*[A-Z0-9]\b")


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_table", REPO / "docs" / "settings_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


def committed() -> str:
    return generator.committed_table((REPO / "docs" / "operators.md").read_text())


def test_the_operators_guide_lists_every_setting_as_api_settings_has_it() -> None:
    assert committed() == generator.settings_table(Settings), (
        "docs/operators.md's settings table is stale: run `python docs/settings_table.py`")


def test_each_setting_has_one_row() -> None:
    rows = re.findall(r"^\| `(GRPO_\w+)` \|", committed(), re.M)
    assert sorted(rows) == sorted(f"GRPO_{name.upper()}" for name in Settings.model_fields)
    assert len(rows) == len(set(rows))


class _Added(Settings):
    new_knob: int = Field(3, ge=1, description="A setting the guide does not list yet.")


class _Undescribed(Settings):
    quiet_knob: int = 3


def test_a_setting_added_or_removed_without_the_guide_makes_the_table_stale() -> None:
    assert "`GRPO_NEW_KNOB` | `3` | ≥ 1 |" in generator.settings_table(_Added)
    assert generator.settings_table(_Added) != committed()
    fewer = generator.settings_table(Settings).replace(generator.settings_rows(Settings)[0] + "\n", "")
    assert fewer != committed()


def test_a_setting_without_a_description_cannot_be_listed() -> None:
    with pytest.raises(ValueError, match="GRPO_QUIET_KNOB has no description"):
        generator.settings_table(_Undescribed)


def read_outside_the_guides() -> str:
    """Every file but the guides: what the code, scripts and tests read."""
    return "\n".join(path.read_text() for path in repository_files() if path not in GUIDES)


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_variable_a_guide_names_is_read_somewhere(guide: Path) -> None:
    """A setting (``api/settings.py``) or a variable a tool reads (the CLI's, the bootstrap's, the
    tests'): named in the code, not only in the guides."""
    settings = {f"GRPO_{name.upper()}" for name in Settings.model_fields}
    elsewhere = set(VARIABLE.findall(read_outside_the_guides()))
    unknown = sorted(set(VARIABLE.findall(guide.read_text())) - settings - elsewhere)
    assert not unknown, f"{guide.name} names variables nothing reads: {unknown}"
