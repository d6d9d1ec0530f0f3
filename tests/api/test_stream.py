"""``WS /v1/jobs/{id}/stream`` with a real websockets client against a uvicorn server, on
Postgres and SQLite, fed by a scripted worker through SQL and the real Redis stream."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from waiting import wait_until
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from api.schemas.jobs import JobRead
from api.store import bus
from api.streaming.config import StreamConfig
from api.streaming.cursor import Cursor
from api.streaming.fanout import Hubs
from api.streaming.messages import to_client
from api.streaming.subscriber import SlowClient, Subscriber


def open_stream(server, job_id: int, token: str | None, *, after: int | None = None,
                query_token: bool = False, subprotocol: bool = False, **options) -> ClientConnection:
    """``token`` as a bearer header; or in the query (which the server refuses); or offered as
    a subprotocol, as a browser does."""
    params = [f"after={after}"] if after is not None else []
    headers = {}
    if token is not None and query_token:
        params.append(f"token={token}")
    elif token is not None and subprotocol:
        options["subprotocols"] = ["grpo.v1", f"grpo.bearer.{token}"]
    elif token is not None:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{server.ws_url}/v1/jobs/{job_id}/stream" + (f"?{'&'.join(params)}" if params else "")
    return connect(url, additional_headers=headers, proxy=None, open_timeout=5, **options)


def read_until_closed(ws: ClientConnection, timeout: float = 10.0) -> tuple[list[dict], int | None]:
    """Every message until the server closes, and the close code it sent."""
    messages = []
    try:
        while True:
            messages.append(json.loads(ws.recv(timeout=timeout)))
    except ConnectionClosed as closed:
        return messages, closed.rcvd.code if closed.rcvd else None


def read_n(ws: ClientConnection, count: int) -> list[dict]:
    return [json.loads(ws.recv(timeout=10)) for _ in range(count)]


def kinds(messages: list[dict]) -> list[str]:
    return [m["type"] for m in messages]


def steps_of(messages: list[dict], kind: str = "metrics") -> list[int]:
    return [m["step"] for m in messages if m["type"] == kind]


def submit(api, job_spec) -> int:
    response = api.post("/v1/jobs", json=job_spec())
    assert response.status_code == 201, response.text
    return response.json()["id"]


# ---- the translation from stream entries to client messages (no server needed) ----

def test_stream_entries_become_client_messages() -> None:
    record = {"step": 3, "reward": 0.5, "kl": 0.01}
    assert to_client("metrics", record) == {"type": "metrics", "step": 3, "values": record}
    rows = [{"prompt": "p", "completion": "c"}]
    assert to_client("samples", {"step": 4, "rows": rows}) == {"type": "samples", "step": 4, "rows": rows}
    event = {"id": 7, "job_id": 1, "ts": "2025-01-01T00:00:00Z", "level": "info", "type": "checkpoint",
             "message": "saved", "data": {"step": 4}}
    assert to_client("event", event) == {"type": "event", "event": {
        "id": 7, "ts": "2025-01-01T00:00:00Z", "level": "info", "type": "checkpoint", "message": "saved",
        "data": {"step": 4}}}
    job = JobRead(id=1, name="n", team_id=1, status="succeeded", priority="normal", pool="default", gpus=1,
                  attempt=1, worker_id="w", max_steps=4, last_step=4, cancel_requested=False,
                  created_at="2025-01-01T00:00:00Z", dispatched_at=None, started_at=None, finished_at=None,
                  heartbeat_at=None, latest_checkpoint=None, error=None, spec={})
    status = to_client("status", {"status": "succeeded"}, job)
    assert status == {"type": "status", "status": "succeeded", "job": job.model_dump(mode="json")}
    assert status["job"]["created_at"] == "2025-01-01T00:00:00Z"
    with pytest.raises(ValueError, match="unknown message type 'bogus'"):
        to_client("bogus", {})


def test_cursor_admits_each_step_event_and_status_once() -> None:
    cursor = Cursor(step=2)
    assert [cursor.admit("metrics", {"step": s}) for s in (1, 2, 3, 3, 5, 4)] == [False, False, True, False,
                                                                                  True, False]
    assert [cursor.admit("samples", {"step": s}) for s in (1, 1)] == [True, False]
    assert [cursor.admit("event", {"id": i}) for i in (4, 4, 2, 9)] == [True, False, False, True]
    statuses = ("queued", "queued", "running")
    assert [cursor.admit("status", {"status": s}) for s in statuses] == [True, False, True]


def test_a_job_hub_fans_out_once_and_late_joiners_replay_from_their_start(api_settings_factory) -> None:
    """One hub per job: a joiner replays the ring's entries after its start (none twice), one
    whose start fell out of the ring is refused, a full queue ends only its subscriber, and the
    hub stops when its last subscriber leaves."""
    import redis.asyncio as aioredis

    settings = api_settings_factory("sqlite:///never-opened.db")  # this suite's Redis database

    async def until(condition, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, "timed out"
            await asyncio.sleep(0.01)

    async def scenario(client: aioredis.Redis) -> None:
        job_id = 990_007  # no database job has it, so no other test's stream either
        key = settings.redis_keys.job_stream(job_id)
        await client.delete(key)
        for n in range(2, 6):
            await client.xadd(key, bus.encode("metrics", {"step": n}), id=f"{n}-0")
        # No database: the XREAD wait is far longer than the test, so no SQL re-read comes.
        hubs = Hubs(client, settings.database_url, settings.redis_keys,
                    StreamConfig(block_ms=60_000, ring_size=3))

        def subscriber(start: tuple[int, int], size: int = 10) -> Subscriber:
            joiner = Subscriber(Cursor(), asyncio.Queue(size), 1.0)
            joiner.start = start
            return joiner

        def queued(joiner: Subscriber) -> list[str]:
            return [joiner.queue.get_nowait() for _ in range(joiner.queue.qsize())]

        def steps(texts: list[str]) -> list[int]:
            return [json.loads(text)["step"] for text in texts]

        try:
            first, tiny = subscriber((1, 0)), subscriber((1, 0), size=2)
            hub = hubs.attach(job_id, first)
            assert hub is not None and hubs.attach(job_id, tiny) is hub
            await until(lambda: hub.position == (5, 0))
            ring = [entry.text for entry in hub.ring]  # entries 3..5: the ring holds 3
            sent = queued(first)
            assert steps(sent) == [2, 3, 4, 5]
            assert all(a is b for a, b in zip(sent[1:], ring, strict=True))  # translated once, for all
            assert tiny.ended.is_set() and isinstance(tiny.error, SlowClient)
            assert steps(queued(tiny)) == [2, 3]
            late, too_late = subscriber((3, 0)), subscriber((1, 0))
            assert hubs.attach(job_id, late) is hub and queued(late) == ring[1:]
            assert hubs.attach(job_id, too_late) is None  # the ring holds 3..5: entry 2 is gone
            for joiner in (first, tiny, late):
                hub.detach(joiner)
            assert hubs.jobs == {}
            await asyncio.gather(hub.task, return_exceptions=True)
            assert hub.task.cancelled()
        finally:
            await client.delete(key)

    async def main() -> None:
        client = aioredis.Redis.from_url(settings.redis_url)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


# ---- against the server ----

def test_backlog_then_live_then_final_status(api, api_server, api_token, worker, job_spec) -> None:
    job_id = submit(api, job_spec)
    worker.start(job_id)
    for step in (1, 2):
        worker.step(job_id, step)
    worker.samples(job_id, 2, [{"completion": "five"}])
    with open_stream(api_server, job_id, api_token) as ws:
        backlog = read_n(ws, 6)
        assert kinds(backlog) == ["event"] * 3 + ["metrics", "metrics", "samples"]
        assert [m["event"]["type"] for m in backlog[:3]] == ["queued", "dispatched", "running"]
        status = json.loads(ws.recv(timeout=5))
        assert status["type"] == "status" and status["status"] == "running" and status["job"]["id"] == job_id
        worker.step(job_id, 3)
        live = worker.event(job_id, "checkpoint", "saved step 3", {"step": 3})
        worker.samples(job_id, 3, [{"completion": "5"}])
        worker.finish(job_id, "succeeded")
        rest, code = read_until_closed(ws)
    assert code == 1000
    assert kinds(rest) == ["metrics", "event", "samples", "event", "status"]
    assert rest[0] == {"type": "metrics", "step": 3, "values": api.get(f"/v1/jobs/{job_id}/metrics").json()[
        "items"][2]["values"]}
    assert rest[1]["event"] == {k: live[k] for k in ("id", "ts", "level", "type", "message", "data")}
    assert rest[3]["event"]["type"] == "succeeded"  # written by finish() in SQL, caught up before the end
    assert rest[-1]["status"] == "succeeded" and rest[-1]["job"]["status"] == "succeeded"
    assert rest[-1]["job"] == api.get(f"/v1/jobs/{job_id}").json()


def test_mid_run_connect_gets_each_step_once(api, api_server, api_token, worker, job_spec) -> None:
    job_id = submit(api, job_spec)
    worker.start(job_id)
    last = 120

    def run() -> None:
        for step in range(1, last + 1):
            worker.step(job_id, step)
            time.sleep(0.003)  # pacing: a job emits its steps over time, not at once
        worker.finish(job_id, "succeeded")

    publisher = threading.Thread(target=run)
    publisher.start()
    try:
        wait_until(lambda: api.get(f"/v1/jobs/{job_id}").json()["last_step"] >= 20, 30, "step 20 in SQL",
                   interval=0.005)
        with open_stream(api_server, job_id, api_token, after=7) as ws:
            messages, code = read_until_closed(ws)
    finally:
        publisher.join()
    assert code == 1000
    assert steps_of(messages) == list(range(8, last + 1))  # in order, none missing, none twice
    rest = api.get(f"/v1/jobs/{job_id}/metrics", params={"after_step": 7}).json()["items"]
    assert [m["values"] for m in messages if m["type"] == "metrics"] == [m["values"] for m in rest]
    assert messages[-1]["type"] == "status" and messages[-1]["status"] == "succeeded"


def test_finished_job_sends_backlog_and_closes(api, api_server, api_token, worker, job_spec) -> None:
    job_id = submit(api, job_spec)
    worker.start(job_id)
    for step in (1, 2, 3):
        worker.step(job_id, step)
    worker.finish(job_id, "failed")
    with open_stream(api_server, job_id, api_token, after=1) as ws:
        messages, code = read_until_closed(ws, timeout=5)
    assert code == 1000
    assert steps_of(messages) == [2, 3]
    assert messages[-1]["type"] == "status" and messages[-1]["status"] == "failed"
    assert [m["status"] for m in messages if m["type"] == "status"] == ["failed"]  # one status only


def test_an_unannounced_finish_is_noticed_in_sql(api, api_server, api_token, worker, job_spec) -> None:
    """The worker may end the job between the backlog read and the stream tail, or its publish
    may fail: a quiet stream makes the server re-read the job's row."""
    job_id = submit(api, job_spec)
    worker.start(job_id)
    with open_stream(api_server, job_id, api_token) as ws:
        assert kinds(read_n(ws, 4))[-1] == "status"
        worker.finish(job_id, "succeeded", publish=False)
        started = time.monotonic()
        messages, code = read_until_closed(ws, timeout=5)
    assert code == 1000 and messages[-1]["status"] == "succeeded"
    assert time.monotonic() - started < 3


