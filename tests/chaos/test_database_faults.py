"""Postgres faults under a real worker, scheduler and Redis: the database is the infrastructure, so
losing it never fails a job.

* The worker's session is terminated (``pg_terminate_backend``) in the middle of a metrics insert,
  twice: the write is retried on a new connection and the job succeeds with steps 1..N each
  recorded once, in its first attempt.
* The database is unreachable for longer than the worker's retry budget (the worker reaches
  Postgres through a TCP proxy that the test cuts): the attempt ends, the job goes back to the
  queue with a ``requeued`` event naming ``database_unavailable`` (not a failure), and once the
  database is back it resumes from its checkpoint and finishes, every step once.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, create_engine, make_url, pool, text
from waiting import process_gone

from api.store.db import session_scope
from api.store.tables import JobMetric
from api.store.telemetry import list_events


def events(database_url: str, job_id: int, kind: str) -> list:
    with session_scope(database_url) as session:
        return [e for e in list_events(session, job_id, limit=1000) if e.type == kind]


def metric_rows(database_url: str, job_id: int) -> list[tuple[int, int]]:
    """(step, attempt) of every stored record, by step."""
    with session_scope(database_url) as session:
        return [tuple(row) for row in session.query(JobMetric.step, JobMetric.attempt)
                .filter(JobMetric.job_id == job_id).order_by(JobMetric.step)]


@pytest.fixture
def admin(database_url: str) -> Iterator[Engine]:
    """Connections of the test's own, outside the service's pools."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    yield engine
    engine.dispose()


def blocked_metrics_insert(admin: Engine) -> int | None:
    """The backend of a metrics insert waiting on a lock, if one is."""
    with admin.connect() as conn:
        return conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query ILIKE 'INSERT INTO job_metrics%' LIMIT 1")).scalar()


def test_a_session_terminated_mid_insert_is_retried_and_every_step_is_recorded_once(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, wait_worker_ready,
        admin):
    processes.worker(pool)
    wait_worker_ready(pool, processes)
    processes.scheduler()
    steps = 12
    job_id = submit(tiny_spec("terminated", pool=pool, grpo={"max_steps": steps}))
    for at_step in (2, 6):
        wait_for(lambda s=at_step: job_of(job_id).last_step >= s or finished(job_id), 120, f"step {at_step}",
                 processes)
        assert job_of(job_id).status == "running", job_of(job_id).error  # a dropped session fails no job
        with admin.connect() as lock:  # holds every insert into job_metrics until it commits
            lock.execute(text("LOCK TABLE job_metrics IN EXCLUSIVE MODE"))
            victim = wait_for(lambda: blocked_metrics_insert(admin), 30,
                              "a metrics insert to wait on the lock", processes)
            with admin.connect() as conn:
                assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": victim}).scalar()
            lock.commit()

    done = wait_for(lambda: finished(job_id), 120, "the job to finish", processes)
    assert (done.status, done.attempt) == ("succeeded", 1), done.error
    assert metric_rows(database_url, job_id) == [(step, 1) for step in range(1, steps + 1)]
    assert not events(database_url, job_id, "requeued")
    assert "retrying" in processes.logs()  # the worker did meet the terminated sessions


class Proxy:
    """A TCP proxy to Postgres that can be cut (every connection closed, new ones refused, as a
    database host gone from the network) and restored on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self.lock:
            self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            # shutdown, not only close: it wakes the thread blocked in accept(), which a close
            # from another thread does not, and which would go on accepting.
            try:
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
            for conn in self.connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self.connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            server = socket.create_connection(self.upstream)
            with self.lock:
                if self.listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self.connections += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for conn in (source, sink):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_a_database_away_longer_than_the_retry_budget_requeues_the_job_which_resumes_when_it_is_back(
        processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, redis_url,
        wait_worker_ready, settings):
    url = make_url(database_url)
    proxy = Proxy((url.host, url.port or 5432))
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    # The worker alone goes through the proxy; the scheduler keeps its database.
    # Its own URL would derive another Redis namespace: it stays in the stack's.
    processes.worker(pool, GRPO_DATABASE_URL=proxied, GRPO_NAMESPACE=settings.namespace,
                     GRPO_DB_RETRY_SECONDS="3")
    [worker_id] = wait_worker_ready(pool, processes)
    processes.scheduler()
    steps = 8
    job_id = submit(tiny_spec("outage", pool=pool, grpo={"max_steps": steps}, checkpoint_every=2))
    wait_for(lambda: (j := job_of(job_id)).latest_checkpoint and j.last_step >= 3, 120,
             "a checkpoint and a few steps", processes)
    marks = redis.Redis.from_url(redis_url).hgetall(settings.redis_keys.busy(worker_id))
    job_pid = json.loads(marks[str(job_id).encode()])["job_pid"]

    proxy.cut()
    # Its writes retry for 3 s, then the attempt ends; the job's process is gone.
    wait_for(lambda: process_gone(job_pid), 60, "the job's process to give up on the database", processes)
    proxy.restore()  # in time for the supervisor's own retried requeue

    [requeued] = wait_for(lambda: events(database_url, job_id, "requeued"), 30, "the requeue", processes)
    assert requeued.data["error_code"] == "database_unavailable", requeued
    assert "the database was unreachable" in requeued.message
    assert not events(database_url, job_id, "failed")
    done = wait_for(lambda: finished(job_id), 180, "the job to resume and finish", processes)
    assert (done.status, done.attempt) == ("succeeded", 2), done.error
    [resumed] = events(database_url, job_id, "resumed")
    rows = metric_rows(database_url, job_id)
    assert [step for step, _ in rows] == list(range(1, steps + 1))
    # Steps after the checkpoint it resumed from were trained, and recorded, by the second attempt.
    assert resumed.data["step"] >= 2
    assert {attempt for step, attempt in rows if step > resumed.data["step"]} == {2}
    proxy.cut()
