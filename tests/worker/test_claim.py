"""The claim is the one guarded UPDATE that makes delivery at-least-once safe: of two
concurrent claims exactly one wins, and a delivery that finds its job no longer ``dispatched``
(a duplicate, or a stale message) leaves no trace at all. Only the worker holding the lease moves
the job on: a machine fault requeues it (as many times as its attempts allow) or, while being
cancelled, ends it cancelled."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import redis
from sqlalchemy import select

from api.domain.lifecycle import Transition
from api.store.attempts import TOO_MANY_ATTEMPTS, claim, requeue_after_fault, requeue_expired
from api.store.clock import db_now
from api.store.db import session_scope
from api.store.dispatching import dispatch_job, undispatch_unclaimed
from api.store.jobs import request_cancel, transition
from api.store.tables import Job, utcnow
from api.store.telemetry import list_events


def dispatched(database_url: str, job_id: int) -> None:
    with session_scope(database_url) as session:
        # Promised to no worker in particular: any delivery may claim it.
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})


def test_of_two_concurrent_claims_exactly_one_wins(submit, tiny_spec, job_of, database_url):
    job_id = submit(tiny_spec())
    dispatched(database_url, job_id)
    barrier = threading.Barrier(2)

    def attempt(worker_id: str):
        barrier.wait()
        with session_scope(database_url) as session:
            return claim(session, job_id, worker_id)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(attempt, ["worker-a", "worker-b"]))
    winners = [job for job in results if job is not None]
    assert len(winners) == 1
    job = job_of(job_id)
    assert (job.status, job.worker_id, job.attempt) == ("running", winners[0].worker_id, 1)
    with session_scope(database_url) as session:
        assert [e.type for e in list_events(session, job_id)].count("running") == 1


def test_a_delivery_of_a_job_that_is_not_dispatched_has_no_effect(task_settings, submit, tiny_spec, job_of,
                                                                  database_url, redis_url):
    from worker.tasks import run_job

    job_id = submit(tiny_spec())
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        assert claim(session, job_id, "first-worker") is not None
    before = job_of(job_id)
    with session_scope(database_url) as session:
        events_before = list_events(session, job_id)

    assert run_job(job_id) == "not_claimed"  # the task body, in this process, as a child runs it

    assert job_of(job_id) == before
    with session_scope(database_url) as session:
        assert list_events(session, job_id) == events_before
    assert redis.Redis.from_url(redis_url).xlen(task_settings.redis_keys.job_stream(job_id)) == 0


def test_the_lease_reports_a_cancel_and_refuses_a_worker_that_lost_the_job(submit, tiny_spec, settings,
                                                                          database_url, redis_url):
    from worker.heartbeat import JobLease, running_jobs

    job_id = submit(tiny_spec())
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")
    client = redis.Redis.from_url(redis_url)
    owner = JobLease(settings, job_id, "owner", client, devices=[1])
    stranger = JobLease(settings, job_id, "stranger", client)

    owner.beat()
    assert (owner.lost, owner.asked) == (False, None)
    # What the worker's heartbeat reports: the job on its device, and device 0 of 2 free.
    keys = settings.redis_keys
    assert running_jobs(client, keys.busy("owner"), 2, int(time.time() * 1000)) == {job_id: [1]}
    assert client.hexists(keys.busy("stranger"), str(job_id)) is False  # a lost lease marks nothing
    with session_scope(database_url) as session:
        assert request_cancel(session, job_id).status == "cancelling"
    owner.beat()
    assert owner.asked == "cancel"  # the supervisor asks the job to checkpoint and stop
    stranger.beat()
    assert stranger.lost is True  # e.g. requeued and claimed by another worker: its process is killed
    owner.stop()
    assert client.hlen(keys.busy("owner")) == 0


def test_an_expired_device_mark_is_dropped_and_a_job_without_devices_has_the_whole_worker(redis_url,
                                                                                          settings):
    from worker.heartbeat import running_jobs

    client = redis.Redis.from_url(redis_url)
    key = settings.redis_keys.busy(f"w-{time.time_ns()}")
    now = int(time.time() * 1000)
    client.hset(key, mapping={"7": json.dumps({"devices": None, "until": now + 60_000}),
                              "8": json.dumps({"devices": [2], "until": now - 1})})  # its child was killed
    assert running_jobs(client, key, 3, now) == {7: [0, 1, 2]}
    assert client.hkeys(key) == [b"7"]
    client.delete(key)


def test_a_machine_fault_requeues_the_job_until_its_attempts_run_out(submit, tiny_spec, job_of, database_url):
    def died(worker_id: str):
        with session_scope(database_url) as session:
            return requeue_after_fault(session, job_id, worker_id=worker_id, message="rank 1 was killed",
                                       data={"rank": 1}, max_attempts=2)

    job_id = submit(tiny_spec())
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")
    requeued = died("owner")
    assert (requeued.status, requeued.worker_id, requeued.devices) == ("queued", None, None)
    with session_scope(database_url) as session:
        event = list_events(session, job_id)[-1]
    assert (event.type, event.data) == ("requeued", {"rank": 1})
    assert event.message == "rank 1 was killed; back to the queue"

    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")
    assert died("stranger") is None and job_of(job_id).status == "running"  # not its lease
    failed = died("owner")  # the second attempt of at most 2
    assert (failed.status, failed.error.code) == ("failed", TOO_MANY_ATTEMPTS)
    assert failed.error.message == "gave up after 2 attempts; the last: rank 1 was killed"


def test_a_machine_fault_while_cancelling_ends_the_job_cancelled(submit, tiny_spec, database_url):
    job_id = submit(tiny_spec())
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")
        request_cancel(session, job_id)
    with session_scope(database_url) as session:
        job = requeue_after_fault(session, job_id, worker_id="owner", message="rank 0 was killed", data={},
                                  max_attempts=5)
    assert job.status == "cancelled"


def test_an_expired_lease_requeues_the_job_until_its_attempts_run_out(submit, tiny_spec, job_of,
                                                                      database_url):
    def reap() -> list[int]:
        with session_scope(database_url) as session:  # lease 0 s: every lease has expired
            return requeue_expired(session, 0.0, max_attempts=2)

    job_id = submit(tiny_spec())
    for attempt in (1, 2):
        dispatched(database_url, job_id)
        if attempt == 2:  # never claimed: no attempt used, so it goes back whatever the count
            assert job_id in reap() and job_of(job_id).status == "queued"
            dispatched(database_url, job_id)
        with session_scope(database_url) as session:
            claim(session, job_id, f"worker-{attempt}")
        assert job_id in reap()  # (with other tests' jobs: the database is the module's)
        job = job_of(job_id)
        assert job.attempt == attempt
        assert job.status == ("queued" if attempt == 1 else "failed")  # the second of at most 2
    assert job.error.code == TOO_MANY_ATTEMPTS
    assert job.error.message == "gave up after 2 attempts; the last: lease expired"
    with session_scope(database_url) as session:
        assert list_events(session, job_id)[-1].data["previous_status"] == "running"



def test_a_preemption_or_a_resume_leaves_the_attempt_budget_whole(submit, tiny_spec, job_of, database_url):
    """GRPO_MAX_ATTEMPTS bounds machine faults since the job last stopped cleanly: an attempt the
    scheduler preempted or the user paused is no fault, so it spends none of the budget."""
    from api.store.dispatching import yield_preempted
    from api.store.jobs import request_pause, resume

    def died() -> str:
        with session_scope(database_url) as session:
            return requeue_after_fault(session, job_id, worker_id="owner", message="rank 1 was killed",
                                       data={}, max_attempts=2).status

    job_id = submit(tiny_spec())
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")  # attempt 1, preempted
        assert yield_preempted(session, job_id, "owner", step=2)
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")  # attempt 2, paused by its user
        request_pause(session, job_id)
        assert transition(session, job_id, via=Transition.STOP_PAUSED, worker_id="owner")
        resume(session, job_id)
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")  # attempt 3: its fault is the first of two allowed
    assert died() == "queued" and job_of(job_id).attempt == 3
    dispatched(database_url, job_id)
    with session_scope(database_url) as session:
        claim(session, job_id, "owner")  # attempt 4: the second fault in a row uses the budget up
    assert died() == "failed" and job_of(job_id).error.code == TOO_MANY_ATTEMPTS


def test_a_dispatch_not_claimed_in_its_window_is_made_again_and_its_late_delivery_refused(
        task_settings, submit, tiny_spec, job_of, database_url):
    from worker.tasks import run_job

    lost, claimed, young = (submit(tiny_spec(name)) for name in ("lost", "claimed", "young"))
    with session_scope(database_url) as session:
        assert [dispatch_job(session, j, "late-worker") for j in (lost, claimed, young)] == [1, 1, 1]
        assert claim(session, claimed, "late-worker", dispatch=1) is not None
        later = db_now(session) + timedelta(seconds=31)
        old = Job.__table__.update().where(Job.id.in_([lost, claimed])).values(
            dispatched_at=db_now(session) - timedelta(seconds=31))
        session.execute(old)
    with session_scope(database_url) as session:  # (other tests' jobs may be older: the module's database)
        moved = undispatch_unclaimed(session, 30.0)
    assert lost in moved and claimed not in moved and young not in moved
    assert [job_of(job_id).status for job_id in (lost, claimed, young)] == ["queued", "running", "dispatched"]
    job = job_of(lost)
    assert (job.attempt, job.worker_id, job.dispatched_at) == (0, None, None)  # no attempt used
    with session_scope(database_url) as session:
        assert session.scalar(select(Job.retry_at).where(Job.id == lost)) is None  # no backoff either
        [event] = [e for e in list_events(session, lost) if e.type == "dispatch_failed"]
        assert dispatch_job(session, lost, "late-worker") == 2  # the scheduler places it again
    assert event.data == {"reason": "not_claimed", "dispatch": 1, "claim_window_seconds": 30.0}

    # The first dispatch's message arrives now, at the worker the job is dispatched to again.
    assert run_job(lost, 1) == "not_claimed"
    assert job_of(lost).status == "dispatched"
    with session_scope(database_url) as session:
        assert claim(session, lost, "late-worker", dispatch=2) is not None  # its own message claims it
        moved = undispatch_unclaimed(session, 30.0, now=later)  # the young one's window is over too
    assert young in moved and lost not in moved and claimed not in moved
    assert (job_of(lost).status, job_of(lost).attempt) == ("running", 1)


def test_the_lease_leaves_an_unclaimed_dispatch_to_the_claim_window(submit, tiny_spec, job_of, database_url):
    job_id = submit(tiny_spec())
    with session_scope(database_url) as session:
        assert dispatch_job(session, job_id, "slow-worker") == 1
    with session_scope(database_url) as session:  # the lease (1 s) is long over; the window (60 s) is not
        now = db_now(session) + timedelta(seconds=5)
        assert job_id not in requeue_expired(session, 1.0, now=now, max_attempts=5, claim_window_seconds=60.0)
        assert job_id not in undispatch_unclaimed(session, 60.0, now=now)
    assert job_of(job_id).status == "dispatched"


def test_a_fault_reported_late_leaves_the_next_dispatch_to_the_same_worker_alone(submit, tiny_spec, job_of,
                                                                                 database_url):
    job_id = submit(tiny_spec())

    def fault():  # the worker's main process sees the attempt's pool process gone (again, late)
        with session_scope(database_url) as session:
            return requeue_after_fault(session, job_id, worker_id="owner", message="pool process died",
                                       data={}, max_attempts=5)

    with session_scope(database_url) as session:
        assert dispatch_job(session, job_id, "owner") == 1
        assert claim(session, job_id, "owner", dispatch=1) is not None
    assert fault().status == "queued"
    with session_scope(database_url) as session:
        assert dispatch_job(session, job_id, "owner") == 2
    assert fault() is None
    assert job_of(job_id).status == "dispatched"  # its message will claim it
    with session_scope(database_url) as session:
        assert claim(session, job_id, "owner", dispatch=2) is not None
