"""A gang's hosts in SQL (api.store.gangs), for the length of one dispatch: node 0 claims, every
other host joins once, each host's lease is its own, any host that joined may record how the attempt
ended (the first record wins), and the rows go with the dispatch, so a host of an earlier dispatch
can neither renew nor record anything after a requeue. The reaper requeues a gang one of whose
hosts went silent or never came, and leaves alone one whose host's part ended cleanly."""

from __future__ import annotations

from datetime import timedelta

from api.domain.cluster_state import Share
from api.domain.lifecycle import JobStatus, StopRequest
from api.store.attempts import (
    claim,
    finish,
    renew_host_lease,
    renew_lease,
    requeue_after_fault,
    requeue_expired,
    still_held,
)
from api.store.clock import db_now
from api.store.db import session_scope
from api.store.dispatching import dispatch_job
from api.store.gangs import (
    HostPart,
    finish_host,
    join,
    mark_joined,
    publish_rendezvous,
    rendezvous,
)
from api.store.jobs import request_cancel
from api.store.tables import Job, JobHost
from api.store.telemetry import list_events

GANG = (Share("host-b", (0,)), Share("host-c", (1, 2)))


def dispatch_gang(database_url: str, job_id: int) -> None:
    with session_scope(database_url) as session:
        assert dispatch_job(session, job_id, "host-a", (0, 1), GANG)


def running_gang(database_url: str, job_id: int) -> None:
    """Dispatched, claimed by node 0 (host-a) and joined by host-b; host-c never came."""
    dispatch_gang(database_url, job_id)
    with session_scope(database_url) as session:
        assert claim(session, job_id, "host-a") is not None
        assert join(session, job_id, "host-b") is not None


def hosts_of(database_url: str, job_id: int) -> list[tuple[int, str, bool]]:
    with session_scope(database_url) as session:
        rows = session.query(JobHost).filter(JobHost.job_id == job_id).order_by(JobHost.node_rank).all()
        return [(row.node_rank, row.worker_id, row.joined_at is not None) for row in rows]


def test_a_gang_dispatch_records_every_host_in_node_order_and_each_joins_once(submit, tiny_spec, job_of,
                                                                             database_url):
    job_id = submit(tiny_spec())
    dispatch_gang(database_url, job_id)
    job = job_of(job_id)
    assert [(host.worker, host.devices) for host in job.placement] == [
        ("host-a", [0, 1]), ("host-b", [0]), ("host-c", [1, 2])]
    assert (job.worker_id, job.devices) == ("host-a", [0, 1])
    assert hosts_of(database_url, job_id) == [
        (0, "host-a", False), (1, "host-b", False), (2, "host-c", False)]

    with session_scope(database_url) as session:
        # A follower may join before node 0 claims: the job is still dispatched.
        assert join(session, job_id, "host-c") == HostPart(2, (1, 2), (2, 1, 2))
        assert join(session, job_id, "host-c") is None  # a duplicate delivery
        assert join(session, job_id, "host-z") is None  # not of this gang
        assert join(session, job_id, "host-a") is None  # node 0 claims, it never joins
        assert claim(session, job_id, "host-b") is None  # only node 0 claims
        claimed = claim(session, job_id, "host-a")
        assert claimed is not None and claimed.attempt == 1
        mark_joined(session, job_id, "host-a")
        assert join(session, job_id, "host-b") == HostPart(1, (0,), (2, 1, 2))
    assert hosts_of(database_url, job_id) == [(0, "host-a", True), (1, "host-b", True), (2, "host-c", True)]


def test_each_host_renews_its_own_lease_and_reads_the_stop_requests(submit, tiny_spec, database_url):
    job_id = submit(tiny_spec())
    dispatch_gang(database_url, job_id)
    with session_scope(database_url) as session:
        assert renew_host_lease(session, job_id, "host-b") == (False, None)  # not joined yet
        join(session, job_id, "host-b")
        claim(session, job_id, "host-a")
        assert renew_host_lease(session, job_id, "host-b") == (True, None)
        assert renew_lease(session, job_id, "host-a") == (True, None)
        request_cancel(session, job_id)
        assert renew_host_lease(session, job_id, "host-b") == (True, StopRequest.CANCEL)


def test_the_rendezvous_is_node_zeros_and_names_the_running_attempt(submit, tiny_spec, database_url):
    job_id = submit(tiny_spec())
    dispatch_gang(database_url, job_id)
    with session_scope(database_url) as session:
        assert rendezvous(session, job_id) is None
        claim(session, job_id, "host-a")
        assert publish_rendezvous(session, job_id, "10.0.0.1:29400")
        assert rendezvous(session, job_id) == ("10.0.0.1:29400", 1)


