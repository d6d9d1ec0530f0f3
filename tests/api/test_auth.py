"""Who a caller is: API key format and hashing, the key cache, and the three ways in (team
keys, the operator token, ``auth = "none"``) against a real server on Postgres and SQLite."""

from __future__ import annotations

import hashlib
import json

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from api.http.auth import KeyCache, Principal
from api.store import api_keys, teams
from api.store.db import session_scope


def test_keys_are_random_well_formed_and_stored_as_sha256(api_token) -> None:
    new = api_keys.generate_key()
    assert new.plaintext.startswith("grpo_") and len(new.plaintext) == 48
    assert api_keys.is_well_formed(new.plaintext)
    assert new.prefix == new.plaintext[:12] == api_keys.key_prefix(new.plaintext)
    assert new.key_hash == hashlib.sha256(new.plaintext.encode()).hexdigest()
    assert new.key_hash == api_keys.hash_key(new.plaintext)
    assert len({api_keys.generate_key().plaintext for _ in range(100)} | {new.plaintext}) == 101
    key = new.plaintext
    for bad in ("", "grpo_", key[:-1], key + "A", key.upper(), "grpx_" + key[5:], f" {key}",
                "grpo_" + "!" * 43, api_token):
        assert not api_keys.is_well_formed(bad), bad


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_key_cache_expires_evicts_and_refuses_stale_puts() -> None:
    clock, member = Clock(), Principal(team_id=7, is_admin=False, key_prefix="grpo_abcdefg")
    cache = KeyCache(5.0, clock)
    cache.put("h1", 1, member, cache.generation)
    assert cache.get("h1") == member and cache.get("h2") is None
    clock.now += 5.0
    assert cache.get("h1") is None  # expired

    cache.put("h1", 1, member, cache.generation)
    began = cache.generation  # a lookup of key 2 begins ...
    cache.evict_key(1)  # ... a revocation commits and evicts ...
    cache.put("h2", 2, member, began)  # ... so what the lookup read may be stale: not kept
    assert cache.get("h1") is None and cache.get("h2") is None

    off = KeyCache(0.0, clock)
    off.put("h1", 1, member, off.generation)
    assert off.get("h1") is None


