"""Fixtures for the service's tests: real, empty databases, one per test (``tests/service_db.py``
makes them), a live API server per module, teams and keys, and a worker played by the worker's
own code (``scripted_worker.py``).

Each fixture is small and named for what it yields; add new ones below in the same way.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import service_db  # tests/ is on sys.path (pytest's rootdir conftest)
from scripted_worker import ScriptedWorker
from specs import tiny_spec
from waiting import wait_until


@pytest.fixture
def fresh_postgres_url() -> Iterator[str]:
    """URL of a new empty Postgres database, dropped (with its connections) after the test."""
    with service_db.fresh_postgres_url() as url:
        yield url


@pytest.fixture
def fresh_sqlite_url(tmp_path: Path) -> str:
    """URL of a SQLite file that does not exist yet (SQLite creates it on first connect)."""
    return service_db.sqlite_url(tmp_path)


# ==== HTTP API and WebSocket stream (tests/api/test_jobs_api.py, test_stream.py, test_meta.py) ====
# A real uvicorn server per test module and database backend, real httpx / websockets clients,
# and a scripted worker that drives jobs through the real store functions and Redis stream.

API_TOKEN = "api-test-operator-token-7c1e9a40d2b3"
# The session's Redis (tests/backing_services.py: GRPO_TEST_REDIS_URL, or one started for the session).
API_REDIS_URL = os.environ["GRPO_TEST_REDIS_URL"]
TEST_SECRET_KEY = "mbdUdtmXOnOAOSz9sFWIAN0z39VYGg_4p2JGwz0bRIo="  # a Fernet key, for tests only
LOOPBACK_NETWORKS = "127.0.0.0/8,::1/128"


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def api_database_url(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database shared by one test module's tests, on each backend in turn."""
    if request.param == "sqlite":
        with service_db.migrated(service_db.sqlite_url(tmp_path_factory.mktemp("api-db"))) as url:
            yield url
        return
    with service_db.fresh_postgres_url("grpo_api") as url, service_db.migrated(url):
        yield url


@pytest.fixture(scope="session")
def service_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """models/ and data/ roots holding one valid model folder and data file, plus an outside
    folder and symlinks from inside the roots that lead out to it."""
    base = tmp_path_factory.mktemp("roots")
    models, data, outside = base / "models", base / "data", base / "outside"
    for folder in (models / "tiny", data, outside):
        folder.mkdir(parents=True)
    (models / "tiny" / "config.json").write_text("{}")
    (data / "prompts.jsonl").write_text('{"prompt": "2+3?", "answer": "5"}\n')
    (outside / "config.json").write_text("{}")
    (outside / "secret.jsonl").write_text('{"prompt": "x"}\n')
    (models / "escape").symlink_to(outside, target_is_directory=True)
    (data / "leak.jsonl").symlink_to(outside / "secret.jsonl")
    return {"models": models, "data": data, "outside": outside}


@pytest.fixture(scope="session")
def api_settings_factory(service_roots: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """``factory(database_url, **overrides) -> Settings`` for a test server; each its own
    artifacts root (job ids restart at 1 in each fresh database)."""
    from api.settings import Settings

    def factory(database_url: str, **overrides) -> Settings:
        values = {"database_url": database_url, "redis_url": API_REDIS_URL, "api_token": API_TOKEN,
                  "models_root": service_roots["models"], "data_root": service_roots["data"],
                  "artifacts_root": tmp_path_factory.mktemp("artifacts"), "stream_maxlen": 100_000,
                  # Webhook secrets are sealed under a key; receivers of the tests listen on loopback.
                  "secret_key": TEST_SECRET_KEY, "webhook_allowed_networks": LOOPBACK_NETWORKS,
                  # Environment servers of the tests (tests/openenv_server.py) listen on loopback too.
                  "environment_allowed_networks": LOOPBACK_NETWORKS}
        return Settings(**{**values, **overrides})

    return factory


class LiveServer:
    """A running test server: its base URLs and the settings it was built with."""

    def __init__(self, port: int, settings) -> None:
        self.http_url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"
        self.settings = settings


def _serve(settings) -> Iterator[LiveServer]:
    """``create_app(settings)`` under uvicorn, in a thread, on a port the OS picked (a
    generator: use it through ``serve_api`` or ``contextlib.contextmanager``)."""
    import socket
    import threading

    import uvicorn

    from api.main import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 10, "the API server to start", interval=0.01)
    if not server.started:
        pytest.fail("the API server stopped while starting")
    try:
        yield LiveServer(sock.getsockname()[1], settings)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@pytest.fixture(scope="module")
