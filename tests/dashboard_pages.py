"""Steps the dashboard's browser tests share: logging in, and submitting from the form."""

from __future__ import annotations

import json
from typing import Any


def log_in(page: Any, key: str) -> None:
    page.goto("/#/login")
    page.fill("input[name=key]", key)
    page.click("form.login button[type=submit]")


def log_in_as(page: Any, stack: Any, team: str) -> None:
    log_in(page, stack.keys[team])
    page.wait_for_selector(f'#who .team[data-team="{team}"]')
    page.wait_for_selector("[data-panel=jobs] table")


def submit_from_form(page: Any, spec: dict[str, Any] | str, button: str = "button[type=submit]") -> Any:
    """Fill the form (JSON, or any text) and submit it (or press another of its ``button``s); the
    result box, once it says something."""
    page.goto("/#/jobs")
    form = page.locator("[data-panel=submit]")
    if form.get_attribute("open") is None:
        form.locator(":scope > summary").click()
    page.fill("textarea[name=spec]", spec if isinstance(spec, str) else json.dumps(spec, indent=2))
    page.click(f".submit-form {button}")
    return page.wait_for_selector(".submit-result .notice")


def submitted_job_id(page: Any, spec: dict[str, Any] | str) -> int:
    result = submit_from_form(page, spec)
    return int(result.query_selector("a").get_attribute("href").rsplit("/", 1)[1])
