"""Reading runs on the dashboard (issue 33 item 9), in a real browser against a real `grpo dev`
stack: every chart smoothed by the page's control (TensorBoard's debiased EMA, the raw line kept
faint behind; the weight kept for the tab), on the job page and the compare page; a lone point at
step 0 on a step axis that starts at 0; the jobs list's eval reward and duration; the samples
table's dataset columns beside the parsed answer."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboard_pages import log_in_as
from sandbox_guard import needs_sandbox
from test_dashboard import row_of
from test_dashboard_compare import wait_finished

pytestmark = pytest.mark.slow

# Each trace of a chart as [name, x, y, opacity, visible], from the Plotly div itself.
TRACES = """(chart) => {
  const div = document.querySelector(`[data-chart="${chart}"]`);
  return div && div.data ? div.data.map((t) => [t.name, Array.from(t.x), Array.from(t.y),
    t.opacity ?? 1, t.visible ?? true]) : [];
}"""
SET_SMOOTHING = """(weight) => {
  const slider = document.querySelector("input[data-smoothing]");
  slider.value = String(weight);
  slider.dispatchEvent(new Event("input"));
}"""
# Hand-made step records drawn by the page's own ChartSet (the job page's charts): the traces of
# their `kl` chart smoothed at 0.5, then at 0.
SMOOTHED = """async () => {
  const {ChartSet} = await import("/static/charts.js");
  const box = document.body.appendChild(document.createElement("div"));
  const charts = new ChartSet(box, 0.5);
  charts.add([{step: 1, kl: 1}, {step: 2, kl: 2}, {step: 3, kl: 3}]);
  charts.flush();
  await charts.drawing;
  const traces = () => box.querySelector('[data-chart="kl"]').data.map(
    (t) => [t.name, Array.from(t.y), t.opacity ?? 1, t.visible ?? true]);
  const halfway = traces();
  await charts.smoothWith(0);
  return {halfway, raw: traces()};
}"""
# The x range of a lone point at step 0, on the job page's chart and on the compare page's.
LONE = """async () => {
  const {ChartSet, plotSeries} = await import("/static/charts.js");
  const box = document.body.appendChild(document.createElement("div"));
  const charts = new ChartSet(box, 0.6);
  charts.add([{step: 0, eval_reward: 0.5}]);
  charts.flush();
  await charts.drawing;
  const compared = box.appendChild(document.createElement("div"));
  await plotSeries(compared, "eval_reward", [{name: "one", points: [[0, 0.5]]}], 0.6);
  return [box.querySelector('[data-chart="eval_reward"]')._fullLayout.xaxis.range,
          compared._fullLayout.xaxis.range];
}"""


def traces(page: Any, chart: str) -> dict[str, list]:
    return {name: rest for name, *rest in page.evaluate(TRACES, chart)}


def column(page: Any, panel: str, title: str) -> int:
    """The index of the column a panel's table heads ``title``."""
    titles = page.locator(f"[data-panel={panel}] thead th").all_inner_texts()
    assert title in titles, titles
    return titles.index(title)


@pytest.fixture(scope="module")
def runs(keyed_stack, tiny_spec) -> dict[str, dict]:
    """A job that evaluates (before training, every 2 steps, at the end) on rows with their own
    `answer` and `level` columns, and one that does not; both finished."""
    client = keyed_stack.client("alpha")
    rows = [{"prompt": f"Is {n} yes?", "answer": f"reference {n}", "level": n} for n in range(4)]
    evaluated = client.submit(tiny_spec(
        "evaluates", max_steps=6, dataset={"prompts": rows}, log_completions_every=1,
        grpo={"eval_strategy": "steps", "eval_steps": 2, "eval_on_start": True},
        eval_dataset={"prompts": [{"prompt": "Say yes.", "answer": "yes"}]}))["id"]
    plain = client.submit(tiny_spec("trains", max_steps=3))["id"]
    done = {name: wait_finished(keyed_stack, job_id) for name, job_id in (("evaluated", evaluated),
                                                                          ("plain", plain))}
    assert all(job["status"] == "succeeded" for job in done.values()), done
    return {name: client.job(job["id"]) for name, job in done.items()}


