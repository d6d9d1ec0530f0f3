"""What a file of the repository may cite: documents that are in it, by sections they have.

Shared by ``tests/test_docs.py`` (every file) and ``tests/api/test_spec_docs.py`` (the README).
Three kinds of reference are checked:

* a document outside the repository (the team's original design and GRPO notes, the style
  guide, a shared folder): never, since a reader of the repository cannot open it;
* a page of ``docs/``, or a section of a Markdown file by its number (``§`` and the number of a
  heading such as ``## 5. Metrics contract``): the file exists and has that heading; steps of
  the GRPO reference (``steps`` and a number or a range): it numbers those pipeline steps;
* a Markdown link ``[text](path#anchor)``: the path exists and, for a Markdown file, has a
  heading whose GitHub anchor is ``anchor``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE_GUIDE = REPO / "docs" / "grpo_reference.md"
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # what users and operators read

# Spelled with a character class or an escape so that this file does not cite them itself.
OUTSIDE = re.compile(r"\bDESIGN(?:\.md|\s*§)|\bGRPO_REFERENC[E]\b|\bSTYLE\.md\b"
                     r"|\.\./share[d]/|/work/share[d]/|\bshare[d]/(?:DESIGN|STYLE|GRPO|seeds)")
DOC_PATH = re.compile(r"\bdocs/[\w.-]+\.md\b")
SECTION = re.compile(r"\b((?:docs/)?[\w.-]+\.md),? §(\d+[a-z]?)\b")
STEPS = re.compile(r"docs/grpo_reference\.md,? steps? (\d+)(?:\s*[–-]\s*(\d+))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# Folders whose files are not the repository's own (installs, caches, build outputs).
NOT_OURS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist", "runs",
            "artifacts", "node_modules"}


def repository_files() -> list[Path]:
    """The repository's text files: what git tracks plus new files it does not ignore, or,
    without git, every file outside :data:`NOT_OURS`."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()
        paths = [REPO / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in REPO.rglob("*") if not NOT_OURS & set(p.relative_to(REPO).parts)]
    return [p for p in paths if p.is_file() and not p.is_symlink() and _is_text(p)]


def _is_text(path: Path) -> bool:
    try:
        path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    return True


def outside_citations(text: str) -> list[str]:
    return [match.group(0) for match in OUTSIDE.finditer(text)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """Heading texts outside fenced code blocks."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.append(line.lstrip("#").strip())
    return found


def section_numbers(markdown: str) -> set[str]:
    """``5`` for ``## 5. Metrics contract``, ``1b`` for ``## 1b. ...``."""
    numbered = (re.match(r"(\d+[a-z]?)\. ", heading) for heading in headings(markdown))
    return {match.group(1) for match in numbered if match}


def pipeline_steps() -> set[int]:
    """The numbers of the reference's step pipeline (its numbered list)."""
    text = REFERENCE_GUIDE.read_text()
    pipeline = text[text.index("## The step pipeline"):]
    pipeline = pipeline[:pipeline.index("\n## ", 1)] if "\n## " in pipeline[1:] else pipeline
    return {int(number) for number in re.findall(r"^(\d+)\. ", pipeline, re.M)}


def broken_citations(text: str, source: Path) -> list[str]:
    """The references in ``text`` (the contents of ``source``) to a missing file or section."""
    broken = [path for path in DOC_PATH.findall(text) if not (REPO / path).is_file()]
    for document, number in SECTION.findall(text):
        # From the repository's root, or beside a Markdown file that cites its neighbour.
        path = REPO / document if (REPO / document).is_file() else source.parent / document
        if not path.is_file() or number not in section_numbers(path.read_text()):
            broken.append(f"{document} §{number}")
    steps = pipeline_steps() if REFERENCE_GUIDE.is_file() else set()
    for first, last in STEPS.findall(text):
        wanted = range(int(first), int(last or first) + 1)
        if not wanted or not set(wanted) <= steps:
            broken.append(f"docs/grpo_reference.md steps {first}-{last or first}")
    if source.suffix == ".md":
        broken += [target for target in LINK.findall(text) if not _link_resolves(target, source)]
    return broken


def _link_resolves(target: str, source: Path) -> bool:
    if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
        return True
    path_part, _, fragment = target.partition("#")
    path = (source.parent / path_part).resolve() if path_part else source
    if not path.exists():
        return False
    if fragment and path.suffix == ".md":
        return fragment in {anchor(heading) for heading in headings(path.read_text())}
    return True