def test_cancelling_a_queued_job_ends_its_stream(api, api_server, api_token, job_spec) -> None:
    job_id = submit(api, job_spec)
    with open_stream(api_server, job_id, api_token, subprotocol=True) as ws:
        assert ws.subprotocol == "grpo.v1"  # the key itself is never echoed back
        first = read_n(ws, 2)
        assert kinds(first) == ["event", "status"] and first[1]["status"] == "queued"
        assert api.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
        messages, code = read_until_closed(ws, timeout=5)
    assert code == 1000
    assert kinds(messages) == ["event", "status"] and messages[-1]["status"] == "cancelled"


def test_cancelling_a_running_job_streams_the_request_then_the_end(api, api_server, api_token, worker,
                                                                    job_spec) -> None:
    job_id = submit(api, job_spec)
    worker.start(job_id)
    with open_stream(api_server, job_id, api_token) as ws:
        assert kinds(read_n(ws, 4)) == ["event", "event", "event", "status"]
        assert api.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelling"
        asked = read_n(ws, 2)  # the API published both: the event as it is, the status re-read
        assert asked[0]["event"]["type"] == "cancel_requested"
        assert asked[1]["status"] == "cancelling" and asked[1]["job"]["cancel_requested"] is True
        worker.step(job_id, 1)
        worker.finish(job_id, "cancelled")
        messages, code = read_until_closed(ws, timeout=5)
    assert code == 1000 and kinds(messages) == ["metrics", "event", "status"]
    assert messages[-1]["status"] == "cancelled"


