"""``grpo list | show | watch | cancel | events | metrics | cluster | queue | submit`` through
``api.cli.main.main`` against the module's real uvicorn server (Postgres and SQLite), with the
scripted worker making steps and events: text for people, ``--json`` equal to the API's own
answer, and the exit codes (0 ok, 1 failed job or no API, 2 bad input)."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
import redis
import yaml
from waiting import wait_until

from api.cli.dev import free_port
from api.cli.main import main
from api.scheduling.scheduler import Scheduler
from api.store import bus
from api.store.db import session_scope
from api.store.pools import ensure_pool
from api.store.teams import set_quota
from api.vocabulary import Heartbeat


class Grpo:
    """``grpo(*argv, key=...) -> (exit code, stdout, stderr)``, in-process, against one server."""

    def __init__(self, capsys: pytest.CaptureFixture[str], url: str, key: str) -> None:
        self.capsys, self.url, self.key = capsys, url, key

    def __call__(self, *argv: str, key: str | None = None, url: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main([*argv, "--api-url", url or self.url, "--api-key", key or self.key])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str, key: str | None = None):
        code, out, err = self(*argv, "--json", key=key)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def grpo(capsys, api_server, team_keys) -> Grpo:
    return Grpo(capsys, api_server.http_url, team_keys.alpha)


@pytest.fixture
def alpha(client_for, team_keys):
    return client_for(team_keys.alpha)


def new_job(client, job_spec, **overrides) -> dict:
    response = client.post("/v1/jobs", json=job_spec(name=f"mon-{uuid.uuid4().hex[:6]}", **overrides))
    assert response.status_code == 201, response.text
    return response.json()


def test_list_and_show_print_tables_and_the_apis_json(grpo, alpha, worker, job_spec, monkeypatch) -> None:
    first, second = new_job(alpha, job_spec), new_job(alpha, job_spec)
    worker.start(second["id"])
    monkeypatch.setattr("api.cli.client.JOBS_PAGE", 1)  # every job a page of its own: the pages are joined
    listed = grpo.json("list", "--all")  # newest first
    assert listed == {"items": alpha.get("/v1/jobs", params={"limit": 100, "order": "desc"}).json()["items"],
                      "next_after": None}
    oldest = grpo.json("list", "--all", "--oldest-first")
    assert oldest["items"] == listed["items"][::-1]
    code, out, err = grpo("list")
    lines = out.splitlines()
    assert code == 0 and err == "" and lines[0].split() == ["ID", "NAME", "STATUS", "STEP", "POOL", "GPUS",
                                                            "PRIORITY", "CREATED", "WAITS", "TAGS"]
    assert any(line.split()[:4] == [str(second["id"]), second["name"], "running", "0/20"] for line in lines)
    running = grpo.json("list", "--status", "running,dispatched")
    assert second["id"] in [job["id"] for job in running["items"]]
    assert first["id"] not in [job["id"] for job in running["items"]]
    for statuses in (("queued", "--status", "running"), ("queued", "running"), ("queued,running",)):
        either = grpo.json("list", "--status", *statuses)["items"]
        assert [job["id"] for job in either][:2] == [second["id"], first["id"]]
    code, out, _ = grpo("list", "--limit", "1")
    assert code == 0 and len(out.splitlines()) == 3 and "--all" in out.splitlines()[-1]
    assert out.splitlines()[1].split()[0] == str(second["id"])  # the newest
    assert grpo.json("list", "--limit", "1")["next_after"] is not None

    assert grpo.json("show", str(second["id"])) == alpha.get(f"/v1/jobs/{second['id']}").json()
    code, out, _ = grpo("show", str(second["id"]))
    fields = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines()[1:]}
    assert code == 0 and out.splitlines()[0] == f"job {second['id']}  {second['name']}"
    assert fields["status"] == "running (attempt 1, worker scripted)"
    assert fields["progress"].endswith("] 0/20   0%") and fields["placement"].startswith("pool default")


def test_exit_codes_and_one_line_errors(grpo, alpha, team_keys, job_spec, worker) -> None:
    job = new_job(alpha, job_spec)
    for argv in (("show", str(job["id"])), ("events", str(job["id"])), ("metrics", str(job["id"])),
                 ("cancel", str(job["id"])), ("watch", str(job["id"]))):
        code, out, err = grpo(*argv, key=team_keys.beta)  # another team's job is not found
        assert (code, out) == (2, ""), argv
        assert err == f"error: HTTP 404: job {job['id']} not found (param: job_id)\n"
    assert grpo("show", "987654")[0] == 2
    code, _, err = grpo("list", "--status", "sleeping")
    assert code == 2 and err.startswith("error: HTTP 422: status:") and len(err.splitlines()) == 1
    down = f"http://127.0.0.1:{free_port()}"
    for argv in (("list",), ("show", "1"), ("watch", "1"), ("cluster",)):
        code, out, err = grpo(*argv, url=down)
        assert code == 1 and out == "" and err.startswith(f"error: cannot reach the API at {down}"), argv
    assert grpo("list", url="127.0.0.1:8000")[0] == 2  # no scheme: a bad argument
    code, _, err = grpo("list", key="grpo_wrong-key")
    assert code == 1 and "HTTP 401" in err
    worker.start(job["id"])
    worker.finish(job["id"])
    code, _, err = grpo("cancel", str(job["id"]))
    assert code == 2 and "HTTP 409" in err
    with pytest.raises(SystemExit) as bad:
        main(["list", "--limit", "0"])
    assert bad.value.code == 2


def test_a_refused_or_missing_key_and_an_unreachable_api_say_what_to_do(grpo, api_server,
                                                                        monkeypatch) -> None:
    monkeypatch.delenv("GRPO_API_KEY", raising=False)
    grpo.capsys.readouterr()
    code = main(["list", "--api-url", api_server.http_url])  # no --api-key, no GRPO_API_KEY
    out, err = grpo.capsys.readouterr()
    assert (code, out) == (1, "") and "HTTP 401" in err and len(err.splitlines()) == 1
    assert "no API key was given: set GRPO_API_KEY or pass --api-key" in err
    code, _, err = grpo("list", key="grpo_wrong-key")
    assert code == 1 and "refused the key from --api-key (or GRPO_API_KEY)" in err
    down = f"http://127.0.0.1:{free_port()}"
    code, _, err = grpo("list", url=down)
    assert code == 1 and err.startswith(f"error: cannot reach the API at {down}") and "`grpo dev`" in err


def test_json_prints_the_error_body_on_failure(grpo, alpha, team_keys, job_spec, client_for) -> None:
    """A script reading ``--json`` gets a document on failure too: the API's error body as it was
    sent, or one of the same shape when no API answered."""
    job = new_job(alpha, job_spec)
    for argv, key, path in ((("show", str(job["id"])), team_keys.beta, f"/v1/jobs/{job['id']}"),
                            (("list",), "grpo_wrong-key", "/v1/jobs"),
                            (("list", "--status", "sleeping"), team_keys.alpha, "/v1/jobs?status=sleeping")):
        code, out, err = grpo(*argv, "--json", key=key)
        assert code in (1, 2) and err.startswith("error: HTTP "), argv
        assert json.loads(out) == client_for(key).get(path).json(), argv
    code, out, err = grpo("list", "--json", url=f"http://127.0.0.1:{free_port()}")
    error = json.loads(out)["error"]
    assert code == 1 and error["code"] == "api_unreachable" and error["message"] in err
    code, out, _ = grpo("queue", "--pool", "nowhere", "--json")  # refused here, not by the API
    assert code == 2 and json.loads(out)["error"]["message"] == "--pool: no pool 'nowhere'"


def test_cancel_a_queued_and_a_running_job(grpo, alpha, job_spec, worker) -> None:
    queued, running = new_job(alpha, job_spec), new_job(alpha, job_spec)
    assert grpo("cancel", str(queued["id"]))[:2] == (0, f"job {queued['id']} cancelled\n")
    worker.start(running["id"])
    cancelling = grpo.json("cancel", str(running["id"]))
    assert cancelling["status"] == "cancelling" and cancelling["cancel_requested"]
    assert alpha.get(f"/v1/jobs/{running['id']}").json()["status"] == "cancelling"


def test_rm_deletes_a_finished_job_and_says_why_it_will_not_delete_another(grpo, alpha, job_spec) -> None:
    queued, finished = new_job(alpha, job_spec), new_job(alpha, job_spec)
    code, out, err = grpo("rm", str(queued["id"]))
    assert code == 2 and f"job {queued['id']} is queued" in err  # the API's 409, bad input
    assert alpha.get(f"/v1/jobs/{queued['id']}").status_code == 200
    grpo("cancel", str(finished["id"]))
    assert grpo("rm", str(finished["id"]))[:2] == (0, f"job {finished['id']} deleted, with its artifacts\n")
    assert alpha.get(f"/v1/jobs/{finished['id']}").status_code == 404
    grpo("cancel", str(queued["id"]))
    assert grpo.json("delete", str(queued["id"])) == {"id": queued["id"], "deleted": True}
    code, _, err = grpo("rm", str(queued["id"]))
    assert code == 2 and f"job {queued['id']} not found" in err


def test_events_and_metrics_read_every_page(grpo, alpha, job_spec, worker, monkeypatch) -> None:
    job = new_job(alpha, job_spec)
    worker.start(job["id"])
    for step in (1, 2, 3):
        worker.step(job["id"], step)
    worker.event(job["id"], "checkpoint", "saved step 3", {"step": 3})
    monkeypatch.setattr("api.cli.client.TELEMETRY_PAGE", 2)
    job_id = str(job["id"])

    events = grpo.json("events", job_id)
    assert events == {"items": alpha.get(f"/v1/jobs/{job_id}/events").json()["items"], "next_after": None}
    code, out, _ = grpo("events", job_id)
    assert code == 0 and out.splitlines()[0].split() == ["ID", "TIME", "LEVEL", "TYPE", "MESSAGE"]
    assert out.splitlines()[-1].split()[3:] == ["info", "checkpoint", "saved", "step", "3"]

    assert grpo("metrics", job_id, "--csv") == (0, (
        "step,clip_ratio/region_mean,kl,loss,reward,reward_std,rewards/exact_match/mean\n"
        "1,0.02,0.001,0.0,0.01,0.5,0.01\n"
        "2,0.02,0.002,0.0,0.02,0.5,0.02\n"
        "3,0.02,0.003,0.0,0.03,0.5,0.03\n"), "")
    assert grpo("metrics", job_id, "--csv", "--names", "reward,kl")[1] == \
        "step,reward,kl\n1,0.01,0.001\n2,0.02,0.002\n3,0.03,0.003\n"
    assert grpo("metrics", job_id, "--csv", "--names", "kl", "--names", "nothing")[0] == 2  # no such metric
    metrics = grpo.json("metrics", job_id)
    assert metrics == {"items": alpha.get(f"/v1/jobs/{job_id}/metrics").json()["items"], "next_after": None}
    code, out, _ = grpo("metrics", job_id)
    assert out.splitlines()[0].split() == ["STEP", "reward", "reward_std", "kl", "clip_ratio/region_mean",
                                           "loss"]
    assert out.splitlines()[3].split() == ["3", "0.03", "0.5", "0.003", "0.02", "0"]
    fresh = new_job(alpha, job_spec)
    assert grpo("metrics", str(fresh["id"])) == (0, "no steps yet\n", "")
    assert grpo("metrics", str(fresh["id"]), "--csv")[1] == "step\n"


@pytest.fixture
def own_pool(api_server, team_keys):
    """A pool of one live 1-GPU worker, where alpha may hold 2 GPUs."""
    pool, worker_id = f"m{uuid.uuid4().hex[:8]}", f"w-{uuid.uuid4().hex[:6]}"
    with session_scope(api_server.settings.database_url) as session:
        ensure_pool(session, pool)
        set_quota(session, "alpha", pool, 2)
    client = redis.Redis.from_url(api_server.settings.redis_url)
    beat = Heartbeat(worker_id=worker_id, pool=pool, gpus=1, gpu_model="H200", gpu_memory_mb=143771,
                     hostname="node-1")
    keys = api_server.settings.redis_keys
    bus.advertise_worker(client, keys, beat, 60)
    yield pool, worker_id
    client.delete(keys.worker(worker_id), keys.worker_queue(worker_id))
    client.close()


def test_cluster_and_queue(grpo, alpha, api_server, job_spec, own_pool) -> None:
    pool, worker_id = own_pool
    first, second = (new_job(alpha, job_spec, resources={"pool": pool}) for _ in range(2))
    Scheduler(api_server.settings).tick()  # the first gets the GPU; the second waits

    queue = grpo.json("queue", "--pool", pool)
    assert queue == alpha.get("/v1/queue", params={"pool": pool}).json()
    code, out, _ = grpo("queue", "--pool", pool)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("Queue (scheduler pass ")
    assert f"waiting per pool: {pool} 1" in lines[0]
    assert lines[1].split() == ["POS", "JOB", "NAME", "TEAM", "POOL", "GPUS", "PRIORITY", "WAITS", "FOR"]
    assert lines[2].split()[:5] == ["1", str(second["id"]), second["name"], "alpha", pool]

    both = grpo.json("cluster")
    assert set(both) == {"cluster", "queue"}
    assert both["queue"]["items"] == alpha.get("/v1/queue").json()["items"]
    assert pool in [p["name"] for p in both["cluster"]["pools"]]
    code, out, _ = grpo("cluster")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "Pools"
    assert next(line for line in lines if line.startswith(f"{pool} ")).split() == \
        [pool, "open", "1", "1", "0", "1", "1", "1"]  # the largest worker's GPUs
    assert next(line for line in lines if line.startswith(worker_id)).split() == \
        [worker_id, pool, "1", "H200", "143771", "busy", f"0:{first['id']}", "node-1"]
    alpha_row = next(line for line in lines if line.startswith("alpha ") and f" {pool} " in line).split()
    assert alpha_row[2:6] == [pool, "1", "[█████", "]"] and alpha_row[6] == "1/2"
    assert any(line.split()[:3] == [str(first["id"]), "alpha", pool] for line in lines)


def test_show_and_queue_say_what_each_code_means(grpo, alpha, api_server, job_spec, pool, worker) -> None:
    from api.domain.explanations import ERROR_CODES, PENDING_REASONS
    from api.domain.lifecycle import JobStatus
    from api.store import attempts

    waiting = new_job(alpha, job_spec, resources={"pool": pool})  # a pool without workers
    Scheduler(api_server.settings).tick()
    code, out, _ = grpo("show", str(waiting["id"]))
    waits = next(line for line in out.splitlines() if line.startswith("waits "))
    assert code == 0 and waits.endswith(f"no_workers: {PENDING_REASONS['no_workers']}")
    code, out, _ = grpo("queue", "--pool", pool)
    assert code == 0 and out.splitlines()[-1] == f"no_workers: {PENDING_REASONS['no_workers']}"

    failed = new_job(alpha, job_spec)
    worker.start(failed["id"])
    with session_scope(api_server.settings.database_url) as session:
        message = "no step for 1800 s"
        attempts.finish(session, failed["id"], worker_id="scripted", outcome=JobStatus.FAILED,
                        message=message, error_code="stalled", error_message=message)
    code, out, _ = grpo("show", str(failed["id"]))
    fields = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines()[1:]}
    assert code == 1 and fields["error"] == "[stalled] no step for 1800 s"
    assert fields["meaning"] == ERROR_CODES["stalled"]


def open_streams(admin) -> float:
    """The API process's open job streams, as its ``/metrics`` reports them."""
    lines = admin.get("/metrics").text.splitlines()
    return float(next(line.split()[1] for line in lines if line.startswith("grpo_stream_subscribers ")))


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_watch_follows_a_job_until_it_ends(grpo, alpha, job_spec, worker, outcome, client_for,
                                           team_keys) -> None:
    job = new_job(alpha, job_spec)
    worker.start(job["id"])
    admin = client_for(team_keys.admin)
    wait_until(lambda: open_streams(admin) == 0, 10, "earlier tests' streams to close")

    problems: list[AssertionError] = []

    def run() -> None:  # the only user of the worker while it runs
        try:  # the steps come once `watch` follows the job live, not from its backlog
            wait_until(lambda: open_streams(admin) == 1, 10, "`grpo watch` to open the job's stream")
        except AssertionError as problem:  # the job still ends, or `watch` would wait for ever
            problems.append(problem)
        for step in (1, 2, 3):
            worker.step(job["id"], step)
        worker.finish(job["id"], outcome)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        code, out, err = grpo("watch", str(job["id"]))
    finally:
        thread.join(timeout=30)
    assert not problems, problems
    lines = out.splitlines()
    assert code == (0 if outcome == "succeeded" else 1), err
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1/20", "2/20", "3/20"]
    assert lines[-1].startswith(f"job {job['id']} {outcome} at step 3")
    replay_code, replay, _ = grpo("watch", str(job["id"]))  # a finished job: its backlog, then its end
    steps = [line for line in lines if line.startswith("step ")]
    assert replay_code == code and [line for line in replay.splitlines() if line.startswith("step ")] == steps
    assert replay.splitlines()[-1] == lines[-1]
    code, out, _ = grpo("watch", str(job["id"]), "--json")
    assert (code, json.loads(out)) == (replay_code, alpha.get(f"/v1/jobs/{job['id']}").json())