def test_any_joined_host_may_record_the_ending_and_the_first_record_wins(submit, tiny_spec, job_of,
                                                                        database_url):
    job_id = submit(tiny_spec())
    running_gang(database_url, job_id)
    with session_scope(database_url) as session:
        # host-c never joined: it may not record anything.
        assert finish(session, job_id, worker_id="host-c", outcome=JobStatus.FAILED, message="x",
                      error_code="reward_error") is None
        dispatched_at = job_of(job_id).dispatched_at
        assert still_held(session, job_id, "host-b", dispatched_at)
        older_dispatch = dispatched_at - timedelta(seconds=1)
        assert not still_held(session, job_id, "host-b", older_dispatch)
        failed = finish(session, job_id, worker_id="host-b", outcome=JobStatus.FAILED,
                        message="rank 2 failed: a reward raised", error_code="reward_error")
        assert failed is not None and failed.error.code == "reward_error"
        # node 0, which saw only its peer go, finds the job no longer its own
        assert not still_held(session, job_id, "host-a", dispatched_at)
        assert requeue_after_fault(session, job_id, worker_id="host-a", message="a host was lost",
                                   data={}, max_attempts=5) is None
    assert job_of(job_id).status == "failed"
    assert hosts_of(database_url, job_id) == []  # the leases went with the attempt


def test_a_requeue_releases_every_host_so_a_host_of_the_old_dispatch_can_do_nothing(submit, tiny_spec, job_of,
                                                                                   database_url):
    job_id = submit(tiny_spec())
    running_gang(database_url, job_id)
    with session_scope(database_url) as session:
        assert requeue_after_fault(session, job_id, worker_id="host-b", data={}, max_attempts=5,
                                   message="rank 1 was killed by SIGKILL") is not None
    job = job_of(job_id)
    assert (job.status, job.worker_id, job.placement) == ("queued", None, [])
    with session_scope(database_url) as session:
        assert renew_host_lease(session, job_id, "host-b") == (False, None)
        assert renew_lease(session, job_id, "host-a") == (False, None)
        assert join(session, job_id, "host-c") is None


def test_the_reaper_requeues_a_gang_whose_host_went_silent_or_never_came(submit, tiny_spec, job_of,
                                                                         database_url):
    silent, absent, done = (submit(tiny_spec()) for _ in range(3))
    for job_id in (silent, absent, done):
        dispatch_gang(database_url, job_id)
        with session_scope(database_url) as session:
            claim(session, job_id, "host-a")
            for worker in ("host-b", "host-c"):
                if job_id != absent or worker == "host-b":
                    join(session, job_id, worker)
    with session_scope(database_url) as session:
        finish_host(session, done, "host-b")
        finish_host(session, done, "host-c")
        now = db_now(session) + timedelta(seconds=31)
        hosts, jobs = JobHost.__table__, Job.__table__
        for job_id in (silent, absent, done):  # node 0 keeps renewing the job's own lease
            session.execute(hosts.update().where(hosts.c.job_id == job_id, hosts.c.joined_at.is_not(None))
                            .values(heartbeat_at=now - timedelta(seconds=40)))
            session.execute(jobs.update().where(jobs.c.id == job_id)
                            .values(heartbeat_at=now, dispatched_at=now - timedelta(seconds=40)))
        moved = set(requeue_expired(session, 30.0, now=now, max_attempts=5))
    assert {silent, absent} <= moved and done not in moved
    assert job_of(done).status == "running"
    with session_scope(database_url) as session:
        messages = [event.message for event in list_events(session, silent) if event.type == "requeued"]
    assert messages == ["a host of its gang was lost (its lease expired); back to the queue"]


def test_a_gang_host_that_did_not_join_within_the_claim_window_requeues_its_gang_and_may_not_join_later(
        submit, tiny_spec, job_of, database_url):
    job_id = submit(tiny_spec())
    running_gang(database_url, job_id)  # host-c's message never came
    with session_scope(database_url) as session:
        now = db_now(session) + timedelta(seconds=5)
        assert job_id not in requeue_expired(session, 30.0, now=now, max_attempts=5)  # a lease's wait
        assert job_id in requeue_expired(session, 30.0, now=now, max_attempts=5, claim_window_seconds=3.0)
    assert job_of(job_id).status == "queued"
    with session_scope(database_url) as session:
        assert dispatch_job(session, job_id, "host-a", (0, 1), GANG) == 2
    with session_scope(database_url) as session:  # the first dispatch's message turns up now
        assert join(session, job_id, "host-c", dispatch=1) is None
        assert claim(session, job_id, "host-a", dispatch=1) is None
        assert claim(session, job_id, "host-a", dispatch=2) is not None
        assert join(session, job_id, "host-c", dispatch=2) is not None