def test_an_event_published_without_its_row_id_is_sent_once_from_sql(api, api_server, api_token, worker,
                                                                       job_spec) -> None:
    from api.store import telemetry
    from api.store.db import session_scope

    job_id = submit(api, job_spec)
    worker.start(job_id)
    with open_stream(api_server, job_id, api_token) as ws:
        read_n(ws, 4)
        with session_scope(worker.database_url) as session:
            row = telemetry.add_event(session, job_id, "note", "written in SQL").model_dump(mode="json")
        worker.publish(job_id, "event", {"type": "note", "message": "written in SQL"})  # no id, ts, level
        worker.step(job_id, 1)
        worker.finish(job_id, "succeeded")
        messages, code = read_until_closed(ws, timeout=5)
    assert code == 1000
    notes = [m["event"] for m in messages if m["type"] == "event" and m["event"]["type"] == "note"]
    assert notes == [{k: row[k] for k in ("id", "ts", "level", "type", "message", "data")}]


def test_stream_handshake_errors(api, api_server, api_token, job_spec) -> None:
    job_id = submit(api, job_spec)
    cases = [(None, job_id, {}, 401), ("wrong", job_id, {}, 401),
             ("wrong", job_id, {"query_token": True}, 401), (api_token, job_id, {"query_token": True}, 401),
             (api_token, 999999, {}, 404), (api_token, job_id, {"after": -2}, 422)]  # -1: before step 0
    for token, target, options, status in cases:
        with pytest.raises(InvalidStatus) as refused:
            open_stream(api_server, target, token, **options)
        assert refused.value.response.status_code == status, (token, target, options)
        assert json.loads(refused.value.response.body)["error"]["code"]


