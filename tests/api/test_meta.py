"""Probes, the reward catalog, what job codes mean, the OpenAPI page, local no-auth mode and the
torch-free import."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect


def closed_port() -> int:
    """A port nothing listens on (the OS just handed it out and it was released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_healthz_and_readyz(api) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    # No scheduler runs in these tests: ready to serve, but degraded (tests/api/test_no_scheduler.py).
    assert ready.status_code == 200
    assert ready.json()["status"] == "degraded"
    assert ready.json()["checks"] == {"database": "ok", "redis": "ok", "scheduler": "no scheduler pass yet"}


def test_readyz_is_503_when_redis_is_unreachable(api_database_url, api_settings_factory, serve_api) -> None:
    settings = api_settings_factory(api_database_url, redis_url=f"redis://127.0.0.1:{closed_port()}/0",
                                    api_token=None)
    with serve_api(settings) as server, httpx.Client(base_url=server.http_url, trust_env=False) as client:
        assert client.get("/healthz").status_code == 200  # alive, just not ready
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["error"]["code"] == "not_ready" and body["error"]["message"].startswith("redis: ")
    assert body["checks"]["database"] == "ok" and body["checks"]["redis"] != "ok"


def test_readyz_is_503_when_the_database_is_unreachable(api_settings_factory, serve_api) -> None:
    """Without a key it says only which component is down; the operator token is told why
    (host, database name and driver error are for operators, not for anyone who can reach it)."""
    port = closed_port()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nothing"
    with serve_api(api_settings_factory(url)) as server, \
            httpx.Client(base_url=server.http_url, trust_env=False) as client:
        anonymous = client.get("/readyz")
        wrong_key = client.get("/readyz", headers={"Authorization": "Bearer grpo_" + "x" * 43})
        admin = client.get("/readyz", headers=operator(server.settings))
    for response in (anonymous, wrong_key):
        assert response.status_code == 503
        assert response.json() == {"error": {"code": "not_ready", "message": "database: down", "param": None},
                                   "checks": {"database": "down", "redis": "ok"},
                                   "scheduler": {"last_pass_age_seconds": None, "stale_after_seconds": 10.0}}
    assert admin.status_code == 503 and admin.json()["checks"]["redis"] == "ok"
    detail = admin.json()["checks"]["database"]
    assert admin.json()["error"]["message"] == f"database: {detail}" and str(port) in detail


def operator(settings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.api_token.get_secret_value()}"}


def test_routes_answer_503_unavailable_while_the_database_is_down(api_settings_factory, serve_api) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/nothing"
    with serve_api(api_settings_factory(url)) as server, \
            httpx.Client(base_url=server.http_url, trust_env=False,
                         headers=operator(server.settings)) as client:
        responses = [client.get("/v1/jobs"), client.get("/v1/jobs/1"), client.get("/v1/queue")]
        assert client.get("/healthz").status_code == 200  # the same connection, still open
        # The WebSocket handshake is refused the same way, before any stream opens.
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{server.ws_url}/v1/jobs/1/stream", additional_headers=operator(server.settings),
                    proxy=None, open_timeout=5)
    assert refused.value.response.status_code == 503
    assert json.loads(refused.value.response.body)["error"]["code"] == "unavailable"
    for response in responses:
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "5"
        assert response.headers.get("connection") != "close"
        error = response.json()["error"]
        assert error["code"] == "unavailable" and error["message"].startswith("the database is unavailable")


def test_routes_that_need_redis_answer_503_unavailable_while_it_is_down(
        api_database_url, api_settings_factory, serve_api) -> None:
    settings = api_settings_factory(api_database_url, redis_url=f"redis://127.0.0.1:{closed_port()}/0")
    with serve_api(settings) as server, \
            httpx.Client(base_url=server.http_url, trust_env=False,
                         headers=operator(settings)) as client:
        cluster = client.get("/v1/cluster")
        jobs = client.get("/v1/jobs")  # SQL alone: still answers
    assert cluster.status_code == 503 and cluster.json()["error"]["code"] == "unavailable"
    assert cluster.json()["error"]["message"].startswith("redis is unavailable")
    assert jobs.status_code == 200


