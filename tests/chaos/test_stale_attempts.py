"""A stale attempt fenced out of its job's artifacts (issue 32, item 12), on real workers, scheduler,
Postgres and Redis, with a short lease:

* a worker frozen whole (SIGSTOP to every process of it: a paused VM) past its lease, the job
  requeued and finished by another worker, then thawed (its job's process first, as a VM's
  scheduler may run it first): nothing under the job's folder changes, no file added, replaced or
  removed, and no SQL row of the job either;
* only the supervisor frozen (the job's process runs in a session of its own, so it trains on): the
  job's process ends itself once a lease passed without its supervisor, and publishes nothing.
"""

from __future__ import annotations

import hashlib
import json
import signal
import uuid
from pathlib import Path

import psutil
import pytest
import redis

from api.artifacts.paths import job_dir, job_prefix
from api.settings import Settings
from api.storage import ObjectStore, open_store
from api.store.db import session_scope
from api.store.telemetry import list_checkpoints, list_events, list_metrics

LEASE = {"GRPO_LEASE_SECONDS": "6"}
ONE_SLOT = {"GRPO_WORKER_GPUS": "1", **LEASE}


def snapshot(settings: Settings, database_url: str, job_id: int, store: ObjectStore | None = None) -> dict:
    """Every file under the job's folder (the default store is that folder), or with ``store`` every
    object under the job's prefix, with its SHA-256 and when it was written; and the job's rows."""
    if store is None:
        root = job_dir(settings, job_id)
        files = {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
                 for p in sorted(root.rglob("*")) if p.is_file()}
    else:
        files = {}
        for info in store.list(job_prefix(job_id)):
            with store.open_read(info.key) as stream:
                digest = hashlib.sha256(b"".join(stream)).hexdigest()
            files[info.key.removeprefix(job_prefix(job_id))] = (digest, info.modified)
    with session_scope(database_url) as session:
        rows = {"checkpoints": [c.step for c in list_checkpoints(session, job_id)],
                "metrics": [(m.step, json.dumps(m.values, sort_keys=True))
                            for m in list_metrics(session, job_id)]}
    return {"files": files, **rows}


def requeued(database_url: str, job_id: int) -> bool:
    with session_scope(database_url) as session:
        return any(e.type == "requeued" for e in list_events(session, job_id, limit=1000))


def own_folder(kept: str, folder: Path) -> dict[str, str]:
    return {"GRPO_ARTIFACTS_ROOT": str(folder)} if kept == "bucket" else {}


def busy_mark(settings: Settings, worker_id: str, job_id: int) -> dict | None:
    raw = redis.Redis.from_url(settings.redis_url).hget(settings.redis_keys.busy(worker_id), str(job_id))
    return json.loads(raw) if raw else None


def ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def log_of(processes, process) -> str:
    return next(log for started, log in processes.started if started is process).read_text()


def signal_all(processes: list[psutil.Process], number: signal.Signals) -> None:
    for process in processes:
        try:
            process.send_signal(number)
        except psutil.NoSuchProcess:
            pass


