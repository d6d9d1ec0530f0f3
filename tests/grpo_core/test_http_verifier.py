"""``http_verifier`` against a verifier server this test starts on a local port: rows are sent
in batches with the named columns and the auth header, scores come back in order; nulls and
malformed entries are unscorable and counted; 5xx and 429 are retried (Retry-After honoured) and
recover; a hanging or absent verifier makes the call unavailable within its budget; redirects
are not followed; the secret shows in no error or repr."""

from __future__ import annotations

import math
import time

import pytest
from reward_helpers import bind_one, fresh_registry, spec_error  # noqa: F401 - fixture
from verifier_server import closed_port_url, verifier_server

from grpo_core.errors import RewardUnavailable
from grpo_core.rewards import RewardContext, score_completions
from grpo_core.rewards.verifier_client import VerifierClient
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint, check_verifier_url, parse_verifier_option
from grpo_core.spec.run_spec import RewardSpec

SECRET = "s3cret-token-value"


def endpoint(url: str, **limits) -> VerifierEndpoint:
    return VerifierEndpoint(url=url, auth_header="X-Verifier-Key", auth_secret=SECRET, **limits)


def rows(n: int) -> list[dict]:
    """Row i's completion names i; its reference matches for even i only."""
    return [{"prompt": f"q{i}", "completion": f"the answer is {i}",
             "columns": {"answer": "x" if i % 2 else str(i)}} for i in range(n)]


@pytest.fixture
def server():
    with verifier_server() as state:
        yield state


def verifier_reward(url: str, budget: float | None = 5.0, **limits):
    context = RewardContext(timeout_seconds=budget, verifiers={"grader": endpoint(url, **limits)})
    return bind_one("http_verifier", context, verifier="grader", columns=["answer"])


def test_rows_go_in_batches_with_their_columns_and_the_auth_header(server) -> None:
    reward = verifier_reward(server.url, max_batch_size=2, max_concurrency=2)
    completions = ["it is 0", "it is 1", "no", "it is 1", "0!"]
    answers = ["0", "1", "1", "0", "0"]
    scored = score_completions([reward], completions, [f"p{i}" for i in range(5)], {"answer": answers})
    assert [row[0] for row in scored.matrix] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert scored.unscored == {} and scored.unavailable == {}
    assert sorted(len(s.items) for s in server.seen) == [1, 2, 2]
    assert all(s.headers["X-Verifier-Key"] == SECRET for s in server.seen)
    sent = sorted((item for s in server.seen for item in s.items), key=lambda item: item["prompt"])
    assert sent[2] == {"prompt": "p2", "completion": "no", "columns": {"answer": "1"}}
    assert server.most_in_flight <= 2


def test_the_concurrency_limit_bounds_the_processs_requests_in_flight(server) -> None:
    """Two clients of one verifier (two rewards naming it) share its limit."""
    from concurrent.futures import ThreadPoolExecutor

    server.script = [("slow", 0.2)] * 12
    clients = [VerifierClient("shared", endpoint(server.url, max_batch_size=1, max_concurrency=3))
               for _ in range(2)]
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda client: client.score(rows(6), 10.0), clients))
    assert [len(result.scores) for result in results] == [6, 6]
    # The shared limit binds; exactly 3 at once needs every thread scheduled together (not so under load).
    assert 2 <= server.most_in_flight <= 3
    assert time.monotonic() - started >= 0.2 * 12 / 3


def test_nulls_and_malformed_entries_are_unscorable_and_counted(server) -> None:
    server.script = [("entries", [None, "high", True, float("inf"), 0.5])]
    reward = verifier_reward(server.url)
    scored = score_completions([reward], ["a 0"] * 6, [""] * 6, {"answer": ["0"] * 6})
    values = [row[0] for row in scored.matrix]
    assert all(math.isnan(v) for v in values[:4]) and values[4:] == [0.5, 1.0]
    assert scored.unscored == {"http_verifier": 4}


@pytest.mark.parametrize("body", [b"not json", b'{"score": [1]}', b'{"scores": [1.0]}', b"[1, 2]"])
def test_a_reply_not_in_the_schema_leaves_the_whole_batch_unscorable(server, body) -> None:
    server.script = [("raw", body)]
    result = VerifierClient("grader", endpoint(server.url)).score(rows(3), 5.0)
    assert result.scores == [None, None, None] and result.unscored == 3


def test_5xx_and_429_are_retried_and_the_verifier_recovers(server) -> None:
    server.script = [("status", 503), ("status", 500), ("status", 429, {"Retry-After": "0.3"})]
    started = time.monotonic()
    result = VerifierClient("grader", endpoint(server.url)).score(rows(2), 10.0)
    assert result.scores == [1.0, 0.0] and len(server.seen) == 4
    assert time.monotonic() - started >= 0.3  # the 429's Retry-After was waited


def test_a_verifier_still_failing_after_the_attempts_is_unavailable(server) -> None:
    server.script = [("status", 502)] * 10
    with pytest.raises(RewardUnavailable) as info:
        VerifierClient("grader", endpoint(server.url)).score(rows(2), 10.0)
    assert "verifier 'grader' is unavailable" in info.value.message and "HTTP 502" in info.value.message
    assert len(server.seen) == 4 and info.value.code == "reward_unavailable"


