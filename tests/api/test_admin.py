"""``/v1/admin`` (teams, quotas, keys, pools) and ``GET /v1/me`` over real HTTP, on Postgres
and SQLite. Bad input is a 4xx naming the field, and changes nothing."""

from __future__ import annotations

import uuid

import pytest


def new_name(stem: str) -> str:
    """A name no other test of the module's shared database uses."""
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def error_of(response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error


@pytest.fixture
def admin(client_for, team_keys):
    """A client with an admin API key (the ``api`` fixture's operator token is one too)."""
    return client_for(team_keys.admin)


@pytest.fixture
def team(admin) -> str:
    name = new_name("team")
    assert admin.post("/v1/admin/teams", json={"name": name}).status_code == 201
    return name


def teams_by_name(admin) -> dict[str, dict]:
    body = admin.get("/v1/admin/teams").json()
    assert body["next_after"] is None
    return {t["name"]: t for t in body["items"]}


def test_create_and_list_teams(admin) -> None:
    name = new_name("ml")
    created = admin.post("/v1/admin/teams", json={"name": name, "weight": 2.5})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == name and body["weight"] == 2.5 and body["quotas"] == {}
    assert body["created_at"].endswith("Z") or "+00:00" in body["created_at"]
    listed = teams_by_name(admin)
    assert listed[name] == body and {"default", "alpha", "beta"} <= set(listed)


def test_bad_team_input_is_refused_and_creates_nothing(admin) -> None:
    before = teams_by_name(admin)
    assert error_of(admin.post("/v1/admin/teams", json={"name": "alpha"}), 409, "name")["code"] == "conflict"
    for bad, param in (({"name": "Upper"}, "name"), ({"name": "-x"}, "name"), ({"name": "x" * 65}, "name"),
                       ({"name": "ok", "weight": 0}, "weight"), ({"name": "ok", "weight": -1}, "weight"),
                       ({"name": "ok", "color": "red"}, "color"), ({}, "name")):
        error_of(admin.post("/v1/admin/teams", json=bad), 422, param)
    assert teams_by_name(admin) == before


def test_set_weight(admin, team) -> None:
    assert admin.patch(f"/v1/admin/teams/{team}", json={"weight": 3}).json()["weight"] == 3
    for bad in (0, -2):
        error_of(admin.patch(f"/v1/admin/teams/{team}", json={"weight": bad}), 422, "weight")
    assert teams_by_name(admin)[team]["weight"] == 3
    error_of(admin.patch("/v1/admin/teams/nobody", json={"weight": 1}), 404, "team")


def test_quotas_set_change_and_clear(admin, team) -> None:
    quota = f"/v1/admin/teams/{team}/quotas/default"
    assert admin.put(quota, json={"gpus": 4}).json()["quotas"] == {"default": 4}
    assert admin.patch(quota, json={"delta": 2}).json()["quotas"] == {"default": 6}
    error = error_of(admin.patch(quota, json={"delta": -7}), 422, "delta")
    assert error["code"] == "invalid_input" and "-1" in error["message"]
    assert teams_by_name(admin)[team]["quotas"] == {"default": 6}  # nothing changed
    assert admin.patch(quota, json={"delta": -6}).json()["quotas"] == {"default": 0}
    assert admin.delete(quota).json()["quotas"] == {}
    assert admin.delete(quota).status_code == 200  # clearing twice is fine
    error_of(admin.patch(quota, json={"delta": -1}), 422, "delta")  # no quota counts as 0
    assert admin.patch(quota, json={"delta": 0}).json()["quotas"] == {}  # +0 does not create a limit
    assert admin.patch(quota, json={"delta": 3}).json()["quotas"] == {"default": 3}
    error_of(admin.put(quota, json={"gpus": -1}), 422, "gpus")
    error_of(admin.put(quota, json={"gpus": 2, "extra": 1}), 422, "extra")
    assert teams_by_name(admin)[team]["quotas"] == {"default": 3}


def test_quotas_of_unknown_teams_or_pools_are_404(admin, team) -> None:
    error_of(admin.put(f"/v1/admin/teams/{team}/quotas/nowhere", json={"gpus": 1}), 404, "pool")
    error_of(admin.patch(f"/v1/admin/teams/{team}/quotas/nowhere", json={"delta": 1}), 404, "pool")
    error_of(admin.delete(f"/v1/admin/teams/{team}/quotas/nowhere"), 404, "pool")
    error_of(admin.put("/v1/admin/teams/nobody/quotas/default", json={"gpus": 1}), 404, "team")
    assert teams_by_name(admin)[team]["quotas"] == {}


def test_artifact_quota_set_and_clear(admin, client_for, team_keys, team) -> None:
    quota = f"/v1/admin/teams/{team}/artifact-quota"
    assert teams_by_name(admin)[team]["artifact_quota_bytes"] is None  # no limit by default
    assert admin.put(quota, json={"bytes": 10**10}).json()["artifact_quota_bytes"] == 10**10
    for bad in ({"bytes": -1}, {"bytes": 2**63}, {"bytes": "lots"}, {}):
        error_of(admin.put(quota, json=bad), 422, "bytes")
    error_of(admin.put(quota, json={"bytes": 1, "gpus": 1}), 422, "gpus")
    error_of(admin.put("/v1/admin/teams/nobody/artifact-quota", json={"bytes": 1}), 404, "team")
    assert client_for(team_keys.alpha).put(quota, json={"bytes": 1}).status_code == 403
    assert teams_by_name(admin)[team]["artifact_quota_bytes"] == 10**10  # nothing changed
    assert admin.delete(quota).json()["artifact_quota_bytes"] is None
    assert admin.delete(quota).status_code == 200  # clearing twice is fine
    error_of(admin.delete("/v1/admin/teams/nobody/artifact-quota"), 404, "team")


def test_keys_are_shown_once_listed_by_prefix_and_revoked(admin, client_for, team) -> None:
    created = admin.post(f"/v1/admin/teams/{team}/keys", json={"label": "ci"})
    assert created.status_code == 201, created.text
    key = created.json()
    assert key["team"] == team and key["is_admin"] is False and key["label"] == "ci"
    assert key["prefix"] == key["key"][:12] and key["revoked_at"] is None
    assert client_for(key["key"]).get("/v1/me").json()["team"] == team

    listed = admin.get("/v1/admin/keys", params={"team": team}).json()["items"]
    assert listed == [{k: v for k, v in key.items() if k != "key"}]  # never the key again
    everyone = admin.get("/v1/admin/keys").json()["items"]
    assert {k["team"] for k in everyone} >= {team, "alpha", "beta", "default"}

    revoked = admin.post(f"/v1/admin/keys/{key['id']}/revoke").json()
    assert revoked["revoked_at"] is not None
    assert admin.post(f"/v1/admin/keys/{key['id']}/revoke").json() == revoked  # idempotent
    assert client_for(key["key"]).get("/v1/me").status_code == 401
    error_of(admin.post("/v1/admin/keys/999999/revoke"), 404, "key_id")
    error_of(admin.get("/v1/admin/keys", params={"team": "nobody"}), 404, "team")


def test_admin_keys_and_bad_key_requests(admin, client_for, team) -> None:
    made = admin.post(f"/v1/admin/teams/{team}/keys", json={"admin": True}).json()
    assert made["is_admin"] is True and made["label"] is None
    assert client_for(made["key"]).get("/v1/admin/pools").status_code == 200
    error_of(admin.post(f"/v1/admin/teams/{team}/keys", json={"label": "x" * 129}), 422, "label")
    error_of(admin.post(f"/v1/admin/teams/{team}/keys", json={"owner": "me"}), 422, "owner")
    error_of(admin.post("/v1/admin/teams/nobody/keys", json={}), 404, "team")
    assert len(admin.get("/v1/admin/keys", params={"team": team}).json()["items"]) == 1


def test_pools_create_hold_and_resume(admin) -> None:
    name = new_name("a100")
    created = admin.post("/v1/admin/pools", json={"name": name})
    assert created.status_code == 201, created.text
    assert created.json()["held"] is False and created.json()["max_worker_gpus"] is None
    error_of(admin.post("/v1/admin/pools", json={"name": name}), 409, "name")
    error_of(admin.post("/v1/admin/pools", json={"name": "Bad Pool"}), 422, "name")
    pools = {p["name"]: p for p in admin.get("/v1/admin/pools").json()["items"]}
    assert {"default", name} <= set(pools) and "bad pool" not in pools
    assert admin.post(f"/v1/admin/pools/{name}/hold").json()["held"] is True
    assert admin.post(f"/v1/admin/pools/{name}/hold").json()["held"] is True
    assert admin.post(f"/v1/admin/pools/{name}/resume").json()["held"] is False
    for action in ("hold", "resume"):
        error_of(admin.post(f"/v1/admin/pools/nowhere/{action}"), 404, "pool")


def test_me_says_who_is_calling(admin, client_for, team_keys) -> None:
    assert admin.get("/v1/me").json() == {"team": "default", "team_id": admin.get("/v1/me").json()["team_id"],
                                          "is_admin": True, "key_prefix": team_keys.admin[:12],
                                          "artifact_bytes": 0, "job_artifact_bytes": 0, "file_bytes": 0,
                                          "artifact_quota_bytes": None}
    beta = client_for(team_keys.beta).get("/v1/me").json()
    assert beta == {"team": "beta", "team_id": team_keys.beta_id, "is_admin": False,
                    "key_prefix": team_keys.beta[:12], "artifact_bytes": 0, "job_artifact_bytes": 0,
                    "file_bytes": 0, "artifact_quota_bytes": None}
    # A member reads its own team's quota (the bytes in use: tests/api/test_artifact_quota.py).
    assert admin.put("/v1/admin/teams/beta/artifact-quota", json={"bytes": 10**9}).status_code == 200
    try:
        assert client_for(team_keys.beta).get("/v1/me").json()["artifact_quota_bytes"] == 10**9
    finally:
        admin.delete("/v1/admin/teams/beta/artifact-quota")


def test_a_member_key_is_forbidden(client_for, team_keys) -> None:
    response = client_for(team_keys.alpha).post("/v1/admin/teams", json={"name": "sneaky"})
    assert response.status_code == 403
    assert response.json() == {"error": {"code": "forbidden", "message": "admin key required",
                                         "param": "Authorization"}}


def test_openapi_documents_the_admin_api(api) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/v1/me", "/v1/admin/teams", "/v1/admin/teams/{team}", "/v1/admin/teams/{team}/quotas/{pool}",
            "/v1/admin/teams/{team}/artifact-quota",
            "/v1/admin/teams/{team}/keys", "/v1/admin/keys", "/v1/admin/keys/{key_id}/revoke",
            "/v1/admin/pools", "/v1/admin/pools/{pool}/hold", "/v1/admin/pools/{pool}/resume"} <= set(paths)
    assert "403" in paths["/v1/admin/teams"]["post"]["responses"]