def test_reward_catalog_lists_argument_schemas(api) -> None:
    items = api.get("/v1/rewards").json()["items"]
    by_name = {item["name"]: item for item in items}
    assert {"exact_match", "numeric_match", "think_answer_format"} <= set(by_name)
    exact = by_name["exact_match"]
    assert exact["builtin"] is True and exact["description"]
    assert exact["args_schema"]["properties"]["field"]["default"] == "answer"
    assert exact["args_schema"]["additionalProperties"] is False


def codes_written_in(*packages: str) -> set[str]:
    """Every error code a GRPOError class or a call names in the source: ``code = "x"`` and
    ``code="x"`` (``error_code="x"`` too), so a code added later is found here without a list."""
    repo = Path(__file__).resolve().parents[2]
    found: set[str] = set()
    for package in packages:
        for path in (repo / package).rglob("*.py"):
            found.update(re.findall(r'code\s*=\s*"([a-z_]+)"', path.read_text()))
    return found


def test_every_code_a_job_can_show_is_explained_in_words(api) -> None:
    from api.scheduling.liveness import NO_SCHEDULER
    from api.scheduling.policy import PENDING_REASONS
    from api.store.attempts import TOO_MANY_ATTEMPTS
    from grpo_core.io.disk_space import DISK_FULL
    from worker.artifacts import QUOTA_EXCEEDED
    from worker.heartbeat import CAPABILITY_MISSING
    from worker.retrying import DATABASE_UNAVAILABLE
    from worker.supervisor import OUT_OF_MEMORY, STALLED

    codes = api.get("/v1/codes").json()
    assert set(codes["pending_reasons"]) == {*PENDING_REASONS, NO_SCHEDULER}
    written = codes_written_in("grpo_core", "worker") | {
        TOO_MANY_ATTEMPTS, QUOTA_EXCEEDED, CAPABILITY_MISSING, DATABASE_UNAVAILABLE, OUT_OF_MEMORY, STALLED,
        DISK_FULL}
    assert {"reward_error", "internal_error", "rank_died"} <= written  # the scan finds them
    assert written <= set(codes["error_codes"]), written - set(codes["error_codes"])
    texts = [*codes["pending_reasons"].values(), *codes["error_codes"].values()]
    assert all(len(text.split()) >= 5 for text in texts)


def test_openapi_documents_the_v1_api(api) -> None:
    assert api.get("/docs").status_code == 200
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/events",
            "/v1/jobs/{job_id}/metrics", "/v1/jobs/{job_id}/samples", "/v1/jobs/{job_id}/checkpoints",
            "/v1/rewards", "/healthz", "/readyz"} <= set(paths)
    assert "JobSpec" in str(paths["/v1/jobs"]["post"]["requestBody"])


def test_auth_none_means_no_auth(api_database_url, api_settings_factory, serve_api, job_spec) -> None:
    with serve_api(api_settings_factory(api_database_url, api_token=None, auth="none")) as server, \
            httpx.Client(base_url=server.http_url, trust_env=False) as client:
        created = client.post("/v1/jobs", json=job_spec(name="local"))
        assert created.status_code == 201, created.text
        assert client.get(f"/v1/jobs/{created.json()['id']}").json()["name"] == "local"


def test_unknown_route_uses_the_error_shape(api) -> None:
    response = api.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "not_found", "message": "Not Found", "param": None}}
    wrong_method = api.delete("/v1/jobs")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


def test_web_process_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "import api.main\n"
        "assert 'app' not in vars(api.main)  # nothing is built at import time\n"
        "from api.settings import Settings\n"
        "app = api.main.create_app(Settings())\n"
        "app.openapi()\n"
        "from grpo_core.rewards import reward_catalog; reward_catalog()\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr


def test_readyz_is_503_until_the_schema_is_the_codes(api_settings_factory, serve_api, tmp_path) -> None:
    """An API started against a database nobody migrated (``grpo api`` would migrate it first;
    ``uvicorn api.main:app`` does not) is alive but not ready, saying what to run to admins."""
    from api.store.migrate import upgrade_to_head

    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    with serve_api(api_settings_factory(url)) as server, \
            httpx.Client(base_url=server.http_url, trust_env=False) as client:
        anonymous = client.get("/readyz")
        admin = client.get("/readyz", headers=operator(server.settings))
        upgrade_to_head(url)
        ready = client.get("/readyz")
    assert anonymous.status_code == 503 and anonymous.json()["checks"]["database"] == "schema behind the code"
    assert "was never migrated" in admin.json()["checks"]["database"]
    assert "python -m api.store.migrate" in admin.json()["checks"]["database"]
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
