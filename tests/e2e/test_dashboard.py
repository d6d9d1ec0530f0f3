"""The dashboard in a real browser (headless Chromium) against a real `grpo dev` stack that
requires team keys: log in, submit from the form, watch a job's charts grow live and read its
sample completions, cancel from the list, never see another team's job, read the cluster and the
queue. Any script error in the page fails the test (``browser_page``). Screenshots of each page go
under the run's temp folder; their paths are logged."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboard_pages import log_in, log_in_as, submit_from_form, submitted_job_id
from sandbox_guard import needs_sandbox
from waiting import wait_until

from grpo_core.rewards import reward_catalog

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.slow

# The x values of a chart's named trace, read from the Plotly graph div itself.
TRACE_X = """(chart, name) => {
  const div = document.querySelector(`[data-chart="${chart}"]`);
  const trace = div && div.data ? div.data.find((t) => t.name === name) : null;
  return trace ? Array.from(trace.x) : [];
}"""


def points(page: Any, chart: str, name: str) -> list[int]:
    return page.evaluate(f"([chart, name]) => ({TRACE_X})(chart, name)", [chart, name])


def wait_for_points(page: Any, chart: str, name: str, least: int, timeout: float = 30_000) -> None:
    page.wait_for_function(f"([chart, name, least]) => ({TRACE_X})(chart, name).length >= least",
                           arg=[chart, name, least], timeout=timeout)


# The words of an element's text that the layout split over two lines (a hyphen may end a line).
WORDS_SPLIT = """(selector) => {
  const node = document.querySelector(selector).firstChild;
  const split = [];
  for (const match of node.textContent.matchAll(/[^\\s-]+/g)) {
    const range = document.createRange();
    range.setStart(node, match.index);
    range.setEnd(node, match.index + match[0].length);
    const lines = new Set(Array.from(range.getClientRects(), (rect) => Math.round(rect.top)));
    if (lines.size > 1) split.push(match[0]);
  }
  return split;
}"""


def codes(stack: Any) -> dict[str, dict[str, str]]:
    """What the service says each code means (``GET /v1/codes``)."""
    return stack.client("alpha").http.get("/v1/codes").json()


def row_of(page: Any, job_id: int) -> Any:
    return page.locator(f'[data-panel=jobs] tr[data-job-id="{job_id}"]')


def wait_finished(stack: Any, job_id: int) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job = stack.client("alpha").job(job_id)
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(finished, 60, f"job {job_id} to finish", interval=0.2,
                      details=lambda: str(stack.client("alpha").job(job_id)))


def test_a_key_is_needed_and_logging_out_forgets_it(browser_page, keyed_stack, screenshots) -> None:
    page = browser_page
    page.goto("/")
    page.wait_for_selector("input[name=key]")  # no key yet: the login page, without an error
    assert page.locator(".notice.error:visible").count() == 0

    log_in(page, "grpo_" + "x" * 43)  # well formed, but no such key
    page.wait_for_selector(".notice.error:has-text('invalid API key')")
    screenshots(page, "login-refused")

    log_in_as(page, keyed_stack, "alpha")
    assert page.evaluate("sessionStorage.length") == 1
    page.click("#who button:has-text('Log out')")
    page.wait_for_selector(".notice:has-text('Logged out')")
    assert page.evaluate("sessionStorage.length") == 0
    page.goto("/#/jobs")
    page.wait_for_selector("input[name=key]")


def test_the_form_lists_every_invalid_field_the_service_names(browser_page, keyed_stack, tiny_spec) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    assert "Not valid JSON" in submit_from_form(page, '{"name": "unclosed"').inner_text()
    submit_from_form(page, "name: yaml-without-the-rest\n")  # YAML: the service names what is missing
    params = page.locator(".field-errors li").evaluate_all("items => items.map((li) => li.dataset.param)")
    assert {"model", "dataset", "rewards"} <= set(params)
    bad = tiny_spec("bad", grpo={"num_generations": 1, "max_steps": 0})
    submit_from_form(page, bad)
    params = page.locator(".field-errors li").evaluate_all("items => items.map((li) => li.dataset.param)")
    assert {"grpo.num_generations", "grpo.max_steps"} <= set(params)


def test_the_forms_reward_picker_offers_every_catalog_reward_with_its_args(browser_page, keyed_stack) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    page.goto("/#/jobs")
    page.locator("[data-panel=submit] > summary").click()
    names = reward_catalog()  # what the stack serves: the same registry
    page.wait_for_selector("select[name=reward] option[value=reward_model]", state="attached")
    offered = page.locator("select[name=reward] option").evaluate_all("os => os.map((o) => o.value)")
    assert offered == [reward["name"] for reward in names]
    page.select_option("select[name=reward]", "reward_model")
    page.wait_for_selector(".reward-args li[data-arg=logit_index]")
    assert "sequence-classification" in page.locator(".reward-about").inner_text()
    page.click(".reward-picker button:has-text('Add reward to the spec')")
    spec = json.loads(page.input_value("textarea[name=spec]"))
    assert spec["rewards"][-1] == {"name": "reward_model", "weight": 1.0, "args": {"model": ""}}


def test_a_job_from_the_form_is_charted_live_with_its_samples(browser_page, keyed_stack, tiny_spec,
                                                              screenshots) -> None:
    page = browser_page
    steps = 120
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    log_in_as(page, keyed_stack, "alpha")
    job_id = submitted_job_id(page, tiny_spec("charted", max_steps=steps, checkpoint_every=40,
                                              log_completions_every=5))
    page.click(f".submit-result a[href='#/jobs/{job_id}']")
    page.wait_for_selector("[data-panel=job] h2:has-text('charted')")

    wait_for_points(page, "reward", "reward", 1, timeout=60_000)
    first = len(points(page, "reward", "reward"))
    assert first < steps, "the job was over before the page could watch it run"
    wait_for_points(page, "reward", "reward", first + 1)
    screenshots(page, "job-running")

    page.wait_for_selector("[data-panel=job] [data-status=succeeded]", timeout=90_000)
    wait_for_points(page, "reward", "reward", steps)
    assert points(page, "reward", "reward") == list(range(1, steps + 1))  # REST history + stream, each once
    for chart, trace in (("kl", "kl"), ("clip", "region_mean"), ("length", "mean_length"),
                         ("rewards", "contains"), ("tokens_per_second", "tokens_per_second")):
        assert len(points(page, chart, trace)) == steps, chart
    ticks = page.locator('[data-chart="reward"] .xtick text').all_text_contents()  # respaced as the run grew
    assert 3 <= len(ticks) <= 8 and all(tick.isdigit() for tick in ticks), ticks

    samples = page.locator("[data-panel=samples] tbody tr")
    assert samples.count() > 0 and "No samples" not in samples.first.inner_text()
    picker = page.locator("select[data-picker=samples]")
    picker.select_option(f"{5}")
    assert page.locator("[data-panel=samples] th", has_text="advantage").count() == 1
    assert samples.count() > 0 and "No samples" not in samples.first.inner_text()
    assert page.locator("[data-panel=events] li[data-type=checkpoint]").count() >= 1
    page.wait_for_selector(f"[data-panel=checkpoints] td:text-is('{steps}')")
    screenshots(page, "job-succeeded")
    # The stream was opened with a ticket: the key is in no socket URL and in none of the logs.
    key = keyed_stack.keys["alpha"]
    assert sockets and not [url for url in sockets if key in url]
    assert not [log for log in keyed_stack.root.rglob("*.log") if key in log.read_text(errors="replace")]

    # The trained model comes back out: the final one and a kept checkpoint, as tars.
    buttons = {"[data-panel=job] button[data-action=download]": f"job-{job_id}-model.tar",
               f"[data-panel=checkpoints] button[data-step='{steps}']": f"job-{job_id}-step-{steps}.tar"}
    for button, name in buttons.items():
        with page.expect_download() as started:
            page.click(button)
        download = started.value
        assert download.suggested_filename == name
        with tarfile.open(download.path()) as tar:
            assert any(n.endswith("/model.safetensors") for n in tar.getnames()), tar.getnames()

    page.click("[data-panel=job] button[data-action=clone]")  # the same spec, renamed, in the form
    page.wait_for_function("() => location.hash === '#/jobs'")
    page.click(".submit-form button[type=submit]")
    # The result box says what became of the submit: an error there is the failure to report.
    result = page.wait_for_selector(".submit-result .notice")
    assert "Submitted" in result.inner_text(), result.inner_text()
    clone_id = int(result.query_selector("a").get_attribute("href").rsplit("/", 1)[1])
    result.query_selector("a").click()
    page.wait_for_selector("[data-panel=job] h2:has-text('charted-2')")
    keyed_stack.client("alpha").http.post(f"/v1/jobs/{clone_id}/cancel")  # the worker stays free


def test_the_form_shows_the_fields_the_service_took_but_ignores(browser_page, keyed_stack, tiny_spec) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    # TRL fields at their "off" values: accepted, and each said to change nothing.
    submit_from_form(page, tiny_spec("ignored-fields", grpo={"push_to_hub": False, "use_vllm": False}))
    warning = page.wait_for_selector(".submit-result .notice.warning")
    assert "Taken, but ignored" in warning.inner_text()
    items = page.locator(".spec-warnings li")
    assert items.evaluate_all("items => items.map((li) => li.dataset.param)") == ["grpo.push_to_hub",
                                                                                  "grpo.use_vllm"]
    assert all("ignored" in text for text in items.all_inner_texts())
    job_id = int(page.locator(".submit-result a").get_attribute("href").rsplit("/", 1)[1])
    keyed_stack.client("alpha").http.post(f"/v1/jobs/{job_id}/cancel")  # the worker stays free


def open_the_form_on(page: Any, stack: Any, example: str) -> list[int]:
    """Log in as alpha and open the submit form holding the example's text; the team's job ids
    before (a dry run must queue nothing)."""
    log_in_as(page, stack, "alpha")
    before = [job["id"] for job in stack.client("alpha").list_jobs()["items"]]
    page.goto("/#/jobs")
    page.locator("[data-panel=submit] > summary").click()
    page.fill("textarea[name=spec]", (EXAMPLES / example).read_text())
    return before


@needs_sandbox
def test_the_forms_rewards_are_tried_on_samples_without_a_job(browser_page, keyed_stack, screenshots) -> None:
    """The example's inline grader, pasted as YAML, scores the samples in the real sandbox; a
    broken one is refused naming its field; no job is queued either way."""
    page = browser_page
    before = open_the_form_on(page, keyed_stack, "python_grader.yaml")
    page.locator(".reward-trial summary").click()
    page.fill("textarea[name=samples]", "\n".join(json.dumps(sample) for sample in [
        {"prompt": "Is it good?", "completion": "yes indeed", "answer": "yes"},
        {"prompt": "Is it good?", "completion": "why not", "answer": "yes"},
        {"prompt": "Is it good?", "completion": "no", "columns": {"answer": "yes"}}]))
    page.click(".reward-trial button")
    scores = page.wait_for_selector(".trial-result table")
    rows = [row.split("\t") for row in scores.inner_text().splitlines()[1:]]
    assert [(row[2], row[3]) for row in rows] == [("1", "1"), ("0.5", "0.5"), ("0", "0")], rows
    screenshots(page, "reward-trial")

    page.fill("textarea[name=spec]", "rewards:\n  - {name: python, args: {source: 'def grade(:'}}\n")
    page.click(".reward-trial button")
    refused = page.wait_for_selector(".trial-result .notice.error")
    assert "rewards.0.args.source" in refused.inner_text() and "does not compile" in refused.inner_text()
    assert [job["id"] for job in keyed_stack.client("alpha").list_jobs()["items"]] == before


@needs_sandbox
def test_the_forms_environment_is_played_on_actions_without_a_job(browser_page, keyed_stack) -> None:
    """examples/environment.yaml, pasted as the form's spec, plays its game in the real sandbox on
    the typed actions; an environment that raises is refused naming its field; no job is queued."""
    page = browser_page
    before = open_the_form_on(page, keyed_stack, "environment.yaml")
    page.locator(".environment-trial summary").click()
    page.fill("textarea[name=episode-item]", '{"target": 7}')
    page.fill("textarea[name=episode-actions]", "3\n7\n9")
    page.click(".environment-trial button")
    episode = page.wait_for_selector(".environment-trial .trial-result table")
    rows = episode.inner_text().splitlines()[1:]
    assert rows[0].startswith("reset") and "Guess a digit" in rows[0], rows
    assert "0.1" in rows[1] and "No: higher." in rows[1], rows
    assert rows[2].split("\t")[2:4] == ["1", "yes"], rows
    summary = page.locator(".environment-trial .trial-result p.hint").inner_text()
    assert "Total reward 1.1" in summary and "1 action(s) unused" in summary

    page.fill("textarea[name=spec]", "environment:\n  source: |\n    class Environment:\n"
              "        def reset(self, item): return None\n"
              "        def step(self, action): raise ValueError('no')\n")
    page.click(".environment-trial button")
    refused = page.wait_for_selector(".environment-trial .trial-result .notice.error")
    assert "environment" in refused.inner_text() and "step raised ValueError: no" in refused.inner_text()
    assert [job["id"] for job in keyed_stack.client("alpha").list_jobs()["items"]] == before


# The actions of the job page's buttons, in page order.
BUTTONS = "buttons => buttons.map((button) => button.dataset.action)"


def test_the_pages_offer_what_the_service_says_applies(browser_page, keyed_stack, tiny_spec) -> None:
    """The buttons follow each job's `actions`; the status filter and the priority classes come
    from GET /v1/lifecycle: the page keeps no copy of either."""
    page = browser_page
    served = keyed_stack.client("alpha").http.get("/v1/lifecycle").json()
    keyed_stack.admin("hold", "default")  # the job waits, so a pause is at once
    try:
        job_id = keyed_stack.client("alpha").submit(tiny_spec("actions", max_steps=2))["id"]
        log_in_as(page, keyed_stack, "alpha")
        options = page.locator("select[data-filter=status] option").evaluate_all(
            "options => options.map((option) => option.value)")
        assert options == ["", "active", *served["statuses"]]
        page.goto(f"/#/jobs/{job_id}")
        panel = page.locator("[data-panel=job]")
        panel.locator("[data-status=queued]").wait_for()
        assert panel.locator(".title button").evaluate_all(BUTTONS) == ["cancel", "pause", "clone"]
        choices = panel.locator("select[data-field=priority] option").evaluate_all(
            "options => options.map((option) => option.value)")
        assert choices == served["priorities"]
        panel.locator("button[data-action=pause]").click()
        panel.locator("[data-status=paused]").wait_for()
        assert panel.locator(".title button").evaluate_all(BUTTONS) == ["cancel", "resume", "clone"]
        panel.locator("button[data-action=cancel]").click()
        panel.locator("[data-status=cancelled]").wait_for()
        assert panel.locator(".title button").evaluate_all(BUTTONS) == ["retry", "clone", "delete"]
        assert panel.locator("select[data-field=priority]").count() == 0  # a finished job's class is settled
        # Delete asks first: dismissed, nothing happens; accepted, the job is gone and the list shows.
        page.once("dialog", lambda dialog: dialog.dismiss())
        panel.locator("button[data-action=delete]").click()
        assert keyed_stack.client("alpha").http.get(f"/v1/jobs/{job_id}").status_code == 200
        page.once("dialog", lambda dialog: dialog.accept())
        panel.locator("button[data-action=delete]").click()
        page.wait_for_url("**/#/jobs")
        assert keyed_stack.client("alpha").http.get(f"/v1/jobs/{job_id}").status_code == 404
    finally:
        keyed_stack.admin("resume", "default")


def test_a_job_is_cancelled_with_its_button(browser_page, keyed_stack, tiny_spec, screenshots) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    name = '<img src=x onerror="window.hacked=1">to-cancel'  # shown as text, never parsed as HTML
    # Submitted as YAML, as a spec file reads: the service parses it.
    job_id = submitted_job_id(page, yaml.safe_dump(tiny_spec(name, max_steps=5000, checkpoint_every=1000)))
    row = row_of(page, job_id)
    assert name in row.inner_text() and row.locator("img").count() == 0
    row.locator("button[data-action=cancel]").click()
    row.locator("[data-status=cancelled], [data-status=cancelling]").wait_for()
    screenshots(page, "jobs-cancelled")
    assert page.evaluate("window.hacked") is None
    assert wait_finished(keyed_stack, job_id)["status"] == "cancelled"  # the worker is free again


def test_another_teams_job_is_nowhere_to_be_seen(browser_page, keyed_stack, tiny_spec) -> None:
    page = browser_page
    beta_job = keyed_stack.client("beta").submit(tiny_spec("beta-secret", max_steps=2))["id"]
    log_in_as(page, keyed_stack, "alpha")
    assert row_of(page, beta_job).count() == 0
    assert "beta-secret" not in page.locator("[data-panel=jobs]").inner_text()
    page.goto(f"/#/jobs/{beta_job}")
    page.wait_for_selector(f"[data-not-found='{beta_job}']")

    log_in_as(page, keyed_stack, "beta")  # a new key: nothing of alpha's stays on the page
    row_of(page, beta_job).wait_for()
    assert "charted" not in page.locator("[data-panel=jobs]").inner_text()
    keyed_stack.client("beta").http.post(f"/v1/jobs/{beta_job}/cancel")


def test_the_cluster_page_shows_the_worker_and_the_queue(browser_page, keyed_stack, tiny_spec,
                                                         screenshots) -> None:
    page = browser_page
    keyed_stack.admin("hold", "default")  # so the job below waits, with its reason
    try:
        waiting = keyed_stack.client("alpha").submit(tiny_spec("waits", max_steps=2))["id"]
        log_in_as(page, keyed_stack, "alpha")
        page.goto("/#/cluster")
        worker = page.locator("[data-panel=pools] tr[data-worker]")
        worker.first.wait_for()
        assert "cpu" in worker.first.inner_text()
        queued = page.locator(f'[data-panel=queue] tr[data-job-id="{waiting}"]')
        queued.locator("td:has-text('pool_held')").wait_for()
        assert "waits" in queued.inner_text()
        assert "alpha" in page.locator("[data-panel=teams]").inner_text()
        screenshots(page, "cluster")
    finally:
        keyed_stack.admin("resume", "default")
    keyed_stack.client("alpha").http.post(f"/v1/jobs/{waiting}/cancel")


def test_the_cluster_page_shows_each_teams_gpu_hours_after_a_job_ran(browser_page, keyed_stack, tiny_spec,
                                                                      screenshots) -> None:
    page = browser_page
    alpha = keyed_stack.client("alpha")
    ran = alpha.submit(tiny_spec("used-gpus", max_steps=2))["id"]
    assert wait_finished(keyed_stack, ran)["status"] == "succeeded"
    log_in_as(page, keyed_stack, "alpha")
    page.goto("/#/cluster")
    assert page.locator("[data-panel=usage] h2").inner_text() == "GPU-hours (last 7 days)"
    row = page.locator("[data-panel=usage] tr[data-team=alpha][data-pool=default]")
    row.wait_for()

    def page_matches_api() -> bool:  # the page refreshes every few seconds; another job may run meanwhile
        [item] = [i for i in alpha.usage(days=7)["items"] if (i["team"], i["pool"]) == ("alpha", "default")]
        seconds = row.locator("td").nth(3).inner_text()
        return item["gpu_seconds"] > 0 and seconds == str(math.floor(item["gpu_seconds"] + 0.5))  # Math.round

    wait_until(page_matches_api, 20, "the page's GPU-seconds to be the API's")
    budget = page.locator("[data-panel=budgets] tr[data-budget-team=alpha]")  # this period's, none set
    budget.wait_for()
    assert "no budget" in budget.inner_text() and "month" in budget.inner_text()
    screenshots(page, "cluster-usage")
    log_in_as(page, keyed_stack, "beta")  # a member sees its own team's GPU-hours only
    page.goto("/#/cluster")
    page.locator("[data-panel=usage] table").wait_for()
    assert page.locator("[data-panel=usage] tr[data-team=alpha]").count() == 0


def test_the_submit_form_estimates_gpu_hours_and_submits_nothing(browser_page, keyed_stack, tiny_spec,
                                                                  screenshots) -> None:
    page = browser_page
    alpha = keyed_stack.client("alpha")
    spec = tiny_spec("estimated", max_steps=30)
    before = [job["id"] for job in alpha.list_jobs()["items"]]
    log_in_as(page, keyed_stack, "alpha")
    submit_from_form(page, spec, button="button.estimate")
    note = page.wait_for_selector(".submit-result .estimate")
    assert "GPU-hours" in note.inner_text() and "Nothing was submitted" in note.inner_text()
    guess = alpha.estimate(spec)["estimate"]  # the form shows the API's dry run
    assert float(note.get_attribute("data-gpu-hours")) == pytest.approx(guess["gpu_hours"])
    assert "30 steps" in note.inner_text()
    screenshots(page, "submit-estimate")
    assert [job["id"] for job in alpha.list_jobs()["items"]] == before


def test_a_waiting_job_says_why_in_words_until_it_stops_waiting(browser_page, keyed_stack, tiny_spec,
                                                               screenshots) -> None:
    page = browser_page
    meaning = codes(keyed_stack)["pending_reasons"]["pool_held"]
    keyed_stack.admin("hold", "default")
    try:
        job_id = keyed_stack.client("alpha").submit(tiny_spec("held", max_steps=2))["id"]
        log_in_as(page, keyed_stack, "alpha")
        term = row_of(page, job_id).locator("abbr.code[data-code=pool_held]")  # the list: meaning on hover
        term.wait_for()
        assert term.get_attribute("title") == meaning
        page.goto("/#/cluster")
        queued = page.locator(f'[data-panel=queue] tr[data-job-id="{job_id}"] .explanation')
        queued.wait_for()
        assert queued.inner_text() == meaning
        recent = page.locator("[data-panel=teams] th", has_text="recent use")
        assert "(avg GPUs)" in recent.inner_text()
        assert "averaged over the past" in recent.get_attribute("title")
        page.goto(f"/#/jobs/{job_id}")
        note = page.locator("[data-panel=job] .job-note.waiting[data-reason=pool_held]")
        note.wait_for()
        assert meaning in note.inner_text()
        screenshots(page, "job-waiting")
        page.click("[data-panel=job] button[data-action=cancel]")
        page.wait_for_selector("[data-panel=job] [data-status=cancelled]")
        assert note.count() == 0 and page.locator("[data-panel=job] abbr.code").count() == 0
    finally:
        keyed_stack.admin("resume", "default")


def test_a_failure_reads_whole_across_the_page_with_what_its_code_means(browser_page, keyed_stack,
                                                                         tiny_spec, screenshots) -> None:
    page = browser_page
    # Accepted (the file exists), but its rows have no prompt column: the worker finds out.
    (keyed_stack.root / "data" / "questions.jsonl").write_text(json.dumps({"question": "2+3?"}) + "\n")
    spec = tiny_spec("fails", dataset={"source": "path:questions.jsonl"})
    job = wait_finished(keyed_stack, keyed_stack.client("alpha").submit(spec)["id"])
    assert job["status"] == "failed", job
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{job['id']}")
    note = page.locator(f"[data-panel=job] .job-note.failure[data-error-code={job['error']['code']}]")
    note.wait_for()
    screenshots(page, "job-failed")
    assert codes(keyed_stack)["error_codes"][job["error"]["code"]] in note.inner_text()
    assert note.locator(".message").inner_text() == job["error"]["message"]
    note_width, facts_width = page.evaluate("""() => [".job-note.failure", "[data-panel=job] .facts"].map(
        (selector) => document.querySelector(selector).getBoundingClientRect().width)""")
    assert note_width >= 0.95 * facts_width  # across the page, not in a fact's narrow cell
    assert page.evaluate(WORDS_SPLIT, ".job-note.failure .message") == []


def test_the_step_axis_of_a_short_run_has_whole_steps_only(browser_page, keyed_stack, tiny_spec) -> None:
    page = browser_page
    job_id = keyed_stack.client("alpha").submit(tiny_spec("three", max_steps=3))["id"]
    job = wait_finished(keyed_stack, job_id)
    assert job["status"] == "succeeded", job
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{job['id']}")
    wait_for_points(page, "reward", "reward", 3)
    for chart in ("reward", "kl", "learning_rate"):
        ticks = page.locator(f'[data-chart="{chart}"] .xtick text').all_text_contents()
        assert ticks == ["1", "2", "3"], chart


def test_the_api_reference_renders_with_nothing_from_outside(browser_page, keyed_stack) -> None:
    page = browser_page
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    page.goto("/docs")
    page.wait_for_selector(".swagger-ui .info .title:has-text('GRPO job service')")
    page.wait_for_selector(".opblock-summary-path:has-text('/v1/jobs/{job_id}/model')")
    assert fetched and all(url.startswith(keyed_stack.url) for url in fetched), fetched


# The ids of the jobs list's rows, in page order; whether it shows n rows.
ROW_IDS = "rows => rows.map((row) => Number(row.dataset.jobId))"
SHOWS_ROWS = "n => document.querySelectorAll('[data-panel=jobs] tr[data-job-id]').length === n"


def test_the_jobs_list_filters_by_tags_and_text(browser_page, keyed_stack, tiny_spec) -> None:
    """The tags and search boxes narrow the list as GET /v1/jobs?tag=&q= does, with the status
    filter; a job's tags show in its row, and clicking one lists the jobs with that tag."""
    page = browser_page
    client = keyed_stack.client("alpha")
    keyed_stack.admin("hold", "default")  # the jobs wait: nothing to run, and none ends by itself
    ids: list[int] = []
    try:
        for name, tags, description in (("filter-ui-sweep-a", ["ui-filter", "lr"], None),
                                        ("filter-other", ["ui-filter"], "Part of the UI-SWEEP"),
                                        ("filter-ui-sweep-b", ["ui-filter", "lr"], None),
                                        ("filter-plain", ["ui-filter"], None)):
            ids.append(client.submit(tiny_spec(name, max_steps=2, tags=tags, description=description))["id"])
        client.cancel(ids[0])
        log_in_as(page, keyed_stack, "alpha")
        rows = page.locator("[data-panel=jobs] tr[data-job-id]")
        page.fill("input[data-filter=tag]", "ui-filter, lr")
        page.wait_for_function(SHOWS_ROWS, arg=2)
        assert rows.evaluate_all(ROW_IDS) == [ids[2], ids[0]]
        assert row_of(page, ids[2]).locator("[data-tag]").evaluate_all(
            "tags => tags.map((tag) => tag.dataset.tag)") == ["ui-filter", "lr"]
        page.select_option("select[data-filter=status]", "active")
        page.wait_for_function(SHOWS_ROWS, arg=1)
        assert rows.evaluate_all(ROW_IDS) == [ids[2]]
        page.select_option("select[data-filter=status]", "")
        page.fill("input[data-filter=tag]", "")
        page.fill("input[data-filter=q]", "ui-sweep")  # the names of two, the description of the third
        page.wait_for_function(SHOWS_ROWS, arg=3)
        assert rows.evaluate_all(ROW_IDS) == ids[2::-1]
        page.fill("input[data-filter=q]", "")
        row_of(page, ids[1]).locator("[data-tag=ui-filter]").click()  # one tag's jobs, from a row
        page.wait_for_function("() => document.querySelector('input[data-filter=tag]').value === 'ui-filter'")
        page.wait_for_function(SHOWS_ROWS, arg=4)
        assert rows.evaluate_all(ROW_IDS) == ids[::-1]
    finally:
        for job_id in ids[1:]:
            client.cancel(job_id)
        keyed_stack.admin("resume", "default")


