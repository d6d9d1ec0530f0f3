"""Evaluation on the job page, in a real browser against a real `grpo dev` stack: a tiny job that
evaluates before training (step 0), every 2 steps and at its last step trains to the end; its page
draws the eval charts next to the training reward with a point per eval step, and its sample
completions show the eval rows marked as eval, step 0's among them. A job that does not evaluate
gets no eval chart."""

from __future__ import annotations

from typing import Any

import pytest
from dashboard_pages import log_in_as
from test_dashboard import points, wait_for_points
from test_dashboard_compare import wait_finished

pytestmark = pytest.mark.slow

EVAL_PROMPTS = [{"prompt": "Say yes."}, {"prompt": "Is 2+3 five?"}]
# The charts' data-chart names in the order the page shows them.
CHART_ORDER = "() => Array.from(document.querySelectorAll('[data-chart]'), (div) => div.dataset.chart)"


def sample_rows(page: Any) -> list[tuple[str, str]]:
    """(data-split, the split cell's text) of each row the samples table shows."""
    rows = page.locator("[data-panel=samples] tbody tr[data-split]")
    return [(row.get_attribute("data-split"), row.locator("td").first.inner_text()) for row in rows.all()]


def test_a_job_that_evaluates_shows_eval_charts_and_eval_samples(browser_page, keyed_stack, tiny_spec,
                                                                screenshots) -> None:
    page = browser_page
    client = keyed_stack.client("alpha")
    grpo = {"eval_strategy": "steps", "eval_steps": 2, "eval_on_start": True}
    evaluated = client.submit(tiny_spec("evaluated", max_steps=3, grpo=grpo, log_completions_every=2,
                                        eval_dataset={"prompts": EVAL_PROMPTS}))["id"]
    plain = client.submit(tiny_spec("plain", max_steps=2))["id"]
    for job_id in (evaluated, plain):
        assert wait_finished(keyed_stack, job_id)["status"] == "succeeded"
    log_in_as(page, keyed_stack, "alpha")

    page.goto(f"/#/jobs/{evaluated}")
    wait_for_points(page, "eval_reward", "eval_reward", 3)
    assert points(page, "eval_reward", "eval_reward") == [0, 2, 3]  # before training, every 2, the last
    assert points(page, "eval_pass", "eval_pass@k") == [0, 2, 3]
    assert points(page, "eval_length", "mean_length") == [0, 2, 3]
    assert points(page, "eval_rewards", "contains") == [0, 2, 3]
    assert points(page, "reward", "reward") == [1, 2, 3]  # step 0 trained nothing: not on training's charts
    order = page.evaluate(CHART_ORDER)
    assert order[:5] == ["reward", "eval_reward", "eval_pass", "eval_length", "rewards"], order
    screenshots(page, "job-eval-charts")

    picker = page.locator("select[data-picker=samples]")
    options = picker.locator("option").all_inner_texts()
    assert {"step 0 (eval)", "step 2 (+ eval)"} <= set(options), options
    picker.select_option("0")
    page.wait_for_selector("[data-panel=samples] tbody tr[data-split=eval]")
    assert sample_rows(page) == [("eval", "eval")] * len(EVAL_PROMPTS)  # one greedy completion per prompt
    picker.select_option("2")
    page.wait_for_selector("[data-panel=samples] tbody tr[data-split=training]")
    assert {split for split, _ in sample_rows(page)} == {"training", "eval"}
    page.select_option("select[data-picker=split]", "eval")
    page.wait_for_function("() => !document.querySelector('[data-panel=samples] tr[data-split=training]')")
    assert sample_rows(page) == [("eval", "eval")] * len(EVAL_PROMPTS)
    eval_row = page.locator("[data-panel=samples] tbody tr[data-split=eval]").first
    assert eval_row.locator("td").last.inner_text() == "–"  # an eval completion has no advantage
    screenshots(page, "job-eval-samples")

    page.goto(f"/#/jobs/{plain}")
    page.wait_for_selector("[data-panel=job] h2:has-text('plain')")
    wait_for_points(page, "reward", "reward", 2)
    assert not any(chart.startswith("eval") for chart in page.evaluate(CHART_ORDER))
    assert "(eval)" not in " ".join(page.locator("select[data-picker=samples] option").all_inner_texts())


# The x of each alert marker (a dashed line, its rule written above) on a chart.
ALERT_MARKS = """(chart) => {
  const layout = document.querySelector(`[data-chart=${chart}]`).layout;
  return (layout.shapes || []).map((shape, i) => [shape.x0, layout.annotations[i].text]);
}"""


def test_a_jobs_alerts_and_best_checkpoint_on_the_pages_and_in_grpo_alerts(
        browser_page, keyed_stack, tiny_spec, screenshots) -> None:
    """Issue 37: a tripped health rule is a badge in the jobs list and on the job page and a marker on
    every chart at its step; the job's best eval point is one of its facts; ``grpo alerts`` lists it."""
    import subprocess
    import sys

    page = browser_page
    client = keyed_stack.client("alpha")
    grpo = {"eval_strategy": "steps", "eval_steps": 1, "metric_for_best_model": "eval_reward"}
    # frac_reward_zero_std >= 0 always holds: the rule trips at step 1, tells (notify), and training goes on.
    alerts = [{"rule": "no_signal", "threshold": 0.0, "window": 1}]
    job_id = client.submit(tiny_spec("watched", max_steps=2, grpo=grpo, alerts=alerts,
                                     eval_dataset={"prompts": EVAL_PROMPTS}))["id"]
    job = wait_finished(keyed_stack, job_id)
    assert job["status"] == "succeeded" and job["alerts"][0]["rule"] == "no_signal"
    log_in_as(page, keyed_stack, "alpha")

    page.goto("/#/jobs")
    page.wait_for_selector(f"tr[data-job-id='{job_id}'] [data-alert=no_signal]")
    page.goto(f"/#/jobs/{job_id}")
    badge = page.wait_for_selector("[data-panel=job] [data-alert=no_signal]")
    assert "frac_reward_zero_std" in badge.get_attribute("title")  # what the rule watches, from /v1/codes
    best = job["best"]
    assert best["metric"] == "eval_reward" and best["step"] in (1, 2)
    page.wait_for_selector(f"[data-panel=job] dd:has-text('step {best['step']}: eval_reward')")
    wait_for_points(page, "reward", "reward", 2)
    page.wait_for_function(f"(chart) => ({ALERT_MARKS})(chart).length > 0", arg="reward")
    for chart in ("reward", "eval_reward"):
        assert page.evaluate(ALERT_MARKS, chart) == [[1, "no_signal"]], chart
    screenshots(page, "job-alert")

    done = subprocess.run([sys.executable, "-m", "api.cli.main", "alerts", str(job_id), "--api-url",
                           keyed_stack.url, "--api-key", keyed_stack.keys["alpha"]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:1] == ["STEP"] and "no_signal" in lines[1] and "notify" in lines[1]
    assert any(line.startswith("no_signal: ") and "frac_reward_zero_std" in line for line in lines)
