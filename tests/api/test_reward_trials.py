"""``POST /v1/rewards/run``: a spec's rewards score hand-written samples over real HTTP without a
job — a ``python`` grader in this host's real sandbox, a registered verifier through its real
service — and a reward that would not validate, cannot run here or does not load is a 422
naming its path, with nothing queued."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from sandbox_guard import needs_sandbox
from test_jobs_api import row_counts
from verifier_server import verifier_server
from waiting import wait_until

from api.schemas.reward_trials import MAX_SAMPLES

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python_grader.yaml"

GRADER = ("def grade(sample, item):\n"
          "    if item.get('answer') is None:\n"
          "        return None\n"
          "    return 1.0 if item['answer'] in sample['output_text'] else 0.0\n")


def sample(completion: str, prompt="What is 2+2?", **columns) -> dict:
    return {"prompt": prompt, "completion": completion, "columns": columns}


def trial(client, rewards: list[dict], samples: list[dict], **fields):
    return client.post("/v1/rewards/run", json={"rewards": rewards, "samples": samples, **fields})



@needs_sandbox
def test_a_python_grader_and_builtins_score_samples_in_order_as_a_step_would(member, api_server) -> None:
    before = row_counts(api_server.settings.database_url)
    rewards = [{"name": "python", "args": {"source": GRADER}, "weight": 2.0},
               {"name": "contains", "args": {"text": "four"}, "weight": 0.5, "clip_max": 0.4}]
    samples = [sample("4, that is four", answer="4"), sample("five", answer="4"), sample("four", answer=None),
               sample("x", prompt=[{"role": "user", "content": "hi"}], answer="x")]
    response = trial(member, rewards, samples)
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["rewards"] for item in items] == [
        {"python": 1.0, "contains": 0.4}, {"python": 0.0, "contains": 0.0},
        {"python": None, "contains": 0.4}, {"python": 1.0, "contains": 0.0}]
    assert [item["reward"] for item in items] == [pytest.approx(2.2), 0.0, pytest.approx(0.2), 2.0]
    assert all(item["problems"] == {} for item in items)
    assert row_counts(api_server.settings.database_url) == before  # nothing queued


@needs_sandbox
def test_rows_a_grader_cannot_score_say_why(member) -> None:
    source = ("def grade(sample, item):\n"
              "    text = sample['output_text']\n"
              "    return 2.0 if text == 'a' else 'yes' if text == 'b' else 1 / 0\n")
    response = trial(member, [{"name": "python", "args": {"source": source}}],
                     [sample("a"), sample("b"), sample("c")])
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["reward"] for item in items] == [None, None, None]
    problems = [item["problems"]["python"] for item in items]
    assert "outside [0, 1]" in problems[0] and "not a number" in problems[1]
    assert "ZeroDivisionError" in problems[2] and "grader.py line 3" in problems[2]


@needs_sandbox
def test_a_grader_that_rewrites_its_harness_still_scores_nothing_out_of_range(member) -> None:
    # The route issue 32 found: the range check ran in the interpreter the grader controls.
    source = ("import sys\n"
              "sys.modules['__main__']._value = lambda result: {'value': result}\n"
              "def grade(sample, item):\n"
              "    return {'a': 1e308, 'b': -5, 'c': 1000}.get(sample['output_text'], 0.5)\n")
    response = trial(member, [{"name": "python", "args": {"source": source}}],
                     [sample("a"), sample("b"), sample("c"), sample("d")])
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["rewards"]["python"] for item in items] == [None, None, None, 0.5]
    assert all("outside [0, 1]" in item["problems"]["python"] for item in items[:3])


@needs_sandbox
@pytest.mark.parametrize(("reward", "param", "says"), [
    ({"name": "python", "args": {"source": "def grade(sample, item):\nreturn 1\n"}}, "rewards.0.args.source",
     "does not compile"),
    ({"name": "python", "args": {"source": "import numpy\ndef grade(s, i):\n    return 1.0\n"}},
     "rewards.0.args.source", "line 1 imports 'numpy'"),  # refused before it runs
    ({"name": "python", "args": {"source": "np = __import__('numpy')\ndef grade(s, i):\n    return 1.0\n"}},
     "rewards.0", "does not load"),  # a name built at run time: only the sandbox finds it missing
    ({"name": "python", "args": {"source": GRADER, "requirements": ["requests"]}},
     "rewards.0.args.requirements", "standard library only"),
    ({"name": "reward_model", "args": {"model": "path:some-rm"}}, "rewards.0.args.model",
     "without loading models"),
    ({"name": "no_such_reward"}, "rewards.0.name", "no_such_reward"),
    ({"name": "exact_match", "args": {"field": "solution"}}, "rewards.0.args", "column 'solution'"),
    ({"name": "http_verifier", "args": {"verifier": "nobody-registered-this"}}, "rewards.0.args.verifier",
     "no verifier"),
])
def test_a_reward_that_would_fail_a_job_is_a_422_naming_its_path(member, reward, param, says) -> None:
    response = trial(member, [reward], [sample("4", answer="4")])
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_spec" and error["param"] == param, error
    assert says in error["message"]


def test_the_request_is_bounded(member) -> None:
    contains = [{"name": "contains", "args": {"text": "4"}}]
    too_many = trial(member, contains, [sample("4")] * (MAX_SAMPLES + 1))
    assert too_many.status_code == 422 and too_many.json()["error"]["param"].startswith("samples")
    too_slow = trial(member, contains, [sample("4")], reward_timeout_seconds=31)
    assert too_slow.status_code == 422 and too_slow.json()["error"]["param"] == "reward_timeout_seconds"


def test_a_registered_verifier_scores_the_samples_through_its_service(member, client_for, team_keys) -> None:
    name = f"trial-{uuid.uuid4().hex[:8]}"
    with verifier_server() as server:
        admin = client_for(team_keys.admin)
        registered = admin.put(f"/v1/admin/verifiers/{name}", json={"team": "alpha", "url": server.url})
        assert registered.status_code == 200, registered.text
        try:
            reward = {"name": "http_verifier", "args": {"verifier": name, "columns": ["answer"]}}
            response = trial(member, [reward], [sample("it is 4", answer="4"), sample("it is 5", answer="4")])
            assert response.status_code == 200, response.text
            assert [item["reward"] for item in response.json()["items"]] == [1.0, 0.0]
            sent = [item["completion"] for seen in server.seen for item in seen.items]
            assert sent == ["it is 4", "it is 5"]
            # Another team cannot reach a verifier registered for this one.
            other = trial(client_for(team_keys.beta), [{"name": "http_verifier", "args": {"verifier": name}}],
                          [sample("4")])
            assert other.status_code == 422 and other.json()["error"]["param"] == "rewards.0.args.verifier"
        finally:
            admin.delete(f"/v1/admin/verifiers/{name}")


@needs_sandbox
def test_a_slow_grader_does_not_hold_the_event_loop(member, client_for, team_keys) -> None:
    slow = "import time\ndef grade(sample, item):\n    time.sleep(1.5)\n    return 1.0\n"
    answers: list = []
    running = threading.Thread(target=lambda: answers.append(trial(
        member, [{"name": "python", "args": {"source": slow}}], [sample("a"), sample("b")])))
    running.start()
    try:
        other = client_for(team_keys.beta)
        for _ in range(3):  # answered while the dry run is still scoring
            assert other.get("/v1/rewards").status_code == 200
        assert running.is_alive()
    finally:
        running.join(30)
    assert answers[0].status_code == 200 and [i["reward"] for i in answers[0].json()["items"]] == [1.0, 1.0]


@needs_sandbox
def test_a_team_at_its_share_is_told_to_retry_and_another_teams_dry_run_starts_at_once(
        member, client_for, team_keys, api_server, serve_api) -> None:
    # Team A floods the dry runs with a grader that sleeps; its share (GRPO_REWARD_TRIAL_SLOTS_PER_TEAM,
    # 1) runs, the rest are 429s at once, and team B's trivial dry run is answered while A's runs.
    slow = "import time\ndef grade(sample, item):\n    time.sleep(5)\n    return 1.0\n"
    answered: list = []
    patient = httpx.Client(base_url=member.base_url, headers=member.headers, timeout=60, trust_env=False)
    rewards = [{"name": "python", "args": {"source": slow}}]
    flood = [threading.Thread(target=lambda: answered.append(trial(patient, rewards, [sample("a")] * 3,
                                                                   reward_timeout_seconds=30)))
             for _ in range(3)]
    for thread in flood:
        thread.start()
    try:
        wait_until(lambda: len(answered) >= 2, 60, "two of team A's dry runs to be answered")
        refused = [response for response in answered if response.status_code == 429]
        assert len(refused) == 2, [response.text for response in answered]
        assert all(int(response.headers["Retry-After"]) > 0 for response in refused)
        assert refused[0].json()["error"]["code"] == "rate_limited"
        contains = [{"name": "contains", "args": {"text": "4"}}]
        other = trial(client_for(team_keys.beta), contains, [sample("4")])
        assert other.status_code == 200 and other.json()["items"][0]["reward"] == 1.0
        # The share is the team's across API processes: another app (its own slots) refuses too.
        with serve_api(api_server.settings) as second, \
                httpx.Client(base_url=second.http_url, headers=member.headers, trust_env=False) as there:
            elsewhere = trial(there, contains, [sample("4")])
        assert elsewhere.status_code == 429, elsewhere.text
        assert len(answered) == 2  # team A's running dry run had not been answered yet
    finally:
        for thread in flood:
            thread.join(60)
        patient.close()
    [ran] = [response for response in answered if response.status_code != 429]
    assert ran.status_code == 200 and [item["reward"] for item in ran.json()["items"]] == [1.0] * 3
    # Its slot is given back: the team's next dry run runs.
    again = trial(member, [{"name": "contains", "args": {"text": "4"}}], [sample("4")])
    assert again.status_code == 200, again.text


@needs_sandbox
def test_grpo_rewards_run_tries_the_example_spec_on_a_samples_file(capsys, tmp_path, api_server,
                                                                   team_keys) -> None:
    from api.cli.main import main

    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(row) for row in [
        {"prompt": "Is it good?", "completion": "yes, it is", "answer": "yes"},
        {"prompt": "Is it good?", "completion": "nope", "answer": "yes"},
        {"prompt": "Is it good?", "completion": "why", "columns": {"answer": "yes"}}]))
    target = ["--api-url", api_server.http_url, "--api-key", team_keys.alpha]
    capsys.readouterr()
    assert main(["rewards", "run", str(EXAMPLE), "--samples", str(samples), *target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["reward=1", "reward=0", "reward=0.5"]
    assert main(["rewards", "run", str(EXAMPLE), "--samples", str(samples), "--json", *target]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [item["rewards"]["python"] for item in answer["items"]] == [1.0, 0.0, 0.5]

    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"rewards": [{"name": "python", "args": {"source": "def grade(:\n"}}]}))
    assert main(["rewards", "run", str(broken), "--samples", str(samples), *target]) == 2
    assert "rewards.0.args.source" in capsys.readouterr().err
    assert main(["rewards", "run", str(EXAMPLE), "--samples", str(tmp_path / "none.jsonl"), *target]) == 2
    assert "--samples: cannot read" in capsys.readouterr().err


@needs_sandbox
def test_grpo_rewards_run_exits_1_when_a_reward_failed_on_any_sample(capsys, tmp_path, api_server,
                                                                   team_keys) -> None:
    from api.cli.main import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"rewards": [{"name": "python", "args": {"source": (
        "def grade(sample, item):\n"
        "    if sample['output_text'] == 'boom':\n"
        "        raise ValueError('no grade for boom')\n"
        "    return 1.0\n")}}]}))
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps({"prompt": "Say it.", "completion": text})
                                  for text in ("fine", "boom")))
    target = ["--api-url", api_server.http_url, "--api-key", team_keys.alpha]
    capsys.readouterr()
    assert main(["rewards", "run", str(spec), "--samples", str(samples), *target]) == 1
    out = capsys.readouterr().out
    assert "python: ValueError: no grade for boom (grader.py line 3" in out
    assert "1 of 2 sample(s) had a reward that could not score them" in out
    assert main(["rewards", "run", str(spec), "--samples", str(samples), "--json", *target]) == 1
    assert json.loads(capsys.readouterr().out)["items"][1]["rewards"]["python"] is None
    samples.write_text(json.dumps({"prompt": "Say it.", "completion": "fine"}))
    assert main(["rewards", "run", str(spec), "--samples", str(samples), *target]) == 0


@needs_sandbox
def test_a_spec_as_text_lends_its_rewards_and_budget_and_is_named_where_it_is_wrong(member) -> None:
    """The dashboard sends its form's text as it is (JSON or YAML)."""
    samples = [sample("yes", answer="yes"), sample("no", answer="yes")]
    response = member.post("/v1/rewards/run", json={"spec": EXAMPLE.read_text(), "samples": samples})
    assert response.status_code == 200, response.text
    assert [item["rewards"]["python"] for item in response.json()["items"]] == [1.0, 0.0]
    as_json = json.dumps({"name": "x", "rewards": [{"name": "contains", "args": {"text": "yes"}}]})
    assert member.post("/v1/rewards/run", json={"spec": as_json, "samples": samples}).json()["items"][0][
        "reward"] == 1.0
    broken_grader = "rewards:\n  - {name: python, args: {source: 'def grade(:'}}\n"
    for text, param in ((broken_grader, "rewards.0.args.source"),
                        ("rewards:\n  - {weight: 2}\n", "rewards.0.name"),
                        ("name: no-rewards\n", "spec"), ("rewards: [unclosed\n", "spec")):
        refused = member.post("/v1/rewards/run", json={"spec": text, "samples": samples})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == param, refused.text
    both = member.post("/v1/rewards/run", json={"spec": as_json, "rewards": [{"name": "contains"}],
                                                "samples": samples})
    assert both.status_code == 422 and "not both" in both.json()["error"]["message"]
