"""The isolation matrix: every ``/v1`` route of the app (HTTP and WebSocket), enumerated from
``create_app(...).routes``, must be classified in :data:`ROUTES`; then, for each class, every
route present is called with no key, another team's member key, the owner's key and an admin
key. A route nobody classified fails :func:`test_every_v1_route_is_classified`."""

from __future__ import annotations

import pytest
from fastapi.routing import APIWebSocketRoute
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from api.main import create_app

try:  # FastAPI >= 0.16x keeps included routers nested in app.routes; this walks them
    from fastapi.routing import iter_route_contexts
except ImportError:  # older ones flattened them into app.routes
    iter_route_contexts = iter

ANY = "any"  # no team's data: any valid key gets 200
TEAM = "team"  # the caller's own team (list, submit): any valid key, results scoped to its team
JOB = "job"  # one job: another team's member key gets 404 (as if it did not exist); admins see it
ADMIN = "admin"  # /v1/admin: admin keys only; a member key gets 403

WS = "WS"  # the "method" of a WebSocket route
_JOB = "/v1/jobs/{job_id}"
_FTJOB = "/v1/fine_tuning/jobs/{fine_tuning_job_id}"
ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/v1/rewards"): ANY,
    ("GET", "/v1/codes"): ANY,
    ("GET", "/v1/lifecycle"): ANY,
    ("GET", "/v1/me"): ANY,
    ("GET", "/v1/queue"): ANY,
    ("GET", "/v1/cluster"): ANY,
    ("GET", "/v1/jobs"): TEAM,
    ("GET", "/v1/jobs/compare"): JOB,  # every id must be the caller's: alpha's job and its twin here
    ("GET", "/v1/usage"): TEAM,  # GPU-seconds of the caller's team only (test_usage.py)
    ("POST", "/v1/rewards/run"): TEAM,  # verifiers of the caller's team only (test_reward_trials.py)
    # Environment servers of the caller's team only (test_environment_trials.py).
    ("POST", "/v1/environments/run"): TEAM,
    # OpenAI's grader endpoints: the rewards dry run in OpenAI's shapes (test_openai_graders_api.py).
    ("POST", "/v1/fine_tuning/alpha/graders/run"): TEAM,
    ("POST", "/v1/fine_tuning/alpha/graders/validate"): TEAM,
    ("POST", "/v1/jobs"): TEAM,
    ("POST", "/v1/stream-tickets"): TEAM,  # a ticket stands for the caller's own key (test_hardening.py)
    # The caller's team's webhooks; another team's is a 404 on each {webhook_id} route (test_webhooks.py).
    ("POST", "/v1/webhooks"): TEAM,
    ("GET", "/v1/webhooks"): TEAM,
    ("GET", "/v1/webhooks/{webhook_id}"): TEAM,
    ("DELETE", "/v1/webhooks/{webhook_id}"): TEAM,
    ("GET", "/v1/webhooks/{webhook_id}/deliveries"): TEAM,
    # The caller's team's uploads; another team's is a 404 on each {file_id} route and unusable in a
    # spec (test_files.py).
    ("POST", "/v1/files"): TEAM,
    ("GET", "/v1/files"): TEAM,
    ("GET", "/v1/files/{file_id}"): TEAM,
    ("GET", "/v1/files/{file_id}/content"): TEAM,
    ("DELETE", "/v1/files/{file_id}"): TEAM,
    # OpenAI's fine-tuning API on the same jobs (test_fine_tuning_api.py): ftjob-N is job N.
    ("POST", "/v1/fine_tuning/jobs"): TEAM,
    ("GET", "/v1/fine_tuning/jobs"): TEAM,
    ("GET", _FTJOB): JOB,
    ("POST", f"{_FTJOB}/cancel"): JOB,
    ("POST", f"{_FTJOB}/pause"): JOB,
    ("POST", f"{_FTJOB}/resume"): JOB,
    ("GET", f"{_FTJOB}/events"): JOB,
    ("GET", f"{_FTJOB}/checkpoints"): JOB,
    ("GET", _JOB): JOB,
    ("PATCH", _JOB): JOB,
    ("DELETE", _JOB): JOB,  # the owner deletes a finished job (test_job_deletion.py)
    ("POST", f"{_JOB}/cancel"): JOB,
    ("GET", f"{_JOB}/events"): JOB,
    ("GET", f"{_JOB}/metrics"): JOB,
    ("GET", f"{_JOB}/samples"): JOB,
    ("GET", f"{_JOB}/checkpoints"): JOB,
    ("GET", f"{_JOB}/checkpoints/{{step}}/archive"): JOB,
    ("GET", f"{_JOB}/model"): JOB,
    ("GET", f"{_JOB}/tensorboard"): JOB,
    ("POST", f"{_JOB}/clone"): JOB,
    ("GET", f"{_JOB}/clone"): JOB,
    ("POST", f"{_JOB}/pause"): JOB,
    ("POST", f"{_JOB}/resume"): JOB,
    ("POST", f"{_JOB}/retry"): JOB,
    # Chat with a job's model (`model: job:ID`): another team's job is a 404 (tests/e2e/test_chat.py).
    ("POST", "/v1/chat/completions"): JOB,
    ("POST", "/v1/completions"): JOB,
    (WS, f"{_JOB}/stream"): JOB,
    ("POST", "/v1/admin/teams"): ADMIN,
    ("GET", "/v1/admin/teams"): ADMIN,
    ("PATCH", "/v1/admin/teams/{team}"): ADMIN,
    ("PUT", "/v1/admin/teams/{team}/quotas/{pool}"): ADMIN,
    ("PATCH", "/v1/admin/teams/{team}/quotas/{pool}"): ADMIN,
    ("DELETE", "/v1/admin/teams/{team}/quotas/{pool}"): ADMIN,
    ("POST", "/v1/admin/teams/{team}/keys"): ADMIN,
    ("GET", "/v1/admin/keys"): ADMIN,
    ("POST", "/v1/admin/keys/{key_id}/revoke"): ADMIN,
    ("POST", "/v1/admin/pools"): ADMIN,
    ("GET", "/v1/admin/pools"): ADMIN,
    ("POST", "/v1/admin/pools/{pool}/hold"): ADMIN,
    ("POST", "/v1/admin/pools/{pool}/resume"): ADMIN,
    ("PUT", "/v1/admin/pools/{pool}/limits"): ADMIN,
    ("PUT", "/v1/admin/teams/{team}/artifact-quota"): ADMIN,
    ("DELETE", "/v1/admin/teams/{team}/artifact-quota"): ADMIN,
    ("PUT", "/v1/admin/teams/{team}/limits"): ADMIN,
    ("PUT", "/v1/admin/verifiers/{verifier}"): ADMIN,
    ("GET", "/v1/admin/verifiers"): ADMIN,
    ("GET", "/v1/admin/verifiers/{verifier}"): ADMIN,
    ("DELETE", "/v1/admin/verifiers/{verifier}"): ADMIN,
}
ENVIRONMENT = ("class Environment:\n    def reset(self, item):\n        return None\n"
               "    def step(self, action):\n        return {'done': True}\n")
