"""``docs/architecture.md`` says what the code does, where the code can say it back: the job
statuses, their groups, every transition and every user action (``api/domain/lifecycle.py``), one row
per package with each of its modules named, the import rules (``tests/test_architecture.py``'s
``FORBIDDEN``) and the metric names the core emits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import test_architecture
from doc_citations import REPO

from api.domain import lifecycle

DOC = REPO / "docs" / "architecture.md"
SOURCE_PACKAGES = ("api", "worker", "grpo_core")


def table(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def names(cell: str) -> list[str]:
    """The backticked words of a cell, in order."""
    return re.findall(r"`([^`]+)`", cell)


def test_the_table_reader_reads_a_table() -> None:
    text = "intro\n| a | b |\n|---|---|\n| `x` | `y`, `z` |\n| `w` | v |\n\nafter | not a row"
    assert table(text, "| a |") == [["`x`", "`y`, `z`"], ["`w`", "v"]]
    assert names("`y`, `z`") == ["y", "z"]


def test_every_status_is_described() -> None:
    described = [names(row[0])[0] for row in table(DOC.read_text(), "| status |")]
    assert sorted(described) == sorted(lifecycle.JOB_STATUSES)


def test_the_status_groups_are_the_codes() -> None:
    rows = table(DOC.read_text(), "| group (")
    groups = {names(row[0])[0]: set(names(row[1])) for row in rows}
    expected = {name: set(getattr(lifecycle, name)) for name in dir(lifecycle) if name.endswith("_STATUSES")
                and name != "JOB_STATUSES"}
    assert groups == expected


def documented_transitions() -> dict[str, tuple[set[str], str, str]]:
    rows = table(DOC.read_text(), "| transition |")
    return {names(row[0])[0]: (set(names(row[1])), names(row[2])[0], names(row[3])[0]) for row in rows}


def test_every_transition_is_documented_as_the_state_machine_has_it() -> None:
    expected = {transition.value: ({s.value for s in rule.sources}, rule.target.value, rule.event)
                for transition, rule in lifecycle.RULES.items()}
    documented = documented_transitions()
    assert documented.keys() == expected.keys(), "the doc's transitions are not api.domain.lifecycle's"
    wrong = {name: documented[name] for name in expected if documented[name] != expected[name]}
    assert not wrong, f"sources, target or event differ from api.domain.lifecycle.RULES: {wrong}"


def test_every_action_is_documented_where_it_applies() -> None:
    every = set(lifecycle.JOB_STATUSES)
    shorthand = {"every status": every,
                 "every status but the terminal ones": every - set(lifecycle.TERMINAL_STATUSES)}
    rows = table(DOC.read_text(), "| action |")
    documented = {names(row[0])[0]: shorthand.get(row[1], set(names(row[1]))) for row in rows}
    assert documented == {action.value: set(statuses) for action, statuses in lifecycle.ACTIONS.items()}


def packages() -> dict[str, Path]:
    found = {"migrations": REPO / "migrations"}
    for top in SOURCE_PACKAGES:
        for init in (REPO / top).rglob("__init__.py"):
            found[".".join(init.parent.relative_to(REPO).parts)] = init.parent
    return found


def module_map() -> dict[str, str]:
    return {names(row[0])[0]: row[1] for row in table(DOC.read_text(), "| package |")}


def test_the_module_map_has_one_row_per_package() -> None:
    assert sorted(module_map()) == sorted(packages())


@pytest.mark.parametrize("package", sorted(set(packages()) - {"migrations"}))
def test_the_module_map_names_every_module_of_a_package(package: str) -> None:
    described = set(names(module_map().get(package, "")))
    modules = {path.stem for path in packages()[package].glob("*.py")
               if not path.stem.startswith("_")}
    missing = sorted(modules - described)
    assert not missing, f"docs/architecture.md §7: the {package} row does not name {missing}"


def documented_rules() -> dict[str, set[str]]:
    rows = table(DOC.read_text(), "| module | must not import |")
    frameworks = set(test_architecture.SERVICE_FRAMEWORKS)
    rules = {}
    for row in rows:
        forbidden = set(names(row[1])) | (frameworks if "frameworks" in row[1] else set())
        rules[names(row[0])[0]] = forbidden
    return rules


def test_the_import_rules_mirror_the_architecture_test() -> None:
    enforced = {module: set(prefixes) for module, prefixes in test_architecture.FORBIDDEN.items()}
    documented = documented_rules()
    assert documented.keys() == enforced.keys(), "the doc's rules name other modules than FORBIDDEN"
    differ = {module: sorted(documented[module] ^ enforced[module]) for module in enforced
              if documented[module] != enforced[module]}
    assert not differ, f"docs/architecture.md §7 differs from tests/test_architecture.py: {differ}"


def core_source() -> str:
    return "\n".join(path.read_text() for path in (REPO / "grpo_core").rglob("*.py"))


def contract_metrics() -> list[str]:
    """The names in §5's list: the paragraph that starts with `step`."""
    text = DOC.read_text()
    section = text[text.index("## 5. Metrics contract"):text.index("## 6.")]
    listing = next(paragraph for paragraph in section.split("\n\n") if paragraph.startswith("`step`,"))
    return names(listing)


def test_every_contract_metric_is_emitted_by_the_core() -> None:
    metrics = contract_metrics()
    assert len(metrics) >= 30 and "clip_ratio/region_mean" in metrics and "rewards/{fn}/mean" in metrics
    source = core_source()
    # A templated name (`rewards/{fn}/mean`) is an f-string with any field in its place.
    missing = [name for name in metrics
               if not re.search('"' + re.sub(r"\\\{\w+\\\}", r"{\\w+}", re.escape(name)) + '"', source)]
    assert not missing, f"the metrics contract names metrics the core does not emit: {missing}"
