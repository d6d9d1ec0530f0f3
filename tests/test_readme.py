"""The README is the front door: what the service is, the two set-up commands, a five-minute tour
and links; the manual lives in ``docs/`` (the user's guide beside the operator's guide and the
architecture). Long READMEs grow by accretion, so the shape is checked, not left to taste."""

from __future__ import annotations

import re

from doc_citations import REPO, headings

README = (REPO / "README.md").read_text()
MAX_LINES = 250


def test_the_readme_stays_short() -> None:
    lines = README.count("\n")
    assert lines <= MAX_LINES, f"README.md is {lines} lines; move reference material to docs/user_guide.md"


def test_its_first_block_holds_exactly_the_two_set_up_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    lines = [line.strip() for line in first_block.splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands == ["bash .ci/bootstrap && .venv/bin/grpo dev --submit examples/tiny.yaml",
                        "bash .ci/bootstrap && .venv/bin/python -m pytest"]


def test_the_tour_covers_submit_watch_own_data_and_download() -> None:
    tour = README[README.index("## A five-minute tour"):]
    for step in ("**Submit.**", "**Watch.**", "**Bring your own data and grader.**", "**Download.**"):
        assert step in tour, f"the tour has no {step} step"
    for command in ("grpo submit", "grpo watch", "grpo files upload", "grpo rewards run", "grpo download"):
        assert command in tour, f"the tour never shows `{command}`"


def test_it_links_every_guide() -> None:
    assert "Where to read more" in headings(README)
    guides = ("docs/user_guide.md", "docs/operators.md", "docs/architecture.md", "docs/grpo_reference.md")
    for guide in guides:
        assert f"]({guide})" in README, f"the README does not link {guide}"