def test_a_hanging_verifier_times_out_within_the_calls_budget(server) -> None:
    server.script = [("hang", 3.0)] * 10
    started = time.monotonic()
    with pytest.raises(RewardUnavailable) as info:
        VerifierClient("grader", endpoint(server.url, timeout_seconds=0.3)).score(rows(2), 1.0)
    assert time.monotonic() - started < 1.5
    assert "ReadTimeout" in info.value.message


def test_a_verifier_that_is_down_is_unavailable_and_scoring_goes_on(server) -> None:
    down = verifier_reward(closed_port_url(), budget=3.0)
    scored = score_completions([down], ["a", "b"], ["", ""], {"answer": ["0", "1"]})
    assert list(scored.unavailable) == ["http_verifier"]
    assert "verifier 'grader' is unavailable: gave up after 4 attempt(s); last: ConnectError" in (
        scored.unavailable["http_verifier"])
    assert all(math.isnan(row[0]) for row in scored.matrix)


def test_a_redirect_is_not_followed(server) -> None:
    server.script = [("redirect",)]
    with pytest.raises(RewardUnavailable, match="HTTP 307 \\(redirects are not followed\\)"):
        VerifierClient("grader", endpoint(server.url)).score(rows(1), 5.0)
    assert len(server.seen) == 1


def test_a_4xx_is_not_retried_and_the_secret_shows_nowhere(server) -> None:
    server.script = [("status", 401)]
    with pytest.raises(RewardUnavailable) as info:
        VerifierClient("grader", endpoint(server.url)).score(rows(1), 5.0)
    assert "HTTP 401" in info.value.message and len(server.seen) == 1
    assert SECRET not in str(info.value) and SECRET not in repr(endpoint(server.url))


def test_a_verifier_the_run_does_not_know_is_an_error_on_the_args() -> None:
    error = spec_error([RewardSpec(name="http_verifier", args={"verifier": "nope"})])
    assert error.field == "rewards.0.args.verifier" and "no verifier 'nope'" in error.reason


@pytest.mark.parametrize(("args", "field"), [
    ({}, "rewards.0.args.verifier"),
    ({"verifier": "Bad Name"}, "rewards.0.args.verifier"),
    ({"verifier": "v", "columns": ["a", "a"]}, "rewards.0.args.columns"),
    ({"verifier": "v", "url": "http://x"}, "rewards.0.args.url"),
])
def test_bad_args_name_the_field(args, field) -> None:
    assert spec_error([RewardSpec(name="http_verifier", args=args)]).field == field


def test_the_columns_it_sends_must_be_in_the_dataset() -> None:
    spec = RewardSpec(name="http_verifier", args={"verifier": "v", "columns": ["tests"]})
    error = spec_error([spec], {"prompt", "answer"}, verifiers={"v": endpoint("http://127.0.0.1:1/")})
    assert error.field == "rewards.0.args" and "tests" in error.reason


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://host/x", "http:// or https://"),
    ("http://user:pw@host/x", "credentials"),
    ("http:///x", "no host"),
    ("http://host/ x", "whitespace"),
    ("http://host:99999999/", "not a valid URL"),
])
def test_only_plain_http_urls_are_accepted(url, why) -> None:
    with pytest.raises(ValueError, match=why):
        check_verifier_url(url)


def test_the_local_option_names_a_verifier() -> None:
    assert parse_verifier_option("grader=http://127.0.0.1:8000/score") == (
        "grader", VerifierEndpoint(url="http://127.0.0.1:8000/score"))
    with pytest.raises(ValueError, match="NAME=URL"):
        parse_verifier_option("http://127.0.0.1:8000/score")


def test_grpo_train_scores_through_the_verifier_its_option_names(server, tiny_model_dir, tmp_path,
                                                                capsys) -> None:
    """In-process ``grpo train``: ``--verifier NAME=URL`` is the local stand-in for a registration;
    without it the spec's verifier is unknown and nothing is written."""
    import yaml
    from core_specs import spec_dict

    from grpo_core.cli import main

    data = {**spec_dict(tiny_model_dir, max_steps=1),
            "rewards": [{"name": "http_verifier", "args": {"verifier": "grader", "columns": ["answer"]}}]}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(data))
    never = tmp_path / "never"
    assert main(["train", str(spec), "--output-dir", str(never), "--quiet"]) == 2
    assert "rewards.0.args.verifier: no verifier 'grader'" in capsys.readouterr().err and not never.exists()

    out = tmp_path / "run"
    option = f"grader={server.url}"
    assert main(["train", str(spec), "--output-dir", str(out), "--quiet", "--verifier", option]) == 0
    sent = [item for seen in server.seen for item in seen.items]
    assert len(sent) == 8 and {item["columns"]["answer"] for item in sent} == {"5"}
    assert "rewards/http_verifier/mean" in (out / "metrics.jsonl").read_text()
