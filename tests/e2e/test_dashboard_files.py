"""The submit form's uploads, in a real browser against a real `grpo dev` stack: a JSONL dataset
picked from disk goes to ``POST /v1/files`` with its progress shown, is listed among the team's
files (and not another team's), its ``file:ID`` goes into the spec (JSON or YAML) as
``dataset.source`` and the service queues that spec; a bad row comes back named; Delete removes
the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dashboard_pages import log_in_as

from api.cli.client import ApiError

pytestmark = pytest.mark.slow

ROWS = [{"prompt": "Is it good?", "answer": "yes"}, {"prompt": "What is 2+3?", "answer": "5"},
        {"prompt": "hello world", "answer": "hi"}, {"prompt": "Is the cat a dog?", "answer": "no"}]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def open_uploads(page) -> None:
    page.goto("/#/jobs")
    form = page.locator("[data-panel=submit]")
    if form.get_attribute("open") is None:
        form.locator(":scope > summary").click()
    uploads = page.locator("[data-part=uploads]")
    if uploads.get_attribute("open") is None:
        uploads.locator(":scope > summary").click()


def upload_from_page(page, path: Path):
    """Pick the file, upload it; the answer's notice once the service has answered."""
    page.set_input_files("input[name=upload-file]", str(path))
    page.click("button[data-action=upload]")
    answer = page.locator(".upload-result .notice")
    answer.wait_for()
    return answer


def test_an_uploaded_dataset_is_listed_and_goes_into_the_spec(browser_page, keyed_stack, tiny_spec,
                                                               tmp_path) -> None:
    page = browser_page
    alpha, beta = keyed_stack.client("alpha"), keyed_stack.client("beta")
    data = jsonl(tmp_path / "yes-rows.jsonl", ROWS * 50)
    log_in_as(page, keyed_stack, "alpha")
    open_uploads(page)
    page.set_input_files("input[name=upload-file]", str(data))
    assert page.input_value("select[name=purpose]") == "dataset"  # guessed from the name
    answer = upload_from_page(page, data)
    file_id = answer.get_attribute("data-file-id")
    assert file_id and file_id.startswith("file-"), answer.text_content()
    assert page.locator(".upload-sent").text_content() == "checked and stored"
    assert page.evaluate("document.querySelector('.upload-progress').value") == 1

    stored = alpha.file(file_id)
    assert stored["filename"] == "yes-rows.jsonl" and stored["bytes"] == data.stat().st_size
    assert stored["purpose"] == "dataset" and stored["status"] == "ready"
    assert file_id not in {item["id"] for item in beta.list_files()}  # another team's: not listed
    row = page.locator(f".file-list tr[data-file-id='{file_id}']")
    row.wait_for()
    assert "yes-rows.jsonl" in row.text_content() and "ready" in row.text_content()

    # JSON spec: the inline prompts give way to the uploaded rows, the rest stays.
    spec = tiny_spec("from-upload", max_steps=2)
    page.fill("textarea[name=spec]", json.dumps(spec, indent=2))
    answer.locator("button[data-action=use]").click()
    assert f"dataset.source is now file:{file_id}" in page.locator(".upload-result").text_content()
    edited = json.loads(page.input_value("textarea[name=spec]"))
    assert edited["dataset"] == {"source": f"file:{file_id}"}
    assert {**edited, "dataset": spec["dataset"]} == spec

    # YAML spec, from the list's button this time: the same edit, the text stays YAML.
    page.fill("textarea[name=spec]", yaml.safe_dump(spec, sort_keys=False))
    row.locator("button[data-action=use]").click()
    text = page.input_value("textarea[name=spec]")
    assert not text.lstrip().startswith("{")
    assert yaml.safe_load(text) == edited

    keyed_stack.admin("hold", "default")  # only the accepted spec is looked at; nothing trains
    try:
        page.click(".submit-form button[type=submit]")
        link = page.wait_for_selector(".submit-result .notice a")
        job_id = int(link.get_attribute("href").rsplit("/", 1)[1])
        assert alpha.job(job_id)["spec"]["dataset"]["source"] == f"file:{file_id}"
        alpha.cancel(job_id)
    finally:
        keyed_stack.admin("resume", "default")


def test_a_bad_row_is_named_and_nothing_is_listed(browser_page, keyed_stack, tmp_path) -> None:
    page = browser_page
    alpha = keyed_stack.client("alpha")
    before = {item["id"] for item in alpha.list_files()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"question": "no prompt here"}) + "\n")
    log_in_as(page, keyed_stack, "alpha")
    open_uploads(page)
    refused = upload_from_page(page, bad)
    assert refused.get_attribute("data-status") == "422", refused.text_content()
    said = refused.text_content()
    # The service counts rows from 0: the second line is row 1.
    assert "refused the file" in said and "row 1 has no 'prompt' column" in said, said
    assert refused.locator("li[data-param=prompt_field]").count() == 1
    assert page.locator(".upload-progress").is_hidden()
    assert {item["id"] for item in alpha.list_files()} == before


def test_delete_removes_the_file_after_a_confirm(browser_page, keyed_stack, tmp_path) -> None:
    page = browser_page
    alpha = keyed_stack.client("alpha")
    file_id = alpha.upload_file(jsonl(tmp_path / "gone.jsonl", ROWS), "dataset", "gone.jsonl")["id"]
    log_in_as(page, keyed_stack, "alpha")
    open_uploads(page)
    row = page.locator(f".file-list tr[data-file-id='{file_id}']")
    page.once("dialog", lambda dialog: dialog.dismiss())
    row.locator("button[data-action=delete]").click()
    assert alpha.file(file_id)["id"] == file_id  # dismissed: kept
    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button[data-action=delete]").click()
    row.wait_for(state="detached")
    with pytest.raises(ApiError) as gone:
        alpha.file(file_id)
    assert gone.value.status == 404