# Valid bodies where a route reads one, so the team check, not validation, decides the answer.
_GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
           "reference": "{{item.answer}}", "operation": "eq"}
BODIES = {("PATCH", _JOB): {"priority": "low"},
          ("POST", "/v1/rewards/run"): {"rewards": [{"name": "contains", "args": {"text": "4"}}],
                                        "samples": [{"prompt": "2+2?", "completion": "4"}]},
          ("POST", "/v1/environments/run"): {"environment": {"source": ENVIRONMENT}, "actions": ["a"]},
          ("POST", "/v1/fine_tuning/alpha/graders/run"): {"grader": _GRADER, "model_sample": "4",
                                                           "item": {"answer": "4"}},
          ("POST", "/v1/fine_tuning/alpha/graders/validate"): {"grader": _GRADER},
          # A body naming the job: a callable of its id.
          ("POST", "/v1/chat/completions"): lambda job_id: {
              "model": f"job:{job_id}", "messages": [{"role": "user", "content": "hi"}]},
          ("POST", "/v1/completions"): lambda job_id: {"model": f"job:{job_id}", "prompt": "hi"}}
# Query strings where a route needs one; formatted as the path is (twin_id: a second job of alpha).
QUERIES = {("GET", "/v1/jobs/compare"): "?ids={job_id},{twin_id}"}


def v1_routes(settings) -> set[tuple[str, str]]:
    """``(method, path)`` of every /v1 route the app serves; ``WS`` for WebSockets."""
    found: set[tuple[str, str]] = set()
    for route in iter_route_contexts(create_app(settings).routes):
        if isinstance(getattr(route, "original_route", route), APIWebSocketRoute):
            found.add((WS, route.path))
        else:
            found.update((method, route.path) for method in route.methods or ())
    return {(method, path) for method, path in found if path.startswith("/v1/")}


@pytest.fixture(scope="module")
def present(api_server) -> dict[tuple[str, str], str]:
    """The classified routes this app has (the table may name routes not built yet)."""
    served = v1_routes(api_server.settings)  # once: each call builds the whole app (~1 s)
    return {route: kind for route, kind in ROUTES.items() if route in served}


@pytest.fixture
def alpha_job(client_for, team_keys, job_spec, api_server) -> int:
    """A job of team alpha, with a final model, TensorBoard files and a checkpoint of step 1 to
    download."""
    from api.artifacts.paths import checkpoint_dir, model_dir, tensorboard_dir

    response = client_for(team_keys.alpha).post("/v1/jobs", json=job_spec(name="alpha-only"))
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    step_1 = checkpoint_dir(api_server.settings, job_id) / "step-1"
    for folder, files in ((model_dir(api_server.settings, job_id), ("config.json",)),
                          (tensorboard_dir(api_server.settings, job_id), ("events.out.tfevents.1.host",)),
                          (step_1, ("config.json", "trainer_state.json"))):
        folder.mkdir(parents=True)
        for name in files:
            (folder / name).write_text("{}")
    from api.store.db import session_scope
    from api.store.telemetry import record_checkpoint

    with session_scope(api_server.settings.database_url) as session:  # published, as a worker does
        record_checkpoint(session, job_id, 1, str(step_1), None)
    return job_id