def test_slow_client_is_cut_off_and_fast_client_gets_everything(api, api_server, api_token, worker,
                                                                 job_spec) -> None:
    job_id = submit(api, job_spec)
    worker.start(job_id)
    # The slow client never reads. A tiny receive buffer and no compression keep what the
    # network holds for it small; the rest (~12 MB) must overflow its queue on the server.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: it sets the window
    sock.connect(("127.0.0.1", int(api_server.http_url.rsplit(":", 1)[1])))
    last, chunk, fast_messages, fast_end = 1000, 50, [], {}

    def read_fast(ws: ClientConnection) -> None:
        try:
            while True:
                fast_messages.append(json.loads(ws.recv(timeout=20)))
        except ConnectionClosed as closed:
            fast_end["code"] = closed.rcvd.code if closed.rcvd else None

    with (open_stream(api_server, job_id, api_token, sock=sock, compression=None, max_queue=1) as slow,
          open_stream(api_server, job_id, api_token) as fast):
        reader = threading.Thread(target=read_fast, args=(fast,))
        reader.start()
        for start in range(1, last + 1, chunk):
            worker.burst(job_id, range(start, start + chunk), padding=12_000)
            # Paced by the fast client, so only the slow one can fall behind, however busy the machine.
            wait_until(lambda: len(steps_of(fast_messages)) >= start - chunk, 20,  # noqa: B023 - read now
                       "the fast client to keep up", interval=0.002)
        worker.finish(job_id, "succeeded")
        reader.join(timeout=30)
        slow_messages, slow_code = read_until_closed(slow, timeout=10)
    assert fast_end["code"] == 1000
    assert steps_of(fast_messages) == list(range(1, last + 1))
    assert fast_messages[-1]["status"] == "succeeded"
    assert slow_code == 1013  # "try again later"
    assert len(steps_of(slow_messages)) < last
    assert "succeeded" not in [m.get("status") for m in slow_messages]


def test_subscribers_joining_at_different_times_each_get_every_step_once(api, api_server, api_token, worker,
                                                                         job_spec) -> None:
    """They share the job's one reader; each still starts where its own backlog ends."""
    job_id = submit(api, job_spec)
    worker.start(job_id)
    last, results = 150, {}

    def follow(name: str, after: int) -> None:
        with open_stream(api_server, job_id, api_token, after=after) as ws:
            results[name] = read_until_closed(ws)

    def run() -> None:
        for step in range(1, last + 1):
            worker.step(job_id, step)
            time.sleep(0.003)  # pacing: a job emits its steps over time, not at once
        worker.finish(job_id, "succeeded")

    readers = [threading.Thread(target=follow, args=("early", 0))]
    readers[0].start()
    publisher = threading.Thread(target=run)
    publisher.start()
    for name, after, at_step in (("mid", 5, 30), ("late", 0, 90)):
        wait_until(lambda: api.get(f"/v1/jobs/{job_id}").json()["last_step"] >= at_step,  # noqa: B023
                   30, f"step {at_step} in SQL", interval=0.005)
        readers.append(threading.Thread(target=follow, args=(name, after)))
        readers[-1].start()
    publisher.join()
    for reader in readers:
        reader.join(timeout=20)
    for name, after in (("early", 0), ("mid", 5), ("late", 0)):
        messages, code = results[name]
        assert code == 1000, name
        assert steps_of(messages) == list(range(after + 1, last + 1)), name
        assert messages[-1]["type"] == "status" and messages[-1]["status"] == "succeeded", name
