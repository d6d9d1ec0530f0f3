"""Large specs over real HTTP (Postgres and SQLite): a submission's parsing and checks run off the
event loop, a bounded number at a time (``GRPO_SPEC_VALIDATION_SLOTS``), and a page of jobs with
their specs stays within ``GRPO_LIST_SPEC_BYTES``, so one team's megabyte specs neither stall nor
fill the API for the others."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml


@pytest.fixture
def member(client_for, team_keys, api_server, make_key):
    """A member client of a team of the test's own (its jobs are the only ones it lists)."""
    name = f"big-{uuid.uuid4().hex[:8]}"
    admin = client_for(team_keys.admin)
    assert admin.post("/v1/admin/teams", json={"name": name}).status_code == 201
    # Its megabyte of specs is past a member's default write burst (a token per 8 KiB).
    assert admin.put(f"/v1/admin/teams/{name}/limits", json={"write_burst": 1000}).status_code == 200
    return make_key(api_server.settings.database_url, name)


def rows(count: int, width: int = 180) -> list[dict]:
    return [{"prompt": f"row {n} " + "z" * width, "answer": str(n)} for n in range(count)]


def test_a_page_with_specs_stays_within_its_byte_budget(member, client_for, serve_api, api_server,
                                                        api_settings_factory, job_spec) -> None:
    budget = 300_000
    settings = api_settings_factory(api_server.settings.database_url, list_spec_bytes=budget)
    with serve_api(settings) as server:
        client = client_for(member, server)
        sizes = [600, 600, 600, 2000]  # rows of ~200 bytes: 120 kB, 120 kB, 120 kB, then 400 kB alone
        ids = [client.post("/v1/jobs", json=job_spec(dataset={"prompts": rows(n)})).json()["id"]
               for n in sizes]
        pages, after = [], 0
        while after is not None:
            response = client.get("/v1/jobs", params={"include": "spec", "limit": 100, "after": after})
            assert response.status_code == 200, response.text
            page = response.json()
            pages.append(([job["id"] for job in page["items"]], len(response.content)))
            assert all(len(job["spec"]["dataset"]["prompts"]) == sizes[ids.index(job["id"])]
                       for job in page["items"])
            after = page["next_after"]
    assert [ids_ for ids_, _ in pages] == [ids[:2], ids[2:3], ids[3:]]
    assert all(size < budget + 20_000 for _, size in pages[:2])  # the last: one spec over the budget alone
    summaries = client_for(member).get("/v1/jobs", params={"limit": 100}).json()
    assert [job["id"] for job in summaries["items"]] == ids and summaries["next_after"] is None


def probe_during(api_server, work) -> tuple[float, float]:
    """``(seconds work took, slowest /healthz answer meanwhile)``: /healthz is an ``async`` route,
    so its answer time is how long the server's event loop was busy elsewhere."""
    import httpx

    done, slowest = threading.Event(), [0.0]

    def probe() -> None:
        with httpx.Client(base_url=api_server.http_url, trust_env=False, timeout=60) as client:
            while not done.is_set():
                start = time.perf_counter()
                client.get("/healthz")
                slowest[0] = max(slowest[0], time.perf_counter() - start)
                time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    start = time.perf_counter()
    try:
        work()
    finally:
        took = time.perf_counter() - start
        done.set()
        prober.join()
    return took, slowest[0]


def test_a_large_yaml_spec_is_parsed_off_the_event_loop(member, client_for, api_server, job_spec) -> None:
    client = client_for(member)
    # ~0.9 MiB of small scalars: the costliest YAML to parse that fits a request.
    scalars = [{"prompt": "p", "ids": list(range(80_000))}]
    body = yaml.safe_dump(job_spec(dataset={"prompts": scalars})).encode()
    answers = []

    def submit() -> None:
        answers.append(client.post("/v1/jobs", content=body, headers={"Content-Type": "application/yaml"},
                                   timeout=120))

    took, slowest = probe_during(api_server, submit)
    assert answers[0].status_code == 201, answers[0].text
    assert took > 0.3, "the YAML parsed too fast to tell whether it blocked the loop"
    assert slowest < took / 3, (slowest, took)


def test_submissions_take_turns_on_the_validation_slots(client_for, serve_api, api_server,
                                                        api_settings_factory, job_spec, api_token) -> None:
    settings = api_settings_factory(api_server.settings.database_url, spec_validation_slots=1)
    body = json.dumps(job_spec(dataset={"prompts": rows(4000)})).encode()
    with serve_api(settings) as server:
        # The operator token: four megabyte submits at once are past a member's write limit.
        client = operator = client_for(api_token, server)
        seen: list[tuple[int, int]] = []

        def scrape() -> None:
            text = operator.get("/metrics").text
            values = {line.split('"')[1]: int(float(line.rsplit(" ", 1)[1]))
                      for line in text.splitlines() if line.startswith("grpo_spec_intake{")}
            seen.append((values["running"], values["waiting"]))

        def submit(_: int) -> int:
            return client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"},
                               timeout=120).status_code

        with ThreadPoolExecutor(4) as pool:
            answers = pool.map(submit, range(4))
            while len(seen) < 200 and not any(waiting >= 2 for _, waiting in seen):
                scrape()
            codes = list(answers)
        scrape()
    assert codes == [201] * 4
    assert max(running for running, _ in seen) == 1 and max(waiting for _, waiting in seen) >= 2, seen
    assert seen[-1] == (0, 0)
