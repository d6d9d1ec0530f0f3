"""Issue 32 item 5: no input reaches a 5xx. Text no column can hold (NUL, lone surrogates) in a
query string, a path, a JSON body at any depth or a form field is a 422 naming the field before
any SQL; ids are ASCII digits only; JSON nested 100,000 deep or with a 5,000-digit integer is a
422, on every route that takes a JSON body. Through a real server on Postgres (which refuses NUL
in text: these were 500s there)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.parametrize("api_database_url", ["postgres"], indirect=True)

JSON = {"Content-Type": "application/json"}
DEEP = "[" * 100_000 + "]" * 100_000
LONG_INT = "9" * 5000


def _refused(response, param: str) -> None:
    assert response.status_code == 422, response.text[:300]
    assert response.json()["error"]["param"] == param, response.text[:300]


def test_nul_in_a_query_string_is_422_naming_the_parameter(api, job_spec) -> None:
    job_id = api.post("/v1/jobs", json=job_spec()).json()["id"]
    for path, param in [("/v1/jobs?q=a%00b", "q"),
                        (f"/v1/jobs/compare?ids={job_id},{job_id + 1}&metrics=%00", "metrics"),
                        ("/v1/files?after=file-%00", "after"),
                        (f"/v1/jobs/{job_id}/metrics?names=re%00ward", "names"),
                        ("/v1/usage?since=%00", "since"), ("/v1/jobs?tag=a&a%00=1", "a\x00")]:
        _refused(api.get(path), param)


def test_nul_in_a_path_is_422_naming_the_path_parameter(api) -> None:
    _refused(api.patch("/v1/admin/teams/a%00b", json={"weight": 2}), "team")
    _refused(api.get("/v1/files/file-%00"), "file_id")


def test_nul_or_a_lone_surrogate_anywhere_in_a_json_body_is_422_naming_the_field(api, job_spec) -> None:
    job_id = api.post("/v1/jobs", json=job_spec()).json()["id"]
    before = api.get(f"/v1/jobs/{job_id}").json()
    cases = [
        ("PATCH", f"/v1/jobs/{job_id}", '{"description": "a\\u0000b"}', "description"),
        ("PATCH", f"/v1/jobs/{job_id}", '{"tags": ["ok", "a\\ud800"]}', "tags.1"),
        ("POST", "/v1/rewards/run", '{"rewards": [{"name": "exact_match", "args": {"x": ["\\u0000"]}}], '
                                    '"samples": [{"prompt": "p", "completion": "c"}]}', "rewards.0.args.x.0"),
        ("POST", "/v1/rewards/run", '{"rewards": [{"name": "exact_match", "args": {"\\udc00": 1}}], '
                                    '"samples": [{"prompt": "p", "completion": "c"}]}', "rewards.0.args"),
        ("POST", "/v1/jobs", '{"name": "x", "rewards": [{"name": "exact_match", "args": {"y": "\\u0000"}}]}',
         "rewards.0.args.y"),
        ("POST", f"/v1/jobs/{job_id}/clone", '{"description": "\\ud800"}', "description"),
    ]
    for method, path, body, param in cases:
        _refused(api.request(method, path, content=body, headers=JSON), param)
    assert api.get(f"/v1/jobs/{job_id}").json() == before  # nothing half-written
    # An escaped backslash before u0000 is text, and a surrogate pair is one character: both fine.
    escaped = '{"description": "a\\\\u0000b \\ud83d\\ude00"}'
    fine = api.patch(f"/v1/jobs/{job_id}", content=escaped, headers=JSON)
    assert fine.status_code == 200 and fine.json()["description"] == "a\\u0000b \U0001F600", fine.text


def test_nul_in_a_form_field_is_422_naming_it(api) -> None:
    response = api.post("/v1/files", data={"purpose": "dataset", "prompt_field": "pro\x00mpt"},
                        files={"file": ("rows.jsonl", b'{"prompt": "hi"}\n')})
    _refused(response, "prompt_field")


@pytest.mark.parametrize("body, kind", [('{"description": ' + DEEP + "}", "nested deeper"),
                                        ('{"priority": ' + LONG_INT + "}", "digits")])
def test_deep_or_long_numbered_json_is_422_on_every_json_route(api, job_spec, body: str, kind: str) -> None:
    job_id = api.post("/v1/jobs", json=job_spec()).json()["id"]
    for method, path in [("PATCH", f"/v1/jobs/{job_id}"), ("POST", "/v1/jobs"),
                         ("POST", f"/v1/jobs/{job_id}/clone"),
                         ("POST", "/v1/rewards/run"), ("PUT", "/v1/admin/teams/default/limits"),
                         ("POST", "/v1/webhooks")]:
        response = api.request(method, path, content=body, headers=JSON)
        _refused(response, "body")
        assert kind in response.json()["error"]["message"]


def test_ids_are_ascii_digits_only(api, job_spec) -> None:
    first, second = (api.post("/v1/jobs", json=job_spec(name=n)).json()["id"] for n in ("a", "b"))
    assert first < 10  # written below in other digits
    arabic_indic = chr(0x0660 + first)
    for ids in (f"²,{second}", f"{arabic_indic},{second}", f"{first},{second}\u00b9", f"+{first},{second}"):
        _refused(api.get("/v1/jobs/compare", params={"ids": ids}), "ids")
    for path, param in [(f"/v1/jobs/{arabic_indic}", "job_id"), (f"/v1/jobs/+{first}", "job_id"),
                        (f"/v1/jobs/{first}_0", "job_id"), (f"/v1/jobs/{first}.0", "job_id"),
                        (f"/v1/jobs/{first}/events?after=%2B0", "after"), ("/v1/jobs?after=1_0", "after"),
                        (f"/v1/jobs/{first}/metrics?after_step=%2B1", "after_step"),
                        (f"/v1/jobs/{first}/checkpoints/+1/archive", "step")]:
        _refused(api.get(path), param)
    assert api.get(f"/v1/jobs/{first}/metrics", params={"after_step": -1}).status_code == 200
    assert api.get("/v1/jobs/compare", params={"ids": f"{first},{second}"}).status_code == 200
