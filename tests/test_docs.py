"""No file of the repository cites a document a reader of it cannot open: nothing outside the
repository, no ``docs/`` page, section, step or anchor that does not exist, and no module path
in the guides that the code no longer has (``tests/doc_citations.py`` says what is checked)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from doc_citations import GUIDES, REPO, broken_citations, outside_citations, repository_files

FILES = repository_files()
PATH = re.compile(r"`((?:api|worker|grpo_core|tests|benchmarks|migrations|examples|docs|\.ci)/[\w/.*-]*)`")
# A dotted module name, not a file name such as `worker.log`.
DOTTED = re.compile(r"`((?:api|worker|grpo_core)(?:\.\w+)+)(?<!\.log)(?<!\.py)(?<!\.md)`")


# Paths a build writes (the example models `.ci/bootstrap` makes): named by the guides, not tracked.
GENERATED = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()}


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_scan_reads_the_code_and_the_guides() -> None:
    names = {_name(path) for path in FILES}
    expected = {"README.md", "docs/architecture.md", "grpo_core/algorithm/losses.py",
                "api/domain/lifecycle.py"}
    assert expected <= names


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_no_file_cites_a_document_outside_the_repository(path: Path) -> None:
    cited = outside_citations(path.read_text())
    assert not cited, f"{_name(path)} cites documents that are not in the repository: {cited}"


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_every_cited_document_and_section_exists(path: Path) -> None:
    broken = broken_citations(path.read_text(), path)
    assert not broken, f"{_name(path)} cites what the repository does not have: {broken}"


def test_the_checks_see_each_kind_of_bad_citation() -> None:
    outside = "see " + "DESIGN" + " §5, " + "GRPO_" + "REFERENCE step 6 and ../" + "shared/notes"
    assert len(outside_citations(outside)) == 3
    readme, docs = REPO / "README.md", "docs/"  # split, so this file does not cite them itself
    assert broken_citations(docs + "no_such_page.md", readme) == [docs + "no_such_page.md"]
    assert broken_citations(f"{docs}architecture.md §{99}", readme) == [f"{docs}architecture.md §{99}"]
    assert broken_citations(f"({docs}grpo_reference.md, steps 8–99)", readme)
    assert broken_citations(f"[x]({docs}operators.md#no-such-heading)", readme)
    assert broken_citations(f"[x]({docs}nowhere.md)", readme)
    # What is there passes.
    good = ("docs/architecture.md §5, (docs/grpo_reference.md, steps 8–10), BENCHMARKS.md §2, "
            "[x](docs/operators.md#settings)")
    assert broken_citations(good, readme) == []


def _defines(module: Path, name: str) -> bool:
    """Whether ``module`` (a file) binds ``name`` at its top level."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return True
        imported = node.names if isinstance(node, ast.ImportFrom) else []
        if any((alias.asname or alias.name) == name for alias in imported):
            return True
    return False


def resolves(dotted: str) -> bool:
    """``api.store.jobs`` is a module or package; ``api.store.jobs.transition`` a name it defines."""
    parts = dotted.split(".")
    for size in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:size])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[size:]
            return not rest or (len(rest) == 1 and _defines(module, rest[0]))
    return False


@pytest.mark.parametrize("guide", GUIDES, ids=_name)
def test_the_modules_and_paths_a_guide_names_exist(guide: Path) -> None:
    text = guide.read_text()
    paths = [path for path in PATH.findall(text)
             if not any(REPO.glob(path.rstrip("/"))) and path.rstrip("/") not in GENERATED]
    modules = [name for name in DOTTED.findall(text) if not resolves(name)]
    assert not paths + modules, f"{_name(guide)} names what the code does not have: {paths + modules}"


def test_the_module_check_sees_a_renamed_module() -> None:
    assert resolves("api.store.jobs") and resolves("api.store.jobs.transition") and resolves("grpo_core.spec")
    assert not resolves("api.store.models") and not resolves("api.store.jobs.no_such_function")