def test_watch_on_a_terminal_redraws_one_frame_in_place(grpo, alpha, job_spec, worker, monkeypatch) -> None:
    job = new_job(alpha, job_spec)
    worker.start(job["id"])
    for step in (1, 2, 3):
        worker.step(job["id"], step)
    worker.finish(job["id"])
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "72")
    code, out, _ = grpo("watch", str(job["id"]))
    frames = out.split("\x1b[J")  # each repaint first moves up over the last frame and clears it
    assert code == 0 and len(frames) > 3 and all(frame.count("\x1b[") == 1 for frame in frames[1:-1])
    last = frames[-1].splitlines()
    assert last[0] == f"job {job['id']} {job['name']} · succeeded"
    assert last[1].endswith("] 3/20  15%") and last[2].startswith("reward") and "0.01..0.03" in last[2]
    assert last[-1] == f"job {job['id']} succeeded at step 3"


def test_watch_draws_a_series_that_stays_at_zero_on_the_floor(grpo, alpha, job_spec, worker,
                                                              monkeypatch) -> None:
    job = new_job(alpha, job_spec)
    worker.start(job["id"])
    for step in (1, 2, 3):  # nothing clipped, no divergence from the reference: flat at zero
        worker.reporter(job["id"]).on_step({"step": step, "reward": 0.1 * step, "kl": 0.0,
                                            "clip_ratio/region_mean": 0.0})
    worker.finish(job["id"])
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "72")
    code, out, _ = grpo("watch", str(job["id"]))
    last = out.split("\x1b[J")[-1].splitlines()
    assert code == 0 and last[3].split() == ["KL", "0", "▁▁▁"] and last[4].split() == ["clipfrac", "0", "▁▁▁"]
    assert last[2].split()[-1] == "0.1..0.3"  # a series that moves still spans its range


