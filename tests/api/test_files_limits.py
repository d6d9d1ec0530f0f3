"""What keeps one team's uploads from holding the API host's spool disk, through the real API:
a team's uploads in flight are bounded across API processes (``GRPO_MAX_UPLOADS_PER_TEAM``; one
more is a 429 while another team's goes through), their slots come back after a success, a
failure and a client gone away; an upload whose Content-Length alone passes the team's quota is
refused before its body is read; a full spool disk is a 503 ``spool_full`` that leaves no spool
file; a body trickling under the minimum pace is a 408 that gives its slot back; an API process
takes a bounded number of uploads at once, all teams together (503 past it). Uploads held open
mid-body are sent over raw sockets, so the test decides when each ends.
The slots' Redis outage fallback and their expiry are checked on :class:`UploadSlots` itself."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from full_disk import small_disk
from waiting import wait_until

from api.domain.errors import RateLimited
from api.redis_keys import RedisKeys
from api.store import teams, upload_slots
from api.store.db import session_scope
from api.store.upload_slots import UploadSlots

ROWS = b'{"prompt": "2+3?", "answer": "5"}\n'
BOUNDARY = "limits-test-boundary"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class PartialUpload:
    """A dataset upload whose head and first ``sent`` file bytes go now, the rest on :meth:`finish`;
    ``chunked``: with no Content-Length, as a body of unknown length is sent."""

    def __init__(self, base_url: str, key: str, content: bytes, sent: int = 10,
                 chunked: bool = False) -> None:
        head = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ndataset\r\n'
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="rows.jsonl"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n").encode()
        body = head + content + f"\r\n--{BOUNDARY}--\r\n".encode()
        url = urlsplit(base_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=10)
        length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
        request = (f"POST /v1/files HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
                   f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                   f"{length}\r\nConnection: close\r\n\r\n").encode()
        first, self.rest = body[:len(head) + sent], body[len(head) + sent:]
        if chunked:
            first, self.rest = _chunk(first), _chunk(self.rest) + b"0\r\n\r\n"
        self.sock.sendall(request + first)

    def finish(self) -> tuple[int, dict]:
        self.sock.sendall(self.rest)
        return self.answer()

    def answer(self) -> tuple[int, dict]:
        """``(status, JSON body)`` of the answer (the server closes the connection after it)."""
        data = b""
        while chunk := self.sock.recv(65536):
            data += chunk
        self.sock.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)

    def abort(self) -> None:
        self.sock.close()


@pytest.fixture
def team(api_server, make_key) -> tuple[str, int, str]:
    """``(name, id, member key)`` of a team of the test's own, so no slot of another test counts."""
    name = f"u{uuid.uuid4().hex[:8]}"
    with session_scope(api_server.settings.database_url) as session:
        team_id = teams.create_team(session, name).id
    return name, team_id, make_key(api_server.settings.database_url, name)


def slots_held(settings, team_id: int) -> int:
    with redis.Redis.from_url(settings.redis_url) as client:
        return client.zcard(settings.redis_keys.upload_slots(team_id))


def upload(client: httpx.Client, content: bytes) -> httpx.Response:
    return client.post("/v1/files", data={"purpose": "dataset"}, files={"file": ("rows.jsonl", content)})


def test_a_teams_uploads_in_flight_are_bounded_across_api_processes(api_server, serve_api, team, client_for,
                                                                    team_keys) -> None:
    _, team_id, key = team
    assert api_server.settings.max_uploads_per_team == 2
    with serve_api(api_server.settings) as other_process:  # same database and Redis: same slots
        first = PartialUpload(api_server.http_url, key, ROWS * 100)
        second = PartialUpload(other_process.http_url, key, ROWS * 100)
        wait_until(lambda: slots_held(api_server.settings, team_id) == 2, 10, "both slots taken")

        third = upload(client_for(key), ROWS)
        assert third.status_code == 429, third.text
        assert third.json()["error"]["code"] == "rate_limited"
        assert "GRPO_MAX_UPLOADS_PER_TEAM" in third.json()["error"]["message"]
        assert int(third.headers["Retry-After"]) > 0
        beta = upload(client_for(team_keys.beta), ROWS)  # another team's upload is not held up
        assert beta.status_code == 201, beta.text

        for held in (first, second):
            status, body = held.finish()
            assert status == 201, body
    assert slots_held(api_server.settings, team_id) == 0
    assert upload(client_for(key), ROWS).status_code == 201


