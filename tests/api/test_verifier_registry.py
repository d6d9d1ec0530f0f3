"""Verifier services registered by admins (``/v1/admin/verifiers``) over real HTTP, on Postgres
and SQLite: a round trip that never returns the secret, members refused, bad registrations 422s
naming the field; and submissions whose ``http_verifier`` rewards name a verifier that is not
registered for the team or the job's pool are 422s naming ``rewards.N.args.verifier``."""

from __future__ import annotations

import uuid

import pytest
from test_pool_limits import refusal

SECRET = "Bearer do-not-show-me"


def new_name(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def admin(client_for, team_keys):
    return client_for(team_keys.admin)


def registration(**fields) -> dict:
    return {"team": "alpha", "url": "https://verifier.internal:8443/score", "auth_header": "Authorization",
            "auth_secret": SECRET, **fields}


def with_verifier(job_spec, name: str, **args) -> dict:
    return job_spec(rewards=[{"name": "contains", "args": {"text": "yes"}},
                             {"name": "http_verifier", "args": {"verifier": name, **args}}])


def test_admins_register_read_replace_and_delete_a_verifier_and_never_see_its_secret(admin) -> None:
    name = new_name("grader")
    created = admin.put(f"/v1/admin/verifiers/{name}", json=registration(max_batch_size=8))
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["auth_secret_set"] is True and body["auth_header"] == "Authorization"
    limits = (body["max_batch_size"], body["max_concurrency"], body["timeout_seconds"])
    assert (body["team"], body["pool"], limits) == ("alpha", None, (8, 4, 10.0))
    assert admin.get(f"/v1/admin/verifiers/{name}").json() == body
    listed = admin.get("/v1/admin/verifiers").json()["items"]
    assert [v for v in listed if v["name"] == name] == [body]
    for response in (created, admin.get(f"/v1/admin/verifiers/{name}"), admin.get("/v1/admin/verifiers")):
        assert SECRET not in response.text and "do-not-show-me" not in response.text

    replaced = admin.put(f"/v1/admin/verifiers/{name}", json={"pool": "default", "url": "http://10.0.0.5/v"})
    assert replaced.status_code == 200
    assert replaced.json()["auth_secret_set"] is False and replaced.json()["team"] is None
    assert replaced.json()["created_at"] == body["created_at"]

    assert admin.delete(f"/v1/admin/verifiers/{name}").status_code == 204
    assert admin.get(f"/v1/admin/verifiers/{name}").status_code == 404
    assert admin.delete(f"/v1/admin/verifiers/{name}").status_code == 404


def test_a_member_cannot_register_or_read_verifiers(alpha) -> None:
    assert alpha.put(f"/v1/admin/verifiers/{new_name('v')}", json=registration()).status_code == 403
    assert alpha.get("/v1/admin/verifiers").status_code == 403


@pytest.mark.parametrize(("fields", "param"), [
    ({"url": "http://user:pw@verifier/score"}, "url"),
    ({"url": "file:///etc/passwd"}, "url"),
    ({"url": "ftp://verifier/score"}, "url"),
    ({"pool": "default"}, None),  # team and pool both
    ({"auth_secret": None}, None),  # a header without its secret
    ({"auth_header": "Bad Header:"}, "auth_header"),
    ({"auth_secret": "two\r\nlines"}, "auth_secret"),
    ({"timeout_seconds": 0}, "timeout_seconds"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_registrations_are_422s_that_change_nothing(admin, fields, param) -> None:
    name = new_name("bad")
    response = admin.put(f"/v1/admin/verifiers/{name}", json=registration(**fields))
    assert response.status_code == 422, response.text
    assert param is None or param in str(response.json()["error"])
    assert SECRET not in response.text
    assert admin.get(f"/v1/admin/verifiers/{name}").status_code == 404


def test_a_registration_for_a_team_or_pool_that_does_not_exist_is_a_404(admin) -> None:
    response = admin.put(f"/v1/admin/verifiers/{new_name('v')}", json=registration(team="no-such-team"))
    assert response.status_code == 404 and response.json()["error"]["param"] == "team"
    response = admin.put(f"/v1/admin/verifiers/{new_name('v')}",
                         json=registration(team=None, pool="no-such-pool"))
    assert response.status_code == 404 and response.json()["error"]["param"] == "pool"


def test_submit_needs_the_verifier_registered_for_the_team_or_the_pool(admin, alpha, beta, job_spec) -> None:
    team_only, pool_wide = new_name("team-grader"), new_name("pool-grader")
    assert admin.put(f"/v1/admin/verifiers/{team_only}", json=registration()).status_code == 200
    assert admin.put(f"/v1/admin/verifiers/{pool_wide}",
                     json=registration(team=None, pool="default")).status_code == 200

    assert alpha.post("/v1/jobs", json=with_verifier(job_spec, team_only)).status_code == 201
    assert beta.post("/v1/jobs", json=with_verifier(job_spec, pool_wide)).status_code == 201
    field = "rewards.1.args.verifier"
    message = refusal(beta.post("/v1/jobs", json=with_verifier(job_spec, team_only)), field)
    assert message.endswith(f"no verifier '{team_only}' is registered for your team or pool 'default'")
    refusal(alpha.post("/v1/jobs", json=with_verifier(job_spec, new_name("unknown"))), field)


@pytest.mark.parametrize(("args", "field"), [
    ({"verifier": "Not A Name"}, "rewards.1.args.verifier"),
    ({"verifier": "v", "url": "http://evil/"}, "rewards.1.args.url"),
    ({"verifier": "v", "columns": ["answer"]}, "rewards.1.args"),  # the inline rows have no such column
])
def test_bad_http_verifier_args_are_422s_naming_the_field(alpha, job_spec, args, field) -> None:
    rewards = [{"name": "contains", "args": {"text": "yes"}}, {"name": "http_verifier", "args": args}]
    spec = job_spec(rewards=rewards)
    refusal(alpha.post("/v1/jobs", json=spec), field)