def test_submit_prints_the_new_job(grpo, alpha, job_spec, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job_spec(name="from-the-cli")))
    code, out, _ = grpo("submit", str(spec))
    job_id = int(out.split()[2])
    assert code == 0 and out == f"submitted job {job_id} (from-the-cli): queued\n"
    again = grpo.json("submit", str(spec), "--idempotency-key", "k-" + uuid.uuid4().hex)
    assert again == alpha.get(f"/v1/jobs/{again['id']}").json() and again["team_id"] == \
        alpha.get(f"/v1/jobs/{job_id}").json()["team_id"]


def test_server_strings_reach_the_terminal_inert(grpo, alpha, job_spec) -> None:
    """A job named with ESC sequences (clear the screen, retitle the window, ring the bell)
    is listed and shown with those characters as visible escapes, never obeyed."""
    hostile = "evil\x1b[2J\x1b]0;owned\x07\rname"
    job = alpha.post("/v1/jobs", json=job_spec(name=hostile)).json()
    for argv in (("list",), ("show", str(job["id"]))):
        code, out, _ = grpo(*argv)
        assert code == 0 and "\\x1b[2J\\x1b]0;owned\\x07\\x0dname" in out
        assert not any(char in out for char in "\x1b\x07\r")
    assert grpo.json("show", str(job["id"]))["name"] == hostile  # --json keeps the exact string


