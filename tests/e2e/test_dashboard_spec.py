"""The spec where dashboard users look, in a real browser against a real `grpo dev` stack: the
job page shows the stored spec as YAML (folded away) that reads back as the API's spec, the
page's YAML writer round-trips awkward data through PyYAML, and Clone opens the submit form
filled with the spec to edit, queueing nothing until its Submit."""

from __future__ import annotations

import json
import random

import pytest
import yaml
from dashboard_pages import log_in_as

pytestmark = pytest.mark.slow

# Strings a careless writer gets wrong: YAML booleans and nulls, numbers, comments, indicators,
# document markers, line breaks YAML folds, characters it refuses in a document.
AWKWARD = ["yes", "No", "off", "null", "~", "", " ", " lead", "trail ", "1.5", "2e-6", "1_000", "0x1F",
           "1:20", "2024-01-01", ".inf", "- a", "a: b", "a:b", "path:tiny", "#x", "a #b", "---", "...", "<<",
           "=", "&a", "*a", "!t", "|", ">", "@", "`", "%", "'q'", '"q"', "a\\b", "tab\there",
           "\u00e9t\u00e9 \U0001F600", "x\n", "x\n\n", "\nx", "line one\n  two: yes\n", "a\n---\nb",
           "a\n...\n", "a \nb ", "cr\r\nlf", "nel\u0085ls\u2028ps\u2029", "bom\ufeff", "del\x7f", "nul\x00",
           "a\n   ", "a\n\n\nb\n\n"]
NUMBERS = [0, -1, 7, 3e-3, 2e-6, 1e-7, 1.5e-7, 1e21, -2.5e30, 0.1, 123456789, 1.7976931348623157e308, 5e-324]


def awkward_data(rng: random.Random, depth: int = 0):
    kind = rng.random()
    if depth > 3 or kind < 0.5:
        return rng.choice([*AWKWARD, *NUMBERS, True, False, None])
    if kind < 0.75:
        return {rng.choice(AWKWARD): awkward_data(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [awkward_data(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def test_the_yaml_writer_reads_back_as_the_data_it_was_given(browser_page, keyed_stack) -> None:
    page = browser_page
    page.goto("/#/login")
    rng = random.Random(7)
    documents = [awkward_data(rng) for _ in range(400)] + AWKWARD + [[text] for text in AWKWARD] + [
        {"k": [text, {"j": text}]} for text in AWKWARD] + NUMBERS + [{}, [], {"a": {}, "b": [[], [[1]]]}]
    texts = page.evaluate("""async (documents) => {
      const {yamlText} = await import("/static/yaml_text.js");
      return documents.map((document) => yamlText(document));
    }""", documents)
    for document, text in zip(documents, texts, strict=True):
        # Through JSON, as the page gets the data: a float with no fraction (1.0) is 1 there.
        assert yaml.safe_load(text) == json.loads(json.dumps(document)), text


def test_the_job_page_shows_the_stored_spec_as_yaml(browser_page, keyed_stack, tiny_spec) -> None:
    page = browser_page
    alpha = keyed_stack.client("alpha")
    keyed_stack.admin("hold", "default")  # the jobs wait: only their specs are looked at
    try:
        prompts = [{"prompt": "Line one\nline two: yes\n"}, {"prompt": "yes"}, {"prompt": "  # no comment"}]
        spec = tiny_spec("yaml-shown", dataset={"prompts": prompts}, grpo={"learning_rate": 1e-7})
        job_id = alpha.submit(spec)["id"]
        log_in_as(page, keyed_stack, "alpha")
        page.goto(f"/#/jobs/{job_id}")
        panel = page.locator("[data-panel=spec]")
        panel.wait_for()
        assert panel.get_attribute("open") is None  # folded until asked for
        panel.locator(":scope > summary").click()
        text = panel.locator(".spec-yaml").text_content()
        stored = alpha.job(job_id)["spec"]
        assert yaml.safe_load(text) == stored
        assert list(yaml.safe_load(text)) == list(stored)  # the service's field order
        assert "learning_rate: 1.0e-7" in text and "- prompt: |\n" in text  # numbers and lines stay readable
    finally:
        keyed_stack.admin("resume", "default")


def test_clone_fills_the_form_and_queues_only_on_submit(browser_page, keyed_stack, tiny_spec) -> None:
    page = browser_page
    alpha = keyed_stack.client("alpha")
    job_ids = lambda: {job["id"] for job in alpha.list_jobs()["items"]}  # noqa: E731
    keyed_stack.admin("hold", "default")
    try:
        job_id = alpha.submit(tiny_spec("to-clone", max_steps=3))["id"]
        before = job_ids()
        log_in_as(page, keyed_stack, "alpha")
        page.goto(f"/#/jobs/{job_id}")
        page.click("[data-panel=job] button[data-action=clone]")
        form = page.locator("[data-panel=submit]")
        page.wait_for_function("() => location.hash === '#/jobs'")
        assert form.get_attribute("open") is not None
        filled = json.loads(page.input_value("textarea[name=spec]"))
        stored = alpha.job(job_id)["spec"]
        assert filled == {**stored, "name": "to-clone-2"}  # named as POST .../clone names it
        assert job_ids() == before  # nothing queued yet

        filled["grpo"]["max_steps"] = 2
        page.fill("textarea[name=spec]", yaml.safe_dump(filled))  # edited, here as YAML
        page.click(".submit-form button[type=submit]")
        link = page.wait_for_selector(".submit-result .notice a")
        clone_id = int(link.get_attribute("href").rsplit("/", 1)[1])
        clone = alpha.job(clone_id)
        assert clone["name"] == "to-clone-2" and clone["spec"]["grpo"]["max_steps"] == 2
        edited = {**stored, "name": "to-clone-2", "grpo": {**stored["grpo"], "max_steps": 2}}
        assert clone["spec"] == edited
        assert job_ids() == before | {clone_id}
        page.goto(f"/#/jobs/{job_id}")  # cloned again: the next number
        page.click("[data-panel=job] button[data-action=clone]")
        page.wait_for_function("() => location.hash === '#/jobs'")
        assert json.loads(page.input_value("textarea[name=spec]"))["name"] == "to-clone-3"
    finally:
        keyed_stack.admin("resume", "default")