@pytest.mark.parametrize("kept", ["folder", "bucket"])
def test_a_worker_frozen_past_its_lease_and_thawed_changes_nothing_of_the_job_it_lost(
        kept, processes, submit, tiny_spec, job_of, finished, wait_for, pool, database_url, settings,
        wait_worker_ready, request, tmp_path):
    """``folder``: the artifacts folder is the store (the default); ``bucket``: an S3 server's
    bucket, each worker with a folder of its own."""
    env, store = {}, None
    if kept == "bucket":
        s3_server = request.getfixturevalue("s3_server")
        env = {"GRPO_STORAGE_URL": s3_server.url(f"t-{uuid.uuid4().hex[:8]}"), **s3_server.env}
        store = open_store(env["GRPO_STORAGE_URL"], env=env)
    frozen_worker = processes.worker(pool, **ONE_SLOT, **env, **own_folder(kept, tmp_path / "frozen"))
    [worker_id] = wait_worker_ready(pool, processes)
    processes.scheduler(**LEASE, **env)
    job_id = submit(tiny_spec("stale", pool=pool, grpo={"max_steps": 30}, checkpoint_every=1,
                              report_to=["tensorboard"]))
    mark = wait_for(lambda: (m := busy_mark(settings, worker_id, job_id)) and m.get("job_pid")
                    and job_of(job_id).last_step >= 2 and m, 180, "the job past step 2", processes,
                    interval=0.05)
    job_process = psutil.Process(mark["job_pid"])
    tree = [psutil.Process(frozen_worker.pid), *psutil.Process(frozen_worker.pid).children(recursive=True)]
    assert job_process in tree
    signal_all(tree, signal.SIGSTOP)
    try:
        stopped_at = job_of(job_id).last_step
        # Takes the job over once the lease expires.
        processes.worker(pool, **ONE_SLOT, **env, **own_folder(kept, tmp_path / "other"))
        done = wait_for(lambda: finished(job_id), 300, "the job to finish on the other worker", processes)
        assert (done.status, done.attempt) == ("succeeded", 2), done.error
        assert done.worker_id != worker_id and stopped_at < 30
        before = snapshot(settings, database_url, job_id, store)
        assert before["files"] and before["checkpoints"]
        # Thawed, the job's process first: it would train on and write before its supervisor,
        # thawed a moment later, sees the lease lost.
        job_process.send_signal(signal.SIGCONT)
        psutil.wait_procs([job_process], timeout=3)
        signal_all(tree, signal.SIGCONT)
    finally:
        signal_all(tree, signal.SIGCONT)
    psutil.wait_procs([job_process], timeout=60)
    assert not job_process.is_running(), "the stale job's process outlived its supervisor"
    wait_for(lambda: "'lost'" in log_of(processes, frozen_worker), 60, "the stale attempt's task to end",
             processes)
    assert_unchanged_but_the_stale_attempts_own(before, snapshot(settings, database_url, job_id, store))


def assert_unchanged_but_the_stale_attempts_own(before: dict, after: dict) -> None:
    """Nothing of the job changed, except that the stale attempt (1) may have taken back its own
    upload the freeze cut short: keys of attempt 1 that no checkpoint row names, only removed."""
    assert {key: value for key, value in after.items() if key != "files"} == {
        key: value for key, value in before.items() if key != "files"}
    # None added or changed.
    assert {key: before["files"].get(key) for key in after["files"]} == after["files"]
    for key in set(before["files"]) - set(after["files"]):
        assert ".attempt-1/" in key or key.endswith(".attempt-1"), f"{key} of the job's was removed"
        step = key.removeprefix("checkpoints/step-").split(".", 1)[0]
        published = step.isdigit() and int(step) in before["checkpoints"]
        assert not published, f"{key} is a published checkpoint's"


def test_a_job_process_whose_supervisor_freezes_ends_itself_within_its_lease(
        processes, submit, tiny_spec, job_of, wait_for, pool, database_url, settings, wait_worker_ready):
    processes.worker(pool, **ONE_SLOT)
    [worker_id] = wait_worker_ready(pool, processes)
    processes.scheduler(**LEASE)
    # Long enough that it cannot reach its end unsupervised within the wait below.
    job_id = submit(tiny_spec("orphan", pool=pool, grpo={"max_steps": 5000}, checkpoint_every=2))
    mark = wait_for(lambda: (m := busy_mark(settings, worker_id, job_id)) and m.get("job_pid")
                    and job_of(job_id).last_step >= 2 and m, 180, "the job past step 2", processes,
                    interval=0.05)
    supervisor, job_process = psutil.Process(mark["pid"]), psutil.Process(mark["job_pid"])
    supervisor.send_signal(signal.SIGSTOP)
    try:
        # Its lease expires 6 s after the supervisor's last renewal; the job's process must end by
        # itself (its supervisor cannot kill it), and, its parent frozen, stays a zombie.
        wait_for(lambda: ended(job_process), 120, "the job's process to end itself", processes, interval=0.2)
        at_end = snapshot(settings, database_url, job_id)
        # The reaper requeued it: nothing published after that.
        wait_for(lambda: requeued(database_url, job_id), 60, "the job back in the queue", processes)
        after = snapshot(settings, database_url, job_id)
    finally:
        if job_process.is_running():  # the old way: in a session of its own, it outlives the test
            job_process.kill()
        supervisor.send_signal(signal.SIGCONT)
    assert after == at_end
    published = {int(name.split("/")[1].removeprefix("step-")) for name in after["files"]
                 if name.startswith("checkpoints/")}
    assert published == set(after["checkpoints"]), "a checkpoint folder no row names"
