"""A spec with ``code_tests`` is accepted only where it can run: some live worker of its pool
advertises the ``code_sandbox`` capability, which a real worker heartbeat does after its sandbox
check at start (``worker.heartbeat.worker_capabilities``) and again every few minutes while it
runs. Over real HTTP, Redis and SQL."""

from __future__ import annotations

import logging

import pytest
from sandbox_guard import needs_sandbox
from test_jobs_api import row_counts
from tool_models import TOOLS
from waiting import wait_until

import worker.heartbeat as heartbeat_module
from api.store import bus
from api.vocabulary import Heartbeat
from grpo_core.rewards.sandbox import CAPABILITY, probe_sandbox
from worker.heartbeat import WorkerHeartbeat, worker_capabilities

CODE_ROWS = [{"prompt": "Read n and print 2n.", "tests": [{"input": "2", "output": "4"}]}]


def code_spec(job_spec, **fields):
    fields = {"dataset": {"prompts": CODE_ROWS}, **fields}
    return job_spec(rewards=[{"name": "contains", "args": {"text": "x"}}, {"name": "code_tests"}], **fields)


def test_refused_naming_the_reward_when_no_live_worker_of_the_pool_advertises_a_sandbox(
        api, api_server, job_spec) -> None:
    settings = api_server.settings
    with bus.connect(settings) as client:
        # A worker of another pool with a sandbox, and one of this pool without: neither will do.
        bus.advertise_worker(client, settings.redis_keys,
                             Heartbeat(worker_id="elsewhere", pool="other", capabilities=[CAPABILITY]), 60)
        bus.advertise_worker(client, settings.redis_keys, Heartbeat(worker_id="plain", pool="default"), 60)
        try:
            before = row_counts(settings.database_url)
            response = api.post("/v1/jobs", json=code_spec(job_spec))
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["code"] == "invalid_spec" and error["param"] == "rewards.1.name", error
            assert "code_sandbox" in error["message"] and "pool 'default'" in error["message"]
            assert row_counts(settings.database_url) == before
            # A spec without it is not held back by the same workers.
            assert api.post("/v1/jobs", json=job_spec()).status_code == 201
        finally:
            client.delete(settings.redis_keys.worker("elsewhere"), settings.redis_keys.worker("plain"))


@needs_sandbox
def test_accepted_once_a_real_worker_of_the_pool_checked_its_sandbox_and_advertises_it(
        api, api_server, job_spec) -> None:
    assert worker_capabilities() == [CAPABILITY]
    heartbeat = WorkerHeartbeat(api_server.settings, "sandboxed-worker")
    heartbeat.start()
    try:
        response = api.post("/v1/jobs", json=code_spec(job_spec))
        assert response.status_code == 201, response.text
        clone = api.post(f"/v1/jobs/{response.json()['id']}/clone", json={"name": "again"})
        assert clone.status_code == 201, clone.text
        workers = {worker["worker_id"]: worker for pool in api.get("/v1/cluster").json()["pools"]
                   for worker in pool["workers"]}
        assert workers["sandboxed-worker"]["capabilities"] == [CAPABILITY]
    finally:
        heartbeat.stop()
    # The worker left: its clone is refused like a new submission.
    refused = api.post(f"/v1/jobs/{response.json()['id']}/clone", json={})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "rewards.1.name"


@needs_sandbox
def test_a_worker_logs_which_protections_of_its_sandbox_hold(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="worker.heartbeat"):
        assert worker_capabilities() == [CAPABILITY]
    active = "code sandbox protections active: seccomp, no_userns, limits_on_init, minimal_mounts"
    assert active in caplog.text


def test_a_worker_without_bwrap_advertises_no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert worker_capabilities() == []