def test_slots_come_back_after_a_failure_and_a_client_gone_away(api_server, team, client_for) -> None:
    _, team_id, key = team
    member = client_for(key)
    for _ in range(3):  # more failures than slots: each gave its slot back
        refused = upload(member, b"not json\n")
        assert refused.status_code == 422, refused.text
    gone = PartialUpload(api_server.http_url, key, ROWS * 100)
    wait_until(lambda: slots_held(api_server.settings, team_id) == 1, 10, "the slot taken")
    gone.abort()
    wait_until(lambda: slots_held(api_server.settings, team_id) == 0, 10, "the slot given back")
    held = [PartialUpload(api_server.http_url, key, ROWS * 10) for _ in range(2)]
    for partial in held:
        status, body = partial.finish()
        assert status == 201, body


def test_an_upload_whose_length_passes_the_quota_never_reaches_the_disk(api_server, api_settings_factory,
                                                                       serve_api, team, tmp_path) -> None:
    name, team_id, key = team
    spool = tmp_path / "spool"
    spool.mkdir()
    with session_scope(api_server.settings.database_url) as session:
        teams.set_artifact_quota(session, name, 100_000)
    settings = api_settings_factory(api_server.settings.database_url, upload_spool_dir=spool)
    with serve_api(settings) as server:
        # Only its head and 10 bytes are sent: the answer comes before the rest of the body.
        hopeless = PartialUpload(server.http_url, key, ROWS * 10_000)
        status, body = hopeless.answer()
        assert status == 413 and body["error"]["code"] == "artifact_quota_exceeded", body
        assert "by its Content-Length" in body["error"]["message"]
        assert list(spool.iterdir()) == []
        assert slots_held(settings, team_id) == 0
        # A body of unknown length is stopped once what arrived passes the room left, mid-body.
        unknown = PartialUpload(server.http_url, key, ROWS * 10_000, sent=len(ROWS) * 4000, chunked=True)
        status, body = unknown.answer()
        assert status == 413 and body["error"]["code"] == "artifact_quota_exceeded", body
        assert "as it arrived" in body["error"]["message"]
        assert list(spool.iterdir()) == []
        # One that fits is spooled, checked and stored as ever (then its spool file is gone).
        fits = PartialUpload(server.http_url, key, ROWS * 100)
        status, body = fits.finish()
        assert status == 201, body
        assert list(spool.iterdir()) == []


def test_a_full_spool_disk_is_a_503_that_leaves_no_spool_file(api_server, api_settings_factory, serve_api,
                                                              client_for, team, tmp_path: Path) -> None:
    _, _, key = team
    rows = ROWS * 20_000  # 700 KB
    with small_disk(tmp_path / "spool", 1024 * 1024) as disk:
        settings = api_settings_factory(api_server.settings.database_url, upload_spool_dir=disk.path)
        with serve_api(settings) as server:
            member = client_for(key, server)
            disk.fill(leave=64 * 1024)
            full = upload(member, rows)
            assert full.status_code == 503, full.text
            assert full.json()["error"]["code"] == "spool_full"
            assert int(full.headers["Retry-After"]) > 0
            assert [path.name for path in disk.path.iterdir()] == [disk.filler.name]
            disk.free()
            assert upload(member, rows).status_code == 201


def test_a_redis_outage_bounds_uploads_in_each_process() -> None:
    async def scenario() -> None:
        down = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # nothing listens there
        slots = UploadSlots(down, RedisKeys("outage"))
        async with slots.held(7, 2), slots.held(7, 2):
            with pytest.raises(RateLimited):
                async with slots.held(7, 2):
                    pass
            async with slots.held(8, 2):  # another team's are its own
                pass
        async with slots.held(7, 2), slots.held(7, 2):  # given back
            pass
        await down.aclose()

    asyncio.run(scenario())


def test_a_take_that_timed_out_here_but_ran_in_redis_leaves_no_slot_behind() -> None:
    # CI, loaded: the take's script ran in Redis, its answer came after the 0.25 s timeout, the
    # process counted the upload locally, and the token stayed in Redis for SLOT_SECONDS.
    redis_url, namespace = os.environ["GRPO_TEST_REDIS_URL"], f"t{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        slots = UploadSlots(client, RedisKeys(namespace))
        ran = slots._take_script

        async def slow_answer(**kwargs):
            taken = await ran(**kwargs)
            await asyncio.sleep(upload_slots.REDIS_TIMEOUT_SECONDS * 4)
            return taken

        slots._take_script = slow_answer
        async with slots.held(5, 2):
            assert await client.zcard(RedisKeys(namespace).upload_slots(5)) == 1  # it did run there
        assert await client.zcard(RedisKeys(namespace).upload_slots(5)) == 0
        await client.aclose()

    asyncio.run(scenario())


