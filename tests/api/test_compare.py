"""``GET /v1/jobs/compare`` over the real server (jobs stepped by the scripted worker), and its
pure parts: the spec diff and the even thinning of long series."""

from __future__ import annotations

import pytest

from api.domain.spec_diff import flatten, spec_differences, within_budget
from api.store.metric_series import sampling_stride

COMPARE = "/v1/jobs/compare"


# ---- pure: the spec diff ----

def test_flatten_names_leaves_by_dotted_path_and_list_index() -> None:
    spec = {"grpo": {"learning_rate": 1e-3}, "rewards": [{"name": "a"}, {"name": "b"}], "tags": [], "x": {}}
    assert flatten(spec) == {"grpo.learning_rate": 1e-3, "rewards.0.name": "a", "rewards.1.name": "b",
                             "tags": [], "x": {}}


def test_spec_differences_lists_only_differing_paths_with_missing_as_null() -> None:
    first = {"name": "a", "grpo": {"learning_rate": 1e-3, "beta": 0.04}, "rewards": [{"name": "x"}]}
    second = {"name": "b", "grpo": {"learning_rate": 1e-3, "beta": 0.04, "seed": 1},
              "rewards": [{"name": "x"}, {"name": "y"}]}
    assert spec_differences({1: first, 2: second}) == [
        {"field": "grpo.seed", "values": {1: None, 2: 1}},
        {"field": "name", "values": {1: "a", 2: "b"}},
        {"field": "rewards.1.name", "values": {1: None, 2: "y"}},
    ]


def test_spec_differences_treats_equal_numbers_alike_but_not_booleans_or_text() -> None:
    assert spec_differences({1: {"a": 1}, 2: {"a": 1.0}}) == []
    assert spec_differences({1: {"a": 1}, 2: {"a": True}}) == [{"field": "a", "values": {1: 1, 2: True}}]
    assert spec_differences({1: {"a": "1"}, 2: {"a": 1}}) == [{"field": "a", "values": {1: "1", 2: 1}}]


def test_within_budget_leaves_out_what_does_not_fit_and_keeps_smaller_ones_after_it() -> None:
    big = {"field": "dataset.prompts", "values": {1: "x" * 5000, 2: "y"}}
    small = {"field": "grpo.learning_rate", "values": {1: 1e-3, 2: 5e-4}}
    assert within_budget([small, big, small], 100_000) == ([small, big, small], 0)
    assert within_budget([big, small, big, small], 1000) == ([small, small], 2)
    assert within_budget([big], 1000) == ([], 1)


# ---- pure: thinning ----

@pytest.mark.parametrize("count", [1, 2, 1999, 2000, 2001, 2999, 4000, 4001, 100_000, 123_457])
def test_sampling_stride_keeps_at_most_the_limit_with_first_and_last(count: int) -> None:
    stride = sampling_stride(count, 2000)
    kept = {position for position in range(count) if position % stride == 0} | {count - 1}
    assert len(kept) <= 2000
    assert count <= 2000 or len(kept) > 1000  # evenly: not far fewer than allowed
    assert stride == 1 or count > 2000


def test_sampling_stride_needs_room_for_both_ends() -> None:
    with pytest.raises(ValueError):
        sampling_stride(10, 1)


# ---- the route ----

@pytest.fixture
def two_jobs(api, job_spec, worker) -> list[int]:
    """Two jobs of the default team whose specs differ in the learning rate; the first has
    stepped 3 times, the second 2, and only the second logged ``eval_reward`` (at step 2)."""
    ids = []
    for name, rate in (("first", 1e-3), ("second", 5e-4)):
        response = api.post("/v1/jobs", json=job_spec(name=name, grpo={"learning_rate": rate}))
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    for job_id, steps in zip(ids, (3, 2), strict=True):
        worker.start(job_id)
        for step in range(1, steps + 1):
            worker.step(job_id, step)
    worker.reporter(ids[1]).on_step({"step": 3, "reward": 0.5, "eval_reward": 0.75})
    return ids