def api_server(api_database_url: str, api_settings_factory) -> Iterator[LiveServer]:
    """The app under uvicorn for one test module and backend, with the token required."""
    import redis

    settings = api_settings_factory(api_database_url)

    def drop_streams() -> None:  # job ids restart at 1 in each fresh database
        with redis.Redis.from_url(API_REDIS_URL) as client:
            stale = list(client.scan_iter(match=settings.redis_keys.everything_pattern))
            if stale:
                client.delete(*stale)

    drop_streams()
    yield from _serve(settings)
    drop_streams()


@pytest.fixture(scope="session")
def serve_api():
    """``with serve_api(settings) as server:`` for a test that needs its own settings."""
    import contextlib

    return contextlib.contextmanager(_serve)


@pytest.fixture
def api(api_server: LiveServer):
    """An httpx client for the module's server, sending the bearer token."""
    import httpx

    with httpx.Client(base_url=api_server.http_url, headers={"Authorization": f"Bearer {API_TOKEN}"},
                      timeout=10, trust_env=False) as client:
        yield client


@pytest.fixture(scope="session")
def job_spec():
    """``job_spec(**fields) -> dict``: ``tests/specs.py``'s spec, 20 steps long by default
    (the scripted worker reports steps; nothing trains here)."""
    return functools.partial(tiny_spec, name="tiny-run", max_steps=20)


@pytest.fixture
def worker(api_server: LiveServer) -> Iterator[ScriptedWorker]:
    scripted = ScriptedWorker(api_server.settings, API_REDIS_URL)
    yield scripted
    scripted.close()


@pytest.fixture(scope="session")
def api_token() -> str:
    return API_TOKEN

# ==== end of the HTTP API and WebSocket stream section ====


# ==== Teams and API keys (tests/api/test_auth.py, test_admin.py, test_isolation.py) ====


@dataclass(frozen=True)
class TeamKeys:
    """Keys made through the store for one module's database: members of ``alpha`` and
    ``beta`` and an admin of ``default``."""

    alpha: str
    beta: str
    admin: str
    alpha_id: int
    beta_id: int


def _make_key(database_url: str, team: str, admin: bool = False, label: str | None = None) -> str:
    """A new API key of ``team`` (which must exist), through the store as ``grpo admin`` does."""
    from api.store import teams
    from api.store.db import session_scope

    with session_scope(database_url) as session:
        return teams.create_key(session, team, admin, label)[1]


@pytest.fixture(scope="module")
def team_keys(api_server: LiveServer) -> TeamKeys:
    from api.store import teams
    from api.store.db import session_scope

    url = api_server.settings.database_url
    with session_scope(url) as session:
        alpha, beta = teams.create_team(session, "alpha"), teams.create_team(session, "beta")
    return TeamKeys(alpha=_make_key(url, "alpha", label="alpha member"),
                    beta=_make_key(url, "beta", label="beta member"),
                    admin=_make_key(url, "default", admin=True, label="test admin"),
                    alpha_id=alpha.id, beta_id=beta.id)


@pytest.fixture(scope="session")
def make_key():
    """``make_key(database_url, team, admin=False, label=None) -> key``."""
    return _make_key