def test_the_pages_name_every_worker_and_device_a_job_holds(browser_page, keyed_stack, tiny_spec) -> None:
    """A job's placement as the page writes it (a job spanning workers: each after the other, in
    node-rank order), on the cluster's running list and the job's own page."""
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    written = page.evaluate("""async () => (await import("/static/format.js")).placement(
        [{worker: "w1", devices: [0, 1]}, {worker: "w2", devices: [0]}])""")
    assert written == "w1 [0, 1] + w2 [0]"
    alpha = keyed_stack.client("alpha")
    job_id = alpha.submit(tiny_spec("placed", max_steps=500))["id"]
    try:
        running = wait_until(lambda: (job := alpha.job(job_id))["status"] == "running" and job, 60,
                             f"job {job_id} to run", interval=0.2)
        [host] = running["placement"]
        shown = f"{host['worker']} [{', '.join(map(str, host['devices']))}]"
        page.goto("/#/cluster")
        row = page.locator(f'[data-panel=running] tr[data-job-id="{job_id}"]')
        row.locator("td", has_text=shown).wait_for()
        page.goto(f"/#/jobs/{job_id}")
        fact = page.locator("[data-panel=job] .facts div", has=page.locator("dt", has_text="worker"))
        fact.locator("dd", has_text=shown).wait_for()
    finally:
        alpha.http.post(f"/v1/jobs/{job_id}/cancel")