def test_the_charts_smoothing_is_tensorboards_ema_over_a_faint_raw_line(browser_page, keyed_stack) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    drawn = page.evaluate(SMOOTHED)
    # w = 0.5 over 1, 2, 3: 0.5/0.5, 1.25/0.75, 2.125/0.875 (smoothing.js's formula, by hand)
    [raw_name, raw_y, raw_opacity, raw_visible], [name, smoothed, _, _] = drawn["halfway"]
    assert (raw_name, raw_y, name) == ("kl (raw)", [1, 2, 3], "kl")
    assert smoothed == pytest.approx([1, 5 / 3, 17 / 7], abs=1e-12)
    assert raw_opacity < 0.5 and raw_visible is True
    [_, raw_y, _, raw_visible], [_, smoothed, _, _] = drawn["raw"]  # weight 0: the raw values alone
    assert smoothed == [1, 2, 3] and raw_visible is False


def test_a_lone_point_at_step_0_gets_a_step_axis_from_0(browser_page, keyed_stack) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    for x_range in page.evaluate(LONE):  # was [-1, 1]: a step -1 that never happens
        assert x_range[0] == 0 and 0 < x_range[1] <= 2, x_range


def test_the_job_pages_smoothing_control_redraws_every_chart_and_stays_for_the_tab(
        browser_page, keyed_stack, runs, chromium, screenshots) -> None:
    page = browser_page
    job = runs["evaluated"]
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{job['id']}")
    page.wait_for_function(f"() => ({TRACES})('kl').length === 2 && ({TRACES})('kl')[0][1].length === 6")
    slider = page.locator("[data-panel=charts] input[data-smoothing]")
    assert slider.input_value() == "0.6"  # TensorBoard's default
    for chart, name in (("reward", "reward"), ("kl", "kl"), ("eval_reward", "eval_reward")):
        shown = traces(page, chart)
        assert f"{name} (raw)" in shown and shown[f"{name} (raw)"][2] < 0.5, chart  # faint, behind
    speed = traces(page, "tokens_per_second")  # a measured speed: never the same at every step
    smoothed, raw = speed["tokens_per_second"][1], speed["tokens_per_second (raw)"][1]
    assert smoothed != raw and len(set(raw)) > 1
    # debiased: the first point is the first value (up to the last bit: (1-w)x/(1-w) rounds)
    assert smoothed[0] == pytest.approx(raw[0], rel=1e-12)
    screenshots(page, "job-smoothed")

    page.evaluate(SET_SMOOTHING, 0)
    page.wait_for_function(f"() => ({TRACES})('kl')[0][4] === false")
    for chart, name in (("kl", "kl"), ("length", "mean_length"), ("eval_reward", "eval_reward")):
        shown = traces(page, chart)
        assert shown[name][1] == shown[f"{name} (raw)"][1] and shown[f"{name} (raw)"][3] is False, chart

    page.evaluate(SET_SMOOTHING, 0.9)
    page.reload()
    page.wait_for_function(f"() => ({TRACES})('kl').length === 2 && ({TRACES})('kl')[0][1].length === 6")
    assert slider.input_value() == "0.9" and traces(page, "kl")["kl (raw)"][3] is True  # this tab's choice
    other = chromium.new_context(base_url=keyed_stack.url)
    try:
        fresh = other.new_page()
        log_in_as(fresh, keyed_stack, "alpha")
        fresh.goto(f"/#/jobs/{job['id']}")
        fresh_slider = fresh.locator("[data-panel=charts] input[data-smoothing]")
        assert fresh_slider.input_value() == "0.6"  # another tab's choice is not this one's
    finally:
        other.close()


def test_the_compare_page_smooths_each_jobs_line(browser_page, keyed_stack, runs, screenshots) -> None:
    page = browser_page
    ids = [runs["evaluated"]["id"], runs["plain"]["id"]]
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/compare?ids={ids[0]},{ids[1]}")
    page.wait_for_function(f"() => ({TRACES})('compare').length === 4")
    page.select_option("select[data-metric-picker]", "tokens_per_second")  # measured: it varies
    page.wait_for_function("""() => document.querySelector('[data-chart="compare"] .gtitle')
                              ?.textContent === 'tokens_per_second'""")
    names = [f"#{ids[0]} evaluates", f"#{ids[1]} trains"]
    shown = traces(page, "compare")
    assert set(shown) == {*names, *(f"{name} (raw)" for name in names)}
    assert page.locator('[data-chart="compare"] .legend .traces').count() == 2  # the raw lines stay out
    assert all(shown[name][1] != shown[f"{name} (raw)"][1] for name in names)
    screenshots(page, "compare-smoothed")
    page.evaluate(SET_SMOOTHING, 0)
    raw_hidden = "(t) => !t[0].endsWith('(raw)') || t[4] === false"
    page.wait_for_function(f"() => ({TRACES})('compare').every({raw_hidden})")
    shown = traces(page, "compare")
    assert all(shown[name][1] == shown[f"{name} (raw)"][1] for name in names)


