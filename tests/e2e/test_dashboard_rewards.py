"""A python grader's failures on the dashboard's job page, in a real browser against `grpo dev`:
a grader that raises on every row shows the job failed ``reward_error`` with the exception, the
grader's line and a failing row; one that raises on some rows shows "succeeded with warnings"
(never a plain green "succeeded") and how many rows went unscored."""

from __future__ import annotations

from typing import Any

import pytest
from dashboard_pages import log_in_as
from failing_graders import ALWAYS, ROWS, SOMETIMES
from sandbox_guard import needs_sandbox
from waiting import wait_until

pytestmark = [pytest.mark.slow, needs_sandbox]



def finished_job(stack: Any, tiny_spec: Any, name: str, source: str) -> dict[str, Any]:
    client = stack.client("alpha")
    job_id = client.submit(tiny_spec(name, max_steps=2, dataset={"prompts": ROWS},
                                     rewards=[{"name": "python", "args": {"source": source}}]))["id"]

    def finished() -> dict[str, Any] | None:
        job = client.job(job_id)
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(finished, 120, f"job {job_id} to finish", interval=0.2,
                      details=lambda: str(client.job(job_id)))


def test_a_graders_failures_show_on_the_job_page(browser_page, keyed_stack, tiny_spec, screenshots) -> None:
    page = browser_page
    failed = finished_job(keyed_stack, tiny_spec, "grader-always-fails", ALWAYS)
    partly = finished_job(keyed_stack, tiny_spec, "grader-sometimes-fails", SOMETIMES)
    assert failed["status"] == "failed" and failed["error"]["code"] == "reward_error", failed
    assert partly["status"] == "succeeded" and partly["unscored_rows"] == 4, partly
    log_in_as(page, keyed_stack, "alpha")

    page.goto(f"/#/jobs/{failed['id']}")
    note = page.locator("[data-panel=job] .job-note.failure[data-error-code=reward_error]")
    note.wait_for()
    screenshots(page, "job-reward-error")
    message = note.locator(".message").inner_text()
    assert "failed on every row of step 1" in message and "KeyError: 'no_such_key'" in message
    assert "grader.py line 2: return 1.0 / len(item['no_such_key'])" in message
    assert '"answer":' in message  # the failing row

    page.goto(f"/#/jobs/{partly['id']}")
    badge = page.locator("[data-panel=job] .facts .badge[data-status=succeeded]")
    badge.wait_for()
    screenshots(page, "job-succeeded-with-warnings")
    assert badge.inner_text() == "succeeded with warnings"
    assert "status-succeeded-warnings" in badge.get_attribute("class")
    assert page.locator("[data-panel=job] .badge.status-succeeded").count() == 0  # no plain green
    warning = page.locator("[data-panel=job] .job-note.unscored")
    assert warning.get_attribute("data-unscored-rows") == "4" and "4 row(s)" in warning.inner_text()
    # The samples table's reward error column: the grader's exception on the rows it failed on.
    page.locator("[data-panel=samples] th", has_text="reward error").wait_for()
    errors = page.locator("[data-panel=samples] td.reward-error").all_inner_texts()
    assert any("ValueError: cannot grade a no" in text for text in errors), errors
