"""Comparing runs in a real browser against a real `grpo dev` stack: two tiny jobs that differ
in their learning rate train to the end; ticked in the jobs list, Compare opens a chart with a
line per job for the picked metric and a table of the spec fields that differ."""

from __future__ import annotations

from typing import Any

import pytest
from dashboard_pages import log_in_as
from waiting import wait_until

pytestmark = pytest.mark.slow

# Each line of the compare chart: its name and how many points it has, from the Plotly div (the
# faint raw copy behind each smoothed line left out: test_dashboard_charts.py reads those).
TRACES = """() => {
  const div = document.querySelector('[data-chart="compare"]');
  const lines = div && div.data ? div.data.filter((t) => !t.name.endsWith(" (raw)")) : [];
  return lines.map((t) => [t.name, t.x.length]);
}"""


def wait_finished(stack: Any, job_id: int) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job = stack.client("alpha").job(job_id)
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(finished, 90, f"job {job_id} to finish", interval=0.2)


def test_two_ticked_jobs_open_a_comparison_of_their_metrics_and_specs(browser_page, keyed_stack, tiny_spec,
                                                                      screenshots) -> None:
    page = browser_page
    client = keyed_stack.client("alpha")
    ids = [client.submit(tiny_spec(name, max_steps=3, grpo={"learning_rate": rate}))["id"]
           for name, rate in (("compare-a", 1e-3), ("compare-b", 5e-4))]
    for job_id in ids:
        assert wait_finished(keyed_stack, job_id)["status"] == "succeeded"
    log_in_as(page, keyed_stack, "alpha")
    button = page.locator("button[data-compare]")
    assert button.is_disabled() and button.inner_text() == "Compare (0)"
    page.check(f'input[data-compare-job="{ids[0]}"]')
    assert button.is_disabled()  # one job is nothing to compare
    page.check(f'input[data-compare-job="{ids[1]}"]')
    page.wait_for_function("() => !document.querySelector('button[data-compare]').disabled")
    assert button.inner_text() == "Compare (2)"
    button.click()
    page.wait_for_function(f"() => location.hash === '#/compare?ids={ids[0]},{ids[1]}'")
    page.wait_for_function(f"() => ({TRACES})().length === 2")
    assert page.evaluate(TRACES) == [[f"#{ids[0]} compare-a", 3], [f"#{ids[1]} compare-b", 3]]
    assert page.locator('[data-chart="compare"] .legend .traces').count() == 2  # drawn, not just data
    rate_row = page.locator('[data-panel=spec-diff] tr[data-field="grpo.learning_rate"] td')
    assert rate_row.all_inner_texts() == ["grpo.learning_rate", "0.001", "0.0005"]
    assert page.locator('[data-panel=spec-diff] tr[data-field="grpo.beta"]').count() == 0
    options = page.locator("select[data-metric-picker] option").all_inner_texts()
    assert {"reward", "kl", "learning_rate"} <= set(options) and "step" not in options
    page.select_option("select[data-metric-picker]", "kl")
    page.wait_for_function("""() => document.querySelector('[data-chart="compare"] .gtitle')
                              ?.textContent === 'kl'""")
    assert [points for _, points in page.evaluate(TRACES)] == [3, 3]
    screenshots(page, "compare")