def test_the_jobs_list_shows_eval_reward_and_duration(browser_page, keyed_stack, runs, screenshots) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    reward, duration = column(page, "jobs", "eval reward"), column(page, "jobs", "duration")
    for job in runs.values():
        cells = row_of(page, job["id"]).locator("td")
        if job["eval_reward"] is None:
            assert cells.nth(reward).inner_text() == "–"
        else:
            assert float(cells.nth(reward).inner_text()) == pytest.approx(job["eval_reward"], abs=5e-5)
        ran = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"]))
        seconds = math.floor(ran.total_seconds() + 0.5)
        assert cells.nth(duration).inner_text() == (f"{seconds}s" if seconds < 60 else f"{seconds // 60}m")
    assert runs["evaluated"]["eval_reward"] is not None and runs["plain"]["eval_reward"] is None
    screenshots(page, "jobs-eval-duration")


def test_the_samples_show_the_dataset_columns_beside_the_parsed_answer(browser_page, keyed_stack,
                                                                      runs, screenshots) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{runs['evaluated']['id']}")
    page.locator("select[data-picker=samples] option[value='6']").wait_for(state="attached")
    page.select_option("select[data-picker=samples]", "6")
    page.select_option("select[data-picker=split]", "training")
    page.wait_for_function("() => !document.querySelector('[data-panel=samples] tr[data-split=eval]')")
    parsed, answer, level = (column(page, "samples", title) for title in ("parsed answer", "answer", "level"))
    prompt = column(page, "samples", "prompt")
    rows = page.locator("[data-panel=samples] tbody tr[data-split=training]")
    assert rows.count() > 0
    for row in rows.all():
        cells = row.locator("td")
        n = int(cells.nth(prompt).inner_text().split()[1])  # "Is N yes?"
        assert (cells.nth(answer).inner_text(), cells.nth(level).inner_text()) == (f"reference {n}", str(n))
        assert cells.nth(parsed).inner_text() != f"reference {n}"  # the completion's, not the dataset's
    screenshots(page, "samples-columns")
    page.select_option("select[data-picker=split]", "eval")
    page.locator("[data-panel=samples] tbody tr[data-split=eval]").first.wait_for()
    eval_row = page.locator("[data-panel=samples] tbody tr[data-split=eval]").first.locator("td")
    assert eval_row.nth(column(page, "samples", "answer")).inner_text() == "yes"
    assert page.locator("[data-panel=samples] th", has_text="reward error").count() == 0  # no row carries one


# A hand-made sample row with a reward error, shown by the page's own SamplesView: the place a
# row's `error` takes (why a reward could not score that row, as the worker writes it).
ERRORED_ROW = """async () => {
  const {SamplesView} = await import("/static/samples.js");
  const box = document.body.appendChild(document.createElement("div"));
  box.dataset.panel = "hand-samples";
  const view = new SamplesView(box, 0);
  view.add(1, [{prompt: "p", completion: "c", answer: "c", columns: {answer: "5"}, rewards: {python: null},
                reward: null, advantage: 0, error: "ZeroDivisionError: division by zero (line 3)"},
               {prompt: "p", completion: "d", answer: "d", columns: {answer: "5"}, rewards: {python: 1},
                reward: 1, advantage: 0}]);
  const titles = Array.from(box.querySelectorAll("thead th"), (th) => th.textContent);
  const at = titles.indexOf("reward error");
  const rows = Array.from(box.querySelectorAll("tbody tr"));
  const cells = rows.map((tr) => (at < 0 ? null : tr.children[at].textContent));
  return {titles, cells};
}"""


def test_a_samples_reward_error_has_a_column_of_its_own(browser_page, keyed_stack) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    shown = page.evaluate(ERRORED_ROW)
    assert shown["titles"][:6] == ["split", "prompt", "completion", "parsed answer", "answer", "reward error"]
    assert shown["cells"] == ["ZeroDivisionError: division by zero (line 3)", "–"]