def test_printable_keeps_layout_and_escapes_every_other_control_character() -> None:
    from api.cli.printable import printable

    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("\x00\x1b\x7f\x9b é") == "\\x00\\x1b\\x7f\\x9b é"


def test_rough_edges_team_names_exit_codes_unknown_names_and_pools(grpo, alpha, job_spec, worker,
                                                                   team_keys) -> None:
    job = new_job(alpha, job_spec)
    worker.start(job["id"])
    worker.step(job["id"], 1)
    code, out, _ = grpo("show", str(job["id"]))
    assert code == 0 and f"team        alpha (id {job['team_id']})" in out
    code, out, _ = grpo("show", str(job["id"]), key=team_keys.admin)  # an admin sees any team's name
    assert code == 0 and "alpha (id" in out
    worker.finish(job["id"], "failed")
    assert grpo("show", str(job["id"]))[0] == 1  # a failed job, as `grpo watch` says it

    code, _, err = grpo("metrics", str(job["id"]), "--names", "reward,rewardz")
    assert code == 2 and "no step of job" in err and "rewardz" in err and "reward_std" in err
    code, _, err = grpo("queue", "--pool", "nowhere")
    assert code == 2 and "--pool: no pool 'nowhere'" in err


def test_a_reader_that_goes_away_ends_the_output_quietly(api_server, alpha, job_spec, worker,
                                                         team_keys) -> None:
    """`grpo metrics ID | head -1`: no BrokenPipeError traceback, the exit status of a pipe's writer.
    (The reader here, ``true``, reads nothing and is gone before the first line is written.)"""
    import subprocess
    import sys

    job = new_job(alpha, job_spec)
    worker.start(job["id"])
    for step in range(1, 4):
        worker.step(job["id"], step)
    command = (f"{sys.executable} -m api.cli.main metrics {job['id']} --api-url {api_server.http_url} "
               f"--api-key {team_keys.alpha} | true")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in done.stderr and done.returncode == 141, done.stderr