def assert_401(response, message: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = {"code": "unauthorized", "message": message, "param": "Authorization"}
    assert response.json() == {"error": error}


def test_a_member_key_acts_as_its_team(client_for, team_keys, job_spec) -> None:
    alpha = client_for(team_keys.alpha)
    job = alpha.post("/v1/jobs", json=job_spec(name="alpha-run"))
    assert job.status_code == 201, job.text
    assert job.json()["team_id"] == team_keys.alpha_id
    me = alpha.get("/v1/me").json()  # its artifact bytes: tests/api/test_artifact_quota.py
    assert {key: me[key] for key in ("team", "team_id", "is_admin", "key_prefix")} == {
        "team": "alpha", "team_id": team_keys.alpha_id, "is_admin": False, "key_prefix": team_keys.alpha[:12]}


def test_the_operator_token_is_an_admin_of_default(api) -> None:
    me = api.get("/v1/me").json()
    assert me["team"] == "default" and me["is_admin"] is True and me["key_prefix"] is None
    assert api.get("/v1/admin/teams").status_code == 200


def test_bad_credentials_are_401_saying_why(api_server, client_for, team_keys, make_key) -> None:
    url = api_server.settings.database_url
    revoked = make_key(url, "alpha", label="revoked before use")
    with session_scope(url) as session:
        key_id = teams.list_keys(session, "alpha")[-1].id
        teams.revoke_key(session, key_id)
    assert_401(client_for(None).get("/v1/jobs"), "missing bearer token")
    assert_401(client_for("not-a-key").get("/v1/jobs"), "malformed API key")
    assert_401(client_for(team_keys.alpha + "x").get("/v1/jobs"), "malformed API key")
    assert_401(client_for(api_keys.generate_key().plaintext).get("/v1/jobs"), "invalid API key")
    assert_401(client_for(revoked).get("/v1/jobs"), "API key revoked")
    # A key is never read from a URL (access logs keep URLs).
    assert_401(client_for(None).get("/v1/jobs", params={"token": team_keys.alpha}), "missing bearer token")


def test_a_revoke_over_http_takes_effect_at_once(api, api_server, client_for) -> None:
    created = api.post("/v1/admin/teams/alpha/keys", json={"label": "soon revoked"}).json()
    holder = client_for(created["key"])
    assert holder.get("/v1/jobs").status_code == 200  # verified, and now cached for 5 s
    assert api.post(f"/v1/admin/keys/{created['id']}/revoke").status_code == 200
    assert_401(holder.get("/v1/jobs"), "API key revoked")


@pytest.mark.parametrize("cache_seconds", [60.0, 0.0])
def test_the_key_cache_is_honoured(api_database_url, api_settings_factory, serve_api, client_for,
                                   team_keys, make_key, cache_seconds) -> None:
    """A revocation made elsewhere (another API process, ``grpo admin``) is seen when the
    cached entry expires; with the cache off, at once."""
    key = make_key(api_database_url, "beta")
    settings = api_settings_factory(api_database_url, auth_cache_seconds=cache_seconds)
    with serve_api(settings) as server:
        holder = client_for(key, server)
        assert holder.get("/v1/me").status_code == 200
        with session_scope(api_database_url) as session:
            teams.revoke_key(session, teams.list_keys(session, "beta")[-1].id)
        if cache_seconds:
            assert holder.get("/v1/me").status_code == 200  # trusted until the entry expires
        else:
            assert_401(holder.get("/v1/me"), "API key revoked")


def test_auth_none_makes_every_caller_an_admin_of_default(api_database_url, api_settings_factory,
                                                          serve_api, client_for, team_keys, job_spec) -> None:
    with serve_api(api_settings_factory(api_database_url, auth="none", api_token=None)) as server:
        anonymous = client_for(None, server)
        me = anonymous.get("/v1/me").json()
        assert me["team"] == "default" and me["is_admin"] is True
        assert anonymous.get("/v1/admin/pools").status_code == 200
        job = anonymous.post("/v1/jobs", json=job_spec(name="local"))
        assert job.status_code == 201 and job.json()["team_id"] == me["team_id"]
        # A key changes nothing: there is no auth to apply it to.
        assert client_for(team_keys.beta, server).get("/v1/me").json()["team"] == "default"


def test_without_an_operator_token_only_keys_get_in(api_database_url, api_settings_factory, serve_api,
                                                    client_for, team_keys, api_token) -> None:
    with serve_api(api_settings_factory(api_database_url, api_token=None)) as server:
        assert_401(client_for(None, server).get("/v1/jobs"), "missing bearer token")
        assert_401(client_for(api_token, server).get("/v1/jobs"), "malformed API key")
        assert client_for(team_keys.alpha, server).get("/v1/me").json()["team"] == "alpha"


def test_a_key_in_the_websocket_query_is_refused(api_server, client_for, team_keys, job_spec) -> None:
    job_id = client_for(team_keys.alpha).post("/v1/jobs", json=job_spec()).json()["id"]
    url = f"{api_server.ws_url}/v1/jobs/{job_id}/stream"
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{url}?token={team_keys.alpha}", proxy=None, open_timeout=5)
    assert refused.value.response.status_code == 401
    # The same key offered as a subprotocol opens it; another team's key finds no such job.
    with connect(url, subprotocols=["grpo.v1", f"grpo.bearer.{team_keys.alpha}"], proxy=None,
                 open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] in ("status", "event")
    with pytest.raises(InvalidStatus) as refused:
        connect(url, subprotocols=["grpo.v1", f"grpo.bearer.{team_keys.beta}"], proxy=None, open_timeout=5)
    assert refused.value.response.status_code == 404