@pytest.fixture
def alpha_twin(client_for, team_keys, job_spec) -> int:
    """A second job of team alpha, for the routes that read several jobs at once."""
    response = client_for(team_keys.alpha).post("/v1/jobs", json=job_spec(name="alpha-twin"))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def status_of(server, client_for, key: str | None, method: str, path: str, job_id: int,
              twin_id: int = 0) -> int:
    """The status a call answers with; for a WebSocket, the handshake's (101: accepted)."""
    url = (path + QUERIES.get((method, path), "")).format(
        job_id=job_id, twin_id=twin_id, team="alpha", pool="default", key_id=1, step=1, verifier="grader",
        webhook_id=1, file_id=f"file-{'0' * 24}", fine_tuning_job_id=f"ftjob-{job_id}")
    if method != WS:
        body = BODIES.get((method, path), {})
        return client_for(key).request(method, url, json=body(job_id) if callable(body) else body).status_code
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    try:
        with connect(server.ws_url + url, additional_headers=headers, proxy=None, open_timeout=5):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


def check(present, kinds: tuple[str, ...], expected: int, call) -> None:
    """``call(method, path)`` for every present route of ``kinds``; all must answer ``expected``
    (a WebSocket handshake that lets the caller in answers 101 where HTTP answers 200)."""
    routes = sorted(route for route, kind in present.items() if kind in kinds)
    assert routes, f"no route of {kinds} in the app: is the table stale?"
    let_in = {200, 101} if expected == 200 else {expected}
    wrong = {f"{m} {p}": got for m, p in routes if (got := call(m, p)) not in let_in}
    assert not wrong, f"expected {expected} from each of these, got: {wrong}"


def test_every_v1_route_is_classified(api_server) -> None:
    served = v1_routes(api_server.settings)
    unclassified = sorted(served - set(ROUTES))
    assert not unclassified, (f"classify these routes in ROUTES of {__file__} (one of {ANY}, {TEAM}, {JOB}, "
                              f"{ADMIN}) so their isolation is tested: {unclassified}")
    assert {("GET", _JOB), (WS, f"{_JOB}/stream"), ("GET", "/v1/admin/teams")} <= served


def test_no_key_is_401_everywhere(api_server, client_for, present, alpha_job, alpha_twin) -> None:
    check(present, (ANY, TEAM, JOB, ADMIN), 401,
          lambda m, p: status_of(api_server, client_for, None, m, p, alpha_job, alpha_twin))


def test_a_member_key_is_403_on_every_admin_route(api_server, client_for, team_keys, present,
                                                  alpha_job) -> None:
    member = team_keys.alpha
    check(present, (ADMIN,), 403, lambda m, p: status_of(api_server, client_for, member, m, p, alpha_job))


def test_another_teams_job_is_404_on_every_job_route(api_server, client_for, team_keys, present, alpha_job,
                                                     alpha_twin,
                                                     api) -> None:
    other = team_keys.beta
    check(present, (JOB,), 404,
          lambda m, p: status_of(api_server, client_for, other, m, p, alpha_job, alpha_twin))
    after = api.get(f"/v1/jobs/{alpha_job}").json()
    assert (after["status"], after["priority"]) == ("queued", "normal")  # no cancel, no PATCH got through


def test_the_owner_and_admins_see_the_job(api_server, client_for, team_keys, present, alpha_job,
                                          alpha_twin) -> None:
    readers = {route: kind for route, kind in present.items() if route[0] in ("GET", WS)}
    for key in (team_keys.alpha, team_keys.admin):
        check(readers, (JOB,), 200,
              lambda m, p, key=key: status_of(api_server, client_for, key, m, p, alpha_job, alpha_twin))


def test_team_routes_are_scoped_to_the_callers_team(client_for, team_keys, alpha_job, job_spec) -> None:
    def listed(key: str) -> set[int]:
        response = client_for(key).get("/v1/jobs", params={"limit": 100})
        assert response.status_code == 200
        return {job["id"] for job in response.json()["items"]}

    beta_job = client_for(team_keys.beta).post("/v1/jobs", json=job_spec(name="beta-only")).json()
    assert beta_job["team_id"] == team_keys.beta_id
    assert alpha_job in listed(team_keys.alpha) and beta_job["id"] not in listed(team_keys.alpha)
    assert beta_job["id"] in listed(team_keys.beta) and alpha_job not in listed(team_keys.beta)
    assert {alpha_job, beta_job["id"]} <= listed(team_keys.admin)


def test_any_valid_key_may_call_the_shared_routes(api_server, client_for, team_keys, present,
                                                  alpha_job) -> None:
    for key in (team_keys.alpha, team_keys.beta, team_keys.admin):
        check({r: k for r, k in present.items() if r[0] == "GET"}, (ANY,), 200,
              lambda m, p, key=key: status_of(api_server, client_for, key, m, p, alpha_job))