# A process that takes an upload slot and holds it until it is killed, as an API process that
# died mid-upload: its slot is no longer renewed. argv: Redis URL, key namespace.
_DIES_HOLDING_A_SLOT = """
import asyncio, sys
import redis.asyncio as aioredis
from api.redis_keys import RedisKeys
from api.store import upload_slots

upload_slots.SLOT_SECONDS = 1.0

async def hold():
    slots = upload_slots.UploadSlots(aioredis.Redis.from_url(sys.argv[1]), RedisKeys(sys.argv[2]))
    async with slots.held(3, 2):
        print("taken", flush=True)
        await asyncio.sleep(600)

asyncio.run(hold())
"""


def test_a_slot_its_process_lost_expires_while_a_held_one_is_renewed(monkeypatch) -> None:
    monkeypatch.setattr(upload_slots, "SLOT_SECONDS", 1.0)  # renewed every 0.25 s
    redis_url, namespace = os.environ["GRPO_TEST_REDIS_URL"], f"t{uuid.uuid4().hex[:8]}"
    dying = subprocess.Popen([sys.executable, "-c", _DIES_HOLDING_A_SLOT, redis_url, namespace],
                             stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert dying.stdout.readline().strip() == "taken"
    finally:
        dying.kill()
        dying.wait(10)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        slots = UploadSlots(client, RedisKeys(namespace))
        async with slots.held(3, 2):  # the team's second slot, the killed process holding the first
            with pytest.raises(RateLimited):
                async with slots.held(3, 2):
                    pass
            await asyncio.sleep(2.5)  # past the lifetime, several times over for the held slot
            async with slots.held(3, 2):  # the lost slot was dropped ...
                with pytest.raises(RateLimited):  # ... and the held one kept
                    async with slots.held(3, 2):
                        pass
        await client.aclose()

    asyncio.run(scenario())


def test_a_trickling_upload_loses_its_slot_with_a_408(api_server, api_settings_factory, serve_api, team,
                                                      tmp_path) -> None:
    _, team_id, key = team
    settings = api_settings_factory(api_server.settings.database_url, upload_min_bytes_per_second=1000,
                                    upload_grace_seconds=1, upload_spool_dir=tmp_path)
    with serve_api(settings) as server:
        trickle = PartialUpload(server.http_url, key, ROWS * 1000)
        wait_until(lambda: slots_held(settings, team_id) == 1, 10, "the slot taken")
        for byte in trickle.rest[:20]:  # a byte at a time, far under 1000 bytes a second
            try:
                trickle.sock.sendall(bytes([byte]))
            except OSError:  # the server answered and closed meanwhile
                break
            time.sleep(0.2)
        status, body = trickle.answer()
        assert status == 408 and body["error"]["code"] == "upload_too_slow", body
        assert "GRPO_UPLOAD_MIN_BYTES_PER_SECOND" in body["error"]["message"]
        assert slots_held(settings, team_id) == 0
        assert list(tmp_path.iterdir()) == []


def test_uploads_in_flight_are_capped_per_process_across_teams(api_server, api_settings_factory, serve_api,
                                                               team, client_for, team_keys) -> None:
    _, _, key = team
    settings = api_settings_factory(api_server.settings.database_url, max_uploads_in_flight=1)
    with serve_api(settings) as server:
        held = PartialUpload(server.http_url, key, ROWS * 100)
        wait_until(lambda: slots_held(settings, team[1]) == 1, 10, "the first upload taken in")
        other_team = upload(client_for(team_keys.beta, server), ROWS)
        assert other_team.status_code == 503, other_team.text
        assert other_team.json()["error"]["code"] == "unavailable"
        assert "GRPO_MAX_UPLOADS_IN_FLIGHT" in other_team.json()["error"]["message"]
        assert int(other_team.headers["Retry-After"]) > 0
        status, body = held.finish()
        assert status == 201, body
        assert upload(client_for(team_keys.beta, server), ROWS).status_code == 201  # its place came back
