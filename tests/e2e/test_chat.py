"""Chat with a job's model through OpenAI's own client, against the real service (``grpo dev``:
API, scheduler, a Celery worker with one CPU slot, SQLite, Redis): a tiny job trains, then its
``fine_tuned_model`` answers ``chat.completions.create`` plain and streamed and
``completions.create``, from ONE serving job that two concurrent requests share, which the team
is charged for (``/v1/usage``) and which ends ``succeeded`` once idle for the team's
``serve_idle_seconds``. Another team gets a 404, a bad field a 422 naming it. Then a high job of
another team takes the only slot from a serving job: the requests in flight end with a retryable
error (503), not a hang, and the serving job waits in the queue (``preempted``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import Any

import httpx
import openai
import pytest
from dashboard_pages import log_in_as

from api.domain.lifecycle import TERMINAL_STATUSES

pytestmark = pytest.mark.slow
IDLE_SECONDS = 4
ANSWER_TIMEOUT = 60


def _openai(stack, team: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys[team], max_retries=0,
                         http_client=openai.DefaultHttpxClient(trust_env=False, timeout=ANSWER_TIMEOUT))


def _ours(stack, team: str) -> httpx.Client:
    return httpx.Client(base_url=stack.url, trust_env=False, timeout=30,
                        headers={"Authorization": f"Bearer {stack.keys[team]}"})


def _wait(read, done, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}; last: {value}"
        time.sleep(interval)


def _serving_jobs(ours: httpx.Client, model_job: int) -> list[dict[str, Any]]:
    jobs = ours.get("/v1/jobs", params={"limit": 100}).json()["items"]
    return [job for job in jobs if job["kind"] == "serve" and job["name"] == f"serve-job-{model_job}"]


def _gpu_seconds(ours: httpx.Client) -> float:
    return sum(item["gpu_seconds"] for item in ours.get("/v1/usage").json()["items"])


def _grpo_chat(stack, team: str, *args: str, lines: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli.main", "chat", *args, "--api-url", stack.url,
                           "--api-key", stack.keys[team]], input=lines, capture_output=True, text=True,
                          timeout=ANSWER_TIMEOUT, cwd=stack.root, env=stack.env)


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


@pytest.fixture(scope="module")
def trained(keyed_stack, tiny_spec) -> dict[str, Any]:
    """A tiny job of team alpha that trained to its end, with alpha's serving jobs unloading after
    IDLE_SECONDS without a request; its OpenAI view (``fine_tuned_model``)."""
    keyed_stack.admin("set-team-limits", "alpha", "--serve-idle-seconds", str(IDLE_SECONDS))
    with _ours(keyed_stack, "alpha") as ours:
        submitted = ours.post("/v1/jobs", json=tiny_spec("to-chat-with", max_steps=2))
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        done = _wait(lambda: ours.get(f"/v1/jobs/{job_id}").json(),
                     lambda j: j["status"] in TERMINAL_STATUSES, 180, "the job to train")
    assert done["status"] == "succeeded", done["error"]
    return {"id": job_id, "model": _openai(keyed_stack, "alpha").fine_tuning.jobs.retrieve(
        f"ftjob-{job_id}").fine_tuned_model}


def test_chat_plain_streamed_and_completions_from_one_serving_job(keyed_stack, trained) -> None:
    client, model = _openai(keyed_stack, "alpha"), trained["model"]
    assert model == f"job:{trained['id']}"
    with _ours(keyed_stack, "alpha") as ours:
        used_before = _gpu_seconds(ours)

        answer = client.chat.completions.create(model=model, max_tokens=12, seed=3,
                                                messages=[{"role": "user", "content": "What is 2+3?"}])
        assert answer.object == "chat.completion" and answer.model == model
        [choice] = answer.choices
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")
        assert answer.usage.prompt_tokens > 0 and 0 < answer.usage.completion_tokens <= 12
        assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens

        # The same seed, streamed: the same text, in chunks, then [DONE] (the client stops there).
        chunks = list(client.chat.completions.create(
            model=model, max_tokens=12, seed=3, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "What is 2+3?"}]))
        assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == choice.message.content
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
        assert chunks[-1].usage.completion_tokens == answer.usage.completion_tokens

        completion = client.completions.create(model=model, prompt="What is 2+3? The answer is", max_tokens=5)
        assert completion.object == "text_completion" and completion.usage.completion_tokens <= 5
        streamed = list(client.completions.create(model=model, prompt="hello", max_tokens=5, stream=True))
        assert streamed and all(chunk.object == "text_completion" for chunk in streamed)

        # Two at once: batched on the one loaded model, by one serving job.
        answers: list[Any] = []

        def ask(content: str) -> None:
            answers.append(client.chat.completions.create(model=model, max_tokens=8,
                                                          messages=[{"role": "user", "content": content}]))

        asking = [threading.Thread(target=ask, args=(f"hello {n}",)) for n in range(2)]
        for thread in asking:
            thread.start()
        for thread in asking:
            thread.join(ANSWER_TIMEOUT)
        assert len(answers) == 2 and {a.system_fingerprint for a in answers} == {answer.system_fingerprint}
        [serving] = _serving_jobs(ours, trained["id"])
        assert serving["status"] == "running" and serving["priority"] == "low" and serving["gpus"] == 1
        assert answer.system_fingerprint == f"job-{serving['id']}"
        assert "retry" not in serving["actions"] and "clone" not in serving["actions"]

        # `grpo chat`: a conversation from stdin lines, each answer streamed to stdout.
        talked = _grpo_chat(keyed_stack, "alpha", str(trained["id"]), "--system", "Be brief.",
                            "--max-tokens", "6", lines="What is 2+3?\nAnd 3+4?\n")
        assert talked.returncode == 0 and "error" not in talked.stderr, talked.stderr
        assert len(_serving_jobs(ours, trained["id"])) == 1

        # Idle for the team's serve_idle_seconds: it unloads and ends, its GPU time charged to the team.
        ended = _wait(lambda: ours.get(f"/v1/jobs/{serving['id']}").json(),
                      lambda j: j["status"] in TERMINAL_STATUSES, IDLE_SECONDS + 60,
                      "the serving job to unload")
        assert ended["status"] == "succeeded", ended["error"]
        assert ended["spec"]["serve"] == {"model": model, "idle_seconds": IDLE_SECONDS,
                                          "max_batch": ended["spec"]["serve"]["max_batch"]}
        held = _seconds(ended["dispatched_at"], ended["finished_at"])
        assert _gpu_seconds(ours) - used_before >= held - 1.0
        events = [e["type"] for e in ours.get(f"/v1/jobs/{serving['id']}/events").json()["items"]]
        assert "serving" in events and "served" in events
        # Nothing to retry, clone or download on a serving job.
        assert ours.post(f"/v1/jobs/{serving['id']}/retry").status_code == 409
        assert ours.post(f"/v1/jobs/{serving['id']}/clone").status_code == 409
        assert ours.get(f"/v1/jobs/{serving['id']}/model").status_code == 404

        # A checkpoint is another model, served by a serving job of its own.
        step = ours.get(f"/v1/jobs/{trained['id']}/checkpoints").json()["items"][-1]["step"]
        talked = _grpo_chat(keyed_stack, "alpha", "--model", f"{model}@{step}", "--json", lines="hello\n")
        assert talked.returncode == 0, talked.stderr
        assert json.loads(talked.stdout)["model"] == f"{model}@{step}"
        assert [job["status"] for job in _serving_jobs(ours, trained["id"])] == ["succeeded"]
        [checkpoint] = [job for job in ours.get("/v1/jobs", params={"limit": 100}).json()["items"]
                        if job["name"] == f"serve-job-{trained['id']}-step-{step}"]
        # Cancelled while it serves: its model unloads at once.
        cancel = ours.post(f"/v1/jobs/{checkpoint['id']}/cancel").json()
        assert cancel["status"] in ("cancelling", "cancelled")
        _wait(lambda: ours.get(f"/v1/jobs/{checkpoint['id']}").json()["status"], lambda s: s == "cancelled",
              30, "the checkpoint's serving job to stop")


def test_the_dashboard_shows_a_serving_job(browser_page, keyed_stack, trained) -> None:
    with _ours(keyed_stack, "alpha") as ours:
        [serving, *_] = _serving_jobs(ours, trained["id"])  # the earlier test's, ended by now
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{serving['id']}")
    page.wait_for_selector(f".facts dd:has-text('{trained['model']}')")  # what it serves, not steps
    page.wait_for_selector("details[data-panel=spec]")
    assert page.locator("[data-panel=job] button:has-text('Clone')").count() == 0
    page.goto("/#/jobs")
    page.wait_for_selector(f"tr[data-job-id='{serving['id']}'] td:has-text('serving')")


def test_the_job_page_chats_with_its_model_as_the_answer_streams(browser_page, keyed_stack, trained) -> None:
    page = browser_page
    log_in_as(page, keyed_stack, "alpha")
    page.goto(f"/#/jobs/{trained['id']}")
    panel = page.wait_for_selector("[data-panel=playground]")
    assert panel.query_selector("input[name=playground-model]").input_value() == trained["model"]
    page.fill("textarea[name=playground-input]", "What is 2+3?")
    page.click("[data-panel=playground] button:has-text('Send')")
    page.wait_for_selector(".playground-log .message[data-role=user]:has-text('What is 2+3?')")
    # Answered by a serving job started for it: the first answer waits for the model to load.
    page.wait_for_function(
        "() => { const done = document.querySelector('[data-panel=playground] [role=status]');"
        " const answer = document.querySelector('.playground-log .message[data-role=assistant] .content');"
        " return answer && answer.textContent.length > 0 && done.textContent === ''; }",
        timeout=ANSWER_TIMEOUT * 1000)
    assert page.locator(".playground-log .message.failed").count() == 0
    with _ours(keyed_stack, "alpha") as ours:
        # Left alone, it unloads (the next tests want the one slot free).
        _wait(lambda: _serving_jobs(ours, trained["id"]),
              lambda jobs: all(job["status"] in TERMINAL_STATUSES for job in jobs), IDLE_SECONDS + 60,
              "the playground's serving job to unload")


def test_team_boundaries_and_bad_fields(keyed_stack, trained) -> None:
    beta = _openai(keyed_stack, "beta")
    with pytest.raises(openai.NotFoundError) as other_team:
        beta.chat.completions.create(model=trained["model"], messages=[{"role": "user", "content": "hi"}])
    assert other_team.value.body["param"] == "model"
    alpha = _openai(keyed_stack, "alpha")
    for changes, param in (({"n": 2}, "n"), ({"temperature": 3}, "temperature"),
                           ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                           ({"model": "path:tiny"}, "model"),
                           ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role")):
        body = {"model": trained["model"], "messages": [{"role": "user", "content": "hi"}], **changes}
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            alpha.chat.completions.create(**body)
        assert refused.value.body["param"] == param, refused.value.body
    with pytest.raises(openai.NotFoundError):
        alpha.chat.completions.create(model="job:999999", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.ConflictError) as no_step:
        alpha.chat.completions.create(model=f"{trained['model']}@77",
                                      messages=[{"role": "user", "content": "x"}])
    assert "step 77" in no_step.value.body["message"]
    refused = _grpo_chat(keyed_stack, "beta", str(trained["id"]), lines="hi\n")
    assert refused.returncode == 2 and "not found" in refused.stderr
    assert _grpo_chat(keyed_stack, "alpha", lines="hi\n").returncode == 2  # no job, no --model


def test_a_high_job_of_another_team_takes_the_slot_and_the_requests_in_flight_get_503(
        keyed_stack, trained, tiny_spec) -> None:
    keyed_stack.admin("set-team-limits", "beta", "--max-priority", "high")
    client, model = _openai(keyed_stack, "alpha"), trained["model"]
    client.chat.completions.create(model=model, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    with _ours(keyed_stack, "alpha") as ours:
        [serving] = [job for job in _serving_jobs(ours, trained["id"]) if job["status"] == "running"]

    # More long answers than one batch holds (greedy to the model's positions): some generate, the
    # rest wait in the serving job's queue when the preemption comes.
    outcomes: list[Any] = []

    def ask(number: int) -> None:
        try:
            answer = client.chat.completions.create(model=model, max_tokens=1000, temperature=0,
                                                    messages=[{"role": "user", "content": f"count {number}"}])
            outcomes.append(answer.choices[0].finish_reason)
        except openai.APIStatusError as exc:
            outcomes.append((exc.status_code, exc.body["code"], exc.response.headers.get("retry-after")))

    asking = [threading.Thread(target=ask, args=(n,)) for n in range(12)]
    for thread in asking:
        thread.start()
    time.sleep(1.0)
    with _ours(keyed_stack, "beta") as beta:
        urgent = beta.post("/v1/jobs", json=tiny_spec("urgent", max_steps=1, priority="high"))
        assert urgent.status_code == 201, urgent.text
        started = time.monotonic()
        for thread in asking:
            thread.join(ANSWER_TIMEOUT)
        assert not any(thread.is_alive() for thread in asking), "a request in flight hangs"
        assert time.monotonic() - started < 30
        refused = [outcome for outcome in outcomes if isinstance(outcome, tuple)]
        assert refused and all(o[:2] == (503, "unavailable") and int(o[2]) > 0 for o in refused), outcomes

        # The slot is the urgent job's now.
        _wait(lambda: beta.get(f"/v1/jobs/{urgent.json()['id']}").json(),
              lambda j: j["status"] in ("running", "succeeded"), 60, "the urgent job to run")
    with _ours(keyed_stack, "alpha") as ours:
        events = [e["type"] for e in ours.get(f"/v1/jobs/{serving['id']}/events").json()["items"]]
    assert events.index("preempt_requested") < events.index("preempted")