def test_compare_overlays_metrics_and_diffs_specs(api, two_jobs) -> None:
    first, second = two_jobs
    response = api.get(COMPARE, params={"ids": f"{first},{second}", "metrics": "reward,eval_reward"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["jobs"] == [{"id": first, "name": "first", "status": "running"},
                            {"id": second, "name": "second", "status": "running"}]
    assert body["metrics"]["reward"] == {str(first): [[1, 0.01], [2, 0.02], [3, 0.03]],
                                         str(second): [[1, 0.01], [2, 0.02], [3, 0.5]]}
    assert body["metrics"]["eval_reward"] == {str(first): [], str(second): [[3, 0.75]]}
    assert {"reward", "kl", "eval_reward", "rewards/exact_match/mean"} <= set(body["metric_names"])
    assert "step" not in body["metric_names"]
    fields = {row["field"]: row["values"] for row in body["spec_diff"]}
    assert fields["grpo.learning_rate"] == {str(first): 1e-3, str(second): 5e-4}
    assert fields["name"] == {str(first): "first", str(second): "second"}
    assert "grpo.beta" not in fields
    assert body["spec_diff_omitted"] == 0


def test_compare_defaults_to_reward_and_takes_repeated_ids(api, two_jobs) -> None:
    first, second = two_jobs
    response = api.get(COMPARE, params=[("ids", str(second)), ("ids", str(first))])
    assert response.status_code == 200, response.text
    body = response.json()
    assert [job["id"] for job in body["jobs"]] == [second, first]
    assert list(body["metrics"]) == ["reward"]


def test_compare_thins_a_long_series_evenly(api, job_spec, worker) -> None:
    ids = [api.post("/v1/jobs", json=job_spec(name=f"long-{n}")).json()["id"] for n in (1, 2)]
    worker.start(ids[0])
    worker.burst(ids[0], range(1, 4502))
    body = api.get(COMPARE, params={"ids": f"{ids[0]},{ids[1]}"}).json()
    points = body["metrics"]["reward"][str(ids[0])]
    steps = [step for step, _ in points]
    assert len(points) <= 2000 and len(points) > 1000
    assert steps[0] == 1 and steps[-1] == 4501 and steps == sorted(steps)
    assert len({b - a for a, b in zip(steps[:-2], steps[1:-1], strict=True)}) == 1  # one stride
    assert body["metrics"]["reward"][str(ids[1])] == []


def test_ten_jobs_of_large_specs_answer_within_the_byte_budget(api, api_server, job_spec) -> None:
    """Issue 32 item 10: ten jobs of ~0.8 MiB specs that differ everywhere made an 8.4 MiB answer;
    the differences are now bounded by GRPO_COMPARE_DIFF_BYTES, the rest counted as left out."""
    import json

    budget = api_server.settings.compare_diff_bytes
    ids = []
    for n in range(10):
        prompts = [{"prompt": f"job {n} row {row}: " + "abcdefgh" * 100} for row in range(1000)]
        spec = job_spec(name=f"large-{n}", dataset={"prompts": prompts})
        assert len(json.dumps(spec)) > 800_000
        response = api.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text[:300]
        ids.append(response.json()["id"])
    response = api.get(COMPARE, params={"ids": ",".join(map(str, ids))})
    assert response.status_code == 200, response.text[:300]
    body = response.json()
    assert len(json.dumps(body["spec_diff"], separators=(",", ":"))) <= budget
    assert len(response.content) <= budget + 16 * 1024  # the jobs, metric names and empty series
    assert body["spec_diff_omitted"] > 0
    first = body["spec_diff"][0]
    assert first["field"] == "dataset.prompts.0.prompt"  # in path order, each job's value
    assert first["values"] == {str(job_id): f"job {n} row 0: " + "abcdefgh" * 100
                               for n, job_id in enumerate(ids)}


def test_series_share_a_bound_on_points_in_all(api, job_spec, worker) -> None:
    """2 jobs x 20 metrics share 40,000 points: 1,000 a series, not 2,000 (10 jobs x 20 metrics at
    2,000 each made 400,000 points, ~10 MB)."""
    ids = [api.post("/v1/jobs", json=job_spec(name=f"many-{n}")).json()["id"] for n in (1, 2)]
    worker.start(ids[0])
    worker.burst(ids[0], range(1, 2502))
    metrics = ",".join(["reward", *(f"absent_{n}" for n in range(19))])
    body = api.get(COMPARE, params={"ids": f"{ids[0]},{ids[1]}", "metrics": metrics}).json()
    steps = [step for step, _ in body["metrics"]["reward"][str(ids[0])]]
    assert 500 < len(steps) <= 1000 and steps[0] == 1 and steps[-1] == 2501


@pytest.mark.parametrize("params", [{"ids": "1"}, {"ids": "1,1"}, {"ids": ",".join(map(str, range(1, 12)))},
                                    {"ids": "1,x"}, {"ids": "1,0"}, {"ids": "1,2", "metrics": "m" * 201},
                                    {"ids": "1,2", "metrics": ",".join(f"m{n}" for n in range(21))}])
def test_compare_refuses_bad_ids_and_metrics_naming_the_parameter(api, params) -> None:
    response = api.get(COMPARE, params=params)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == ("metrics" if "metrics" in params else "ids")


def test_compare_needs_ids(api) -> None:
    assert api.get(COMPARE).status_code == 422


def test_another_teams_job_is_not_found(client_for, team_keys, job_spec) -> None:
    alpha, beta = client_for(team_keys.alpha), client_for(team_keys.beta)
    mine = alpha.post("/v1/jobs", json=job_spec(name="mine")).json()["id"]
    theirs = beta.post("/v1/jobs", json=job_spec(name="theirs")).json()["id"]
    response = alpha.get(COMPARE, params={"ids": f"{mine},{theirs}"})
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "ids"
    assert str(theirs) in response.json()["error"]["message"]
    assert client_for(team_keys.admin).get(COMPARE, params={"ids": f"{mine},{theirs}"}).status_code == 200


# ---- grpo compare ----

def grpo_compare(capsys, server, key: str, *argv: str) -> tuple[int, str, str]:
    from api.cli.main import main

    capsys.readouterr()
    code = main(["compare", *argv, "--api-url", server.http_url, "--api-key", key])
    out, err = capsys.readouterr()
    return code, out, err


def test_grpo_compare_prints_a_table_per_metric_and_the_spec_differences(capsys, api, api_server, api_token,
                                                                         two_jobs) -> None:
    import json

    first, second = two_jobs
    code, out, _ = grpo_compare(capsys, api_server, api_token, str(first), str(second),
                                "--metric", "reward", "--metric", "eval_reward")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "reward:"
    assert [line.split() for line in lines[1:4]] == [["JOB", "NAME", "LAST", "MIN", "MAX", "STEPS"],
                                                     [str(first), "first", "0.03", "0.01", "0.03", "3"],
                                                     [str(second), "second", "0.5", "0.01", "0.5", "3"]]
    eval_at = lines.index("eval_reward:")
    assert lines[eval_at + 2].split() == [str(first), "first", "-", "-", "-", "-"]
    assert lines[eval_at + 3].split() == [str(second), "second", "0.75", "0.75", "0.75", "3"]
    diff_at = lines.index("spec differences:")
    rate_row = next(line for line in lines[diff_at:] if line.startswith("grpo.learning_rate"))
    assert rate_row.split() == ["grpo.learning_rate", "0.001", "0.0005"]
    code, out, _ = grpo_compare(capsys, api_server, api_token, str(first), str(second), "--json")
    answer = api.get(COMPARE, params={"ids": f"{first},{second}"}).json()
    assert code == 0 and json.loads(out) == answer


def test_grpo_compare_refuses_one_job_and_another_teams(capsys, api_server, api_token, team_keys, client_for,
                                                        job_spec, two_jobs) -> None:
    code, _, err = grpo_compare(capsys, api_server, api_token, str(two_jobs[0]))
    assert code == 2 and "ids" in err
    theirs = client_for(team_keys.beta).post("/v1/jobs", json=job_spec(name="theirs")).json()["id"]
    code, _, err = grpo_compare(capsys, api_server, team_keys.alpha, str(two_jobs[0]), str(theirs))
    assert code == 2 and str(theirs) in err


def test_comparison_lines_draw_a_sparkline_per_job_on_a_terminal() -> None:
    from api.cli.compare_command import comparison_lines
    from api.cli.term_view import sparkline

    view = {"jobs": [{"id": 1, "name": "a", "status": "succeeded"},
                     {"id": 2, "name": "b", "status": "failed"}],
            "metrics": {"reward": {"1": [[1, 0.0], [2, 0.5], [3, 1.0]], "2": [[1, 1.0], [2, 1.0]]}},
            "metric_names": ["reward"], "spec_diff": []}
    lines = comparison_lines(view, sparklines=True, width=80)
    assert lines[1].split() == ["JOB", "NAME", "LAST", "MIN", "MAX", "STEPS", "SERIES"]
    assert lines[2].endswith(sparkline([0.0, 0.5, 1.0])) and lines[3].endswith(sparkline([1.0, 1.0]))
    assert sparkline([0.0, 0.5, 1.0])[0] == "▁" and sparkline([0.0, 0.5, 1.0])[-1] == "█"
    assert lines[-1] == "the specs do not differ"