@pytest.fixture
def client_for(api_server: LiveServer):
    """``client_for(key)``: an httpx client of the module's server sending ``key`` as the
    bearer token (None: no Authorization header); all are closed after the test."""
    import contextlib

    import httpx

    with contextlib.ExitStack() as stack:
        def factory(key: str | None, server: LiveServer | None = None) -> httpx.Client:
            headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
            return stack.enter_context(httpx.Client(base_url=(server or api_server).http_url, headers=headers,
                                                    timeout=10, trust_env=False))

        yield factory

# ==== end of the teams and API keys section ====


@pytest.fixture
def alpha(client_for, team_keys):
    """A client of team alpha's member key."""
    return client_for(team_keys.alpha)


@pytest.fixture
def beta(client_for, team_keys):
    """A client of team beta's member key."""
    return client_for(team_keys.beta)


@pytest.fixture
def pool(api_server: LiveServer) -> str:
    """A pool of its own for the test (registered, with no worker yet)."""
    import uuid

    from api.store.db import session_scope
    from api.store.pools import ensure_pool

    name = f"q{uuid.uuid4().hex[:8]}"
    with session_scope(api_server.settings.database_url) as session:
        ensure_pool(session, name)
    return name


@pytest.fixture
def advertise(api_server: LiveServer) -> Iterator:
    """``advertise(pool, gpus=1, capabilities=(), prefix="w") -> worker_id``: a live worker
    heartbeat, advertised the way a worker does (``api.store.bus.advertise_worker``); removed after
    the test."""
    import uuid

    import redis

    from api.store import bus
    from api.vocabulary import Heartbeat

    client = redis.Redis.from_url(api_server.settings.redis_url)
    keys = api_server.settings.redis_keys
    made: list[str] = []

    def add(pool: str, gpus: int = 1, capabilities: tuple[str, ...] = (), prefix: str = "w") -> str:
        worker_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
        bus.advertise_worker(client, keys, Heartbeat(worker_id=worker_id, pool=pool, gpus=gpus,
                                                       gpu_model="H200", gpu_memory_mb=143771,
                                                       memory_mb=1024, hostname="node-1",
                                                       capabilities=list(capabilities)), 60)
        made.append(worker_id)
        return worker_id

    yield add
    for worker_id in made:
        client.delete(keys.worker(worker_id), keys.worker_queue(worker_id))
    client.close()


@pytest.fixture(params=["local", "s3"])
def store_server(request, api_server, api_settings_factory, serve_api, monkeypatch):
    """``(server, store)``, each test twice (the Files API, the artifact quota): the module's
    server (its local folder store), or a server of the same database whose store is a bucket
    prefix of its own on the S3 server process."""
    import uuid

    from api.storage import open_store

    if request.param == "local":
        yield api_server, open_store(api_server.settings.storage_location)
        return
    s3 = request.getfixturevalue("s3_server")
    for name, value in s3.env.items():  # the API's store reads the standard AWS_* variables
        monkeypatch.setenv(name, value)
    bucket_prefix = s3.url(f"f-{uuid.uuid4().hex}")
    settings = api_settings_factory(api_server.settings.database_url, storage_url=bucket_prefix)
    with serve_api(settings) as server:
        yield server, open_store(settings.storage_location, env=s3.env)


@pytest.fixture
def fresh_team(client_for, team_keys, api_server, make_key):
    """``(name, member client)`` of a team of the test's own, made by an admin over HTTP, at the
    deployment's defaults (its limits a test may change without touching another's)."""
    import uuid

    name = f"t-{uuid.uuid4().hex[:8]}"
    assert client_for(team_keys.admin).post("/v1/admin/teams", json={"name": name}).status_code == 201
    return name, client_for(make_key(api_server.settings.database_url, name))


@pytest.fixture
def member(client_for, team_keys):
    """An httpx client of team alpha's member key (not an admin)."""
    return client_for(team_keys.alpha)


@pytest.fixture
def private_redis():
    """``(url, process)``: a redis-server of the test's own, to freeze (SIGSTOP) or kill."""
    import os
    import signal

    from api.cli.dev import start_redis, stop_process

    url, process = start_redis()
    try:
        yield url, process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a frozen one must run to stop on SIGTERM
        stop_process(process, grace=2)