# A tools job's sample row (grpo_core's episode fields), shown by the page's own SamplesView: the
# completion cell is the conversation, the turns have a column. The rows a real tools job writes
# are checked in tests/worker/test_agent_jobs.py.
EPISODE_ROW = """async () => {
  const {SamplesView} = await import("/static/samples.js");
  const box = document.body.appendChild(document.createElement("div"));
  box.dataset.panel = "episode-samples";
  const view = new SamplesView(box, 0);
  view.add(1, [{prompt: "What is 2+3?", completion: "<tool_call>...</tool_call>5", answer: "5", columns: {},
                rewards: {contains: 1}, reward: 1, advantage: 0.5, turns: 2, tool_calls: 1, tool_errors: 0,
                messages: [
                  {role: "assistant", content: "",
                   tool_calls: [{type: "function", function: {name: "add", arguments: {a: 2, b: 3}}}]},
                  {role: "tool", name: "add", content: "5"}, {role: "assistant", content: "5"}]}]);
  const titles = Array.from(box.querySelectorAll("thead th"), (th) => th.textContent);
  const row = box.querySelector("tbody tr");
  const turns = Array.from(row.querySelectorAll(".conversation .turn"), (turn) => turn.textContent);
  return {titles, turns, count: row.children[titles.indexOf("turns")].textContent};
}"""


def test_a_tools_jobs_sample_shows_its_conversation(browser_page, keyed_stack) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    shown = page.evaluate(EPISODE_ROW)
    assert shown["turns"] == ['assistant→ add({"a":2,"b":3})', "tool add5", "assistant5"]
    assert "turns" in shown["titles"] and shown["count"] == "2"


@needs_sandbox
def test_an_environment_jobs_samples_show_its_games_turns_rewards_and_observations(browser_page,
                                                                                 keyed_stack) -> None:
    """examples/environment.yaml run by the stack's real worker (each episode's game in its own
    sandbox) for two steps; the job page's samples show each episode as its conversation: every
    guess with the reward the game gave it, the game's answers as user lines."""
    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "environment.yaml").read_text())
    spec.update(model={"source": "path:tiny"}, checkpoint_every=2, log_completions_every=1)
    spec["grpo"].update(max_steps=2, prompts_per_step=2, num_generations=4)
    job_id = keyed_stack.client("alpha").submit(spec)["id"]
    assert wait_finished(keyed_stack, job_id)["status"] == "succeeded"
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{job_id}")
    page.wait_for_selector("[data-panel=samples] tbody tr .conversation")
    labels = page.locator("[data-panel=samples] .conversation .turn").evaluate_all(
        "turns => turns.map((turn) => turn.firstChild.textContent)")
    assert any(label.startswith("assistant · reward") for label in labels), labels
    titles = page.locator("[data-panel=samples] thead th").all_inner_texts()
    assert "turns" in titles, titles


@needs_sandbox
def test_a_real_tools_jobs_samples_show_its_tool_calls_and_results(browser_page, keyed_stack,
                                                                  tmp_path) -> None:
    """The tiny model fitted to call its tool (tests/tool_models.py), run by the stack's worker
    with its tool in the sandbox; the job page shows the call and the tool's result."""
    from tool_models import QUESTIONS, TOOLS, save_tool_user

    save_tool_user(keyed_stack.root / "models" / "tool-user", tmp_path / "scratch")
    prompts = {"prompts": [{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS]}
    spec = {"name": "tool-calls", "model": {"source": "path:tool-user"}, "dataset": prompts,
            "tools": [{"source": TOOLS}], "rewards": [{"name": "contains", "args": {"text": "5"}}],
            "grpo": {"max_steps": 1, "num_generations": 2, "prompts_per_step": 2,
                     "max_completion_length": 120, "max_prompt_length": 768, "temperature": 0.7,
                     "gradient_checkpointing": False},
            "log_completions_every": 1}
    job_id = keyed_stack.client("alpha").submit(spec)["id"]
    assert wait_finished(keyed_stack, job_id)["status"] == "succeeded"
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{job_id}")
    page.wait_for_selector("[data-panel=samples] tbody tr .conversation")
    texts = page.locator("[data-panel=samples] .conversation .turn").all_inner_texts()
    assert any(text.startswith("tool add") and "5" in text for text in texts), texts
    assert any('add({"a":2,"b":3})' in text for text in texts), texts