def test_a_worker_whose_sandbox_breaks_stops_advertising_it_and_advertises_it_again_once_fixed(
        api, api_server, job_spec, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # The check passes at the start, then fails (a real failure: bwrap gone from PATH), then passes.
    monkeypatch.setitem(heartbeat_module._CAPABILITY_PROBES, CAPABILITY, lambda: None)
    heartbeat = WorkerHeartbeat(api_server.settings, "breaking-worker")

    def advertised() -> list[str]:
        heartbeat.recheck_capabilities()  # what its own thread does every capability_recheck_seconds
        heartbeat.beat()
        workers = {worker["worker_id"]: worker for pool in api.get("/v1/cluster").json()["pools"]
                   for worker in pool["workers"]}
        return workers["breaking-worker"]["capabilities"]

    try:
        assert advertised() == [CAPABILITY]
        monkeypatch.setitem(heartbeat_module._CAPABILITY_PROBES, CAPABILITY, probe_sandbox)
        monkeypatch.setenv("PATH", "/nonexistent")
        with caplog.at_level(logging.WARNING, logger="worker.heartbeat"):
            assert advertised() == []
        assert "no longer advertises code_sandbox: bwrap (bubblewrap) is not installed" in caplog.text
        # Submissions that need it are refused now that no live worker of the pool offers it.
        refused = api.post("/v1/jobs", json=code_spec(job_spec))
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "rewards.1.name"
        monkeypatch.setitem(heartbeat_module._CAPABILITY_PROBES, CAPABILITY, lambda: None)
        assert advertised() == [CAPABILITY]
    finally:
        heartbeat.stop()


def test_a_started_heartbeat_checks_its_capabilities_again_from_its_own_thread(
        api_server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(heartbeat_module._CAPABILITY_PROBES, CAPABILITY, lambda: None)
    heartbeat = WorkerHeartbeat(api_server.settings, "rechecking-worker")
    heartbeat.capability_recheck_seconds = 0.05
    heartbeat.start()
    try:
        assert heartbeat.static.capabilities == [CAPABILITY]
        monkeypatch.setitem(heartbeat_module._CAPABILITY_PROBES, CAPABILITY, lambda: "broken for the test")
        wait_until(lambda: heartbeat.static.capabilities == [], 10, "the capability check thread to run")
    finally:
        heartbeat.stop()
    assert not heartbeat._capability_check._thread.is_alive()


def test_malformed_inline_test_cases_are_a_422_naming_the_reward_and_the_row(api, api_server,
                                                                            job_spec) -> None:
    rows = [*CODE_ROWS, {"prompt": "Say hi.", "tests": [{"input": "", "expected": "hi"}]}]
    before = row_counts(api_server.settings.database_url)
    response = api.post("/v1/jobs", json=code_spec(job_spec, dataset={"prompts": rows}))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "rewards.1.args" and "column 'tests' row 1: case 0" in error["message"], error
    assert row_counts(api_server.settings.database_url) == before



def test_a_tools_job_needs_a_sandboxed_worker_and_tools_the_service_can_describe(api, api_server,
                                                                                 job_spec) -> None:
    settings = api_server.settings
    tools_job = job_spec(tools=[{"source": TOOLS}])
    with bus.connect(settings) as client:
        bus.advertise_worker(client, settings.redis_keys, Heartbeat(worker_id="plain", pool="default"), 60)
        try:
            refused = api.post("/v1/jobs", json=tools_job)
            assert refused.status_code == 422 and refused.json()["error"]["param"] == "tools", refused.text
            assert "code_sandbox" in refused.json()["error"]["message"]
            bus.advertise_worker(client, settings.redis_keys,
                                 Heartbeat(worker_id="boxed", pool="default", capabilities=[CAPABILITY]), 60)
            accepted = api.post("/v1/jobs", json=tools_job)
            assert accepted.status_code == 201, accepted.text
            assert accepted.json()["spec"]["tools"] == [{"source": TOOLS}]
            # Each turn's decode gathers a sharded model, a collective ranks with other turn counts
            # would never meet: refused rather than left to hang.
            sharded = job_spec(tools=[{"source": TOOLS}], resources={"gpus": 2, "sharding": "fsdp"},
                               grpo={"prompts_per_step": 2})
            refused = api.post("/v1/jobs", json=sharded)
            assert refused.status_code == 422 and refused.json()["error"]["param"] == "resources.sharding"
            # Parsed, never run: an argument without a description, an import outside the stdlib.
            for source, said in (("def f(x: int) -> int:\n    '''F.'''\n    return x", "argument 'x'"),
                                 ("import requests\n" + TOOLS, "'requests'")):
                bad = api.post("/v1/jobs", json=job_spec(tools=[{"source": source}]))
                assert bad.status_code == 422, bad.text
                error = bad.json()["error"]
                assert error["param"] == "tools.0.source" and said in error["message"]
        finally:
            client.delete(settings.redis_keys.worker("plain"), settings.redis_keys.worker("boxed"))


ENVIRONMENT = ("class Environment:\n    def reset(self, item):\n        return None\n"
               "    def step(self, action):\n        return {'reward': 1.0, 'done': True}\n")


def test_an_environment_job_needs_a_sandboxed_worker_and_an_environment_class(api, api_server,
                                                                              job_spec) -> None:
    settings = api_server.settings
    environment_job = job_spec(rewards=[], environment={"source": ENVIRONMENT, "max_turns": 2})
    with bus.connect(settings) as client:
        bus.advertise_worker(client, settings.redis_keys, Heartbeat(worker_id="plain", pool="default"), 60)
        try:
            refused = api.post("/v1/jobs", json=environment_job)
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"]["param"] == "environment"
            assert "code_sandbox" in refused.json()["error"]["message"]
            bus.advertise_worker(client, settings.redis_keys,
                                 Heartbeat(worker_id="boxed", pool="default", capabilities=[CAPABILITY]), 60)
            accepted = api.post("/v1/jobs", json=environment_job)
            assert accepted.status_code == 201, accepted.text
            assert accepted.json()["spec"]["environment"]["max_turns"] == 2
            assert accepted.json()["spec"]["rewards"] == []
            # Parsed, never run: no Environment class, an import outside the stdlib.
            for source, said in (("x = 1\n", "class Environment"), ("import requests\n" + ENVIRONMENT,
                                                                       "'requests'")):
                bad = api.post("/v1/jobs", json=job_spec(rewards=[], environment={"source": source}))
                assert bad.status_code == 422, bad.text
                error = bad.json()["error"]
                assert error["param"] == "environment.source" and said in error["message"], error
            neither = api.post("/v1/jobs", json=job_spec(rewards=[]))
            assert neither.status_code == 422 and neither.json()["error"]["param"] == "rewards"
        finally:
            client.delete(settings.redis_keys.worker("plain"), settings.redis_keys.worker("boxed"))


def test_an_environment_server_job_needs_the_server_registered_not_a_sandbox(api, api_server,
                                                                             job_spec) -> None:
    """A server-backed environment runs on the server: no sandbox asked of the pool's workers;
    the server's name must be registered for the team or the pool, as a verifier's is."""
    settings = api_server.settings
    spec = job_spec(rewards=[], environment={"server": "games-at-submit", "max_turns": 3})
    with bus.connect(settings) as client:
        bus.advertise_worker(client, settings.redis_keys, Heartbeat(worker_id="plain", pool="default"), 60)
        try:
            refused = api.post("/v1/jobs", json=spec)
            assert refused.status_code == 422 and refused.json()["error"]["param"] == "environment.server"
            assert "no environment server 'games-at-submit'" in refused.json()["error"]["message"]
            registered = api.put("/v1/admin/verifiers/games-at-submit",
                                 json={"pool": "default", "url": "http://games.example:8000"})
            assert registered.status_code == 200, registered.text
            accepted = api.post("/v1/jobs", json=spec)
            assert accepted.status_code == 201, accepted.text  # the plain worker suffices
            assert accepted.json()["spec"]["environment"]["server"] == "games-at-submit"
            assert "source" not in accepted.json()["spec"]["environment"]
        finally:
            client.delete(settings.redis_keys.worker("plain"))
            api.delete("/v1/admin/verifiers/games-at-submit")
