"""No client keeps its own copy of the lifecycle: the dashboard's scripts read the statuses,
terminal set and priorities from ``GET /v1/lifecycle`` and which actions apply from each job's
``actions``; the CLI uses ``api.domain.lifecycle``'s names. A status compared with a literal, or a list
of statuses, actions or priority classes written out, is such a copy."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from api.domain.lifecycle import JOB_STATUSES, Action
from api.vocabulary import PRIORITIES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "api" / "http" / "dashboard"
CLI = ROOT / "api" / "cli"
ACTIONS = {action.value for action in Action}
_QUOTED = r"""["'`](\w+)["'`]"""
_COMPARED = re.compile(rf"""(?:[!=]==?|\.includes\()\s*{_QUOTED}|{_QUOTED}\s*[!=]==?""")
_BRACKETS = re.compile(r"\[[^\[\]]*\]|\{[^{}]*\}", re.DOTALL)
_COMMENT = re.compile(r"//[^\n]*")


def js_copies(source: str) -> list[str]:
    """A status or priority class compared with a literal; an array or object literal that names
    two or more statuses, or priority classes, or an action with the statuses where it applies.
    (Naming actions alone is no copy: which control draws which action is the page's own.)"""
    code = _COMMENT.sub("", source)
    found = [f"compares with {word!r}" for pair in _COMPARED.findall(code) for word in pair
             if word in JOB_STATUSES or word in PRIORITIES]
    for literal in _BRACKETS.findall(code):
        named = set(re.findall(_QUOTED, literal)) | set(re.findall(r"(\w+)\s*:", literal))
        statuses, priorities = named & set(JOB_STATUSES), named & set(PRIORITIES)
        if len(statuses) >= 2 or len(priorities) >= 2 or (statuses and named & ACTIONS):
            found.append(f"lists {sorted(named & {*JOB_STATUSES, *PRIORITIES, *ACTIONS})}")
    return found


def python_copies(source: str) -> list[str]:
    """A comparison with a status written as a string, alone or in a tuple, list or set."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            items = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            found += [f"line {node.lineno} compares with {item.value!r}" for item in items
                      if isinstance(item, ast.Constant) and item.value in JOB_STATUSES]
    return found


def test_the_scanners_find_the_copies_there_used_to_be() -> None:
    """What the dashboard and the CLI held before the table was served, so a copy is seen."""
    assert js_copies('export const FINISHED = ["succeeded", "failed", "cancelled"];') != []
    assert js_copies('{action: "resume", label: "Resume", when: ["paused"]},') != []
    assert js_copies('const LABELS = {pause: "Pause", resume: "Resume"};') == []
    assert js_copies('job.status === "succeeded" ? download() : null') != []
    assert js_copies('if (job.status === "cancelling") return null;') != []
    assert js_copies('const PRIORITIES = ["low", "normal", "high"];') != []
    assert js_copies('// a comment may say ["queued", "paused"]\nsection("running", "Running")') == []
    assert python_copies('failed = job["status"] in ("failed", "cancelled")') != []
    assert python_copies('code = 0 if job["status"] == "succeeded" else 1') != []
    assert python_copies('NOTABLE = ("running", "preempted")\nok = kind in NOTABLE') == []


@pytest.mark.parametrize("path", sorted(DASHBOARD.glob("*.js")), ids=lambda path: path.name)
def test_the_dashboard_keeps_no_copy_of_the_lifecycle(path: Path) -> None:
    assert js_copies(path.read_text()) == [], f"{path.name}: read it from /v1/lifecycle or the job's actions"


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda path: path.name)
def test_the_cli_keeps_no_copy_of_the_lifecycle(path: Path) -> None:
    assert python_copies(path.read_text()) == [], f"{path.name}: use api.domain.lifecycle's names"
