"""The warm spare job process (worker.warm_spare): a real worker's pool process starts one before
any job comes, the job then runs in it (the same pid), and the next pool process starts the next;
a spare dies with the process that started it; a spare that died, or one from another thread, is
not taken (a fresh process is started); with the setting off no spare is started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from waiting import process_gone, wait_until

from api.store.db import session_scope
from api.store.telemetry import list_events
from grpo_core.run import rank_server
from worker import warm_spare

REPO = Path(__file__).resolve().parents[2]


def spares_under(pid: int) -> list[psutil.Process]:
    """The warm spares among ``pid``'s descendants."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            # A rank server forked from a spare has its command line, under a name of its own.
            if ("--warm" in child.cmdline() and "worker.job_process" in child.cmdline()
                    and child.name() != rank_server.SERVER_NAME):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def imported_torch(process: psutil.Process) -> bool:
    """Whether the spare is past its imports: torch's library is mapped into it."""
    try:
        return any("libtorch" in m.path for m in process.memory_maps())
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_job_runs_in_the_spare_its_pool_process_warmed_and_the_next_one_is_warmed(
        processes, submit, tiny_spec, finished, wait_for, pool, database_url, wait_worker_ready):
    worker = processes.worker(pool)
    wait_worker_ready(pool, processes)
    [spare] = wait_until(lambda: spares_under(worker.pid), 60, "the pool process's spare",
                         details=processes.logs)
    wait_until(lambda: imported_torch(spare), 120, "the spare past its imports", interval=0.2)
    supervisor = spare.ppid()
    processes.scheduler()
    job_id = submit(tiny_spec("warm", pool=pool, max_steps=2))
    done = wait_for(lambda: finished(job_id), 120, "the job to finish", processes)
    assert done.status == "succeeded", done.error
    with session_scope(database_url) as session:
        [devices] = [e for e in list_events(session, job_id, limit=1000) if e.type == "devices"]
    # The job's process was the spare: the pool process that ran the job started it, it took the
    # attempt, and it ended with the attempt.
    assert devices.data["pid"] == supervisor
    assert f"job process {spare.pid}: the warm spare takes" in processes.logs()
    assert process_gone(spare.pid)
    # The pool process that ran it is replaced; its successor warms the next job's process.
    [following] = wait_until(lambda: [s for s in spares_under(worker.pid) if s.pid != spare.pid], 60,
                             "the next spare", details=processes.logs)
    assert following.is_running()


def test_the_spare_dies_with_the_process_that_started_it() -> None:
    code = ("import sys, time; from worker import warm_spare; warm_spare.prepare_spare(True); "
            "print(warm_spare._spare.process.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        spare = psutil.Process(int(parent.stdout.readline()))
        assert spare.ppid() == parent.pid and spare.is_running()
        parent.kill()  # SIGKILL: it gets no chance to end its child
        wait_until(lambda: process_gone(spare.pid), 10, "the spare to die with its parent")
    finally:
        parent.kill()
        parent.wait()


@pytest.fixture
def no_spare():
    warm_spare.drop_spare()
    yield
    warm_spare.drop_spare()


def attempt_folder(tmp_path: Path) -> tuple[Path, Path]:
    """An attempt folder with no call in it: a job process given it fails at once (no job)."""
    folder = tmp_path / "attempt"
    (folder / "workdir").mkdir(parents=True)
    return folder, folder / "workdir"


def test_a_dead_spare_is_not_taken_and_a_fresh_process_starts(tmp_path, no_spare) -> None:
    warm_spare.prepare_spare(True)
    dead = warm_spare._spare.process
    dead.kill()
    dead.wait()
    process = warm_spare.start_job_process(*attempt_folder(tmp_path), warm=True)
    try:
        assert process.pid != dead.pid and "--warm" not in process.args
        assert psutil.Process(process.pid).ppid() == psutil.Process().pid  # ours, as a spare would be
    finally:
        process.kill()
        process.wait()


def test_a_spare_from_another_thread_stays_and_a_fresh_process_starts(tmp_path, no_spare) -> None:
    starter = threading.Thread(target=warm_spare.prepare_spare, args=(True,))
    starter.start()
    starter.join()
    spare = warm_spare._spare.process
    process = warm_spare.start_job_process(*attempt_folder(tmp_path), warm=True)
    try:
        # The spare would die with the thread that started it, not with this attempt's: not taken.
        assert process.pid != spare.pid and warm_spare._spare.process is spare
    finally:
        process.kill()
        process.wait()


def test_a_taken_spare_runs_the_attempt_in_its_folder(tmp_path, no_spare) -> None:
    warm_spare.prepare_spare(True)
    spare = warm_spare._spare.process
    folder, workdir = attempt_folder(tmp_path)
    process = warm_spare.start_job_process(folder, workdir, warm=True)
    assert process is spare and warm_spare._spare is None
    # No call in the folder: the attempt fails reading it (a spare given none exits 0: below).
    assert process.wait(timeout=120) != 0


def test_a_dropped_spare_ends_without_an_attempt(no_spare) -> None:
    warm_spare.prepare_spare(True)
    spare = warm_spare._spare.process
    folder = warm_spare._spare.folder
    warm_spare.drop_spare()
    assert spare.returncode is not None and warm_spare._spare is None and not folder.exists()


def test_a_spare_runs_its_attempt_in_the_attempts_folder_with_the_jobs_devices(tmp_path) -> None:
    """The spare's side of the handover, its attempt's body replaced by a report of where it runs:
    the working directory, the import path's first entry and the devices are the attempt's."""
    folder, workdir = attempt_folder(tmp_path)
    waiting = tmp_path / "waiting"
    waiting.mkdir()
    code = ("import json, os, sys; import worker.job_process as j; "
            "j.attempt = lambda folder: print(json.dumps([folder, os.getcwd(), sys.path[0], "
            "os.environ.get('CUDA_VISIBLE_DEVICES')]), flush=True); j.warm(os.getppid())")
    call = {"folder": str(folder), "workdir": str(workdir), "environment": {"CUDA_VISIBLE_DEVICES": "3"}}
    done = subprocess.run([sys.executable, "-c", code], cwd=waiting, input=json.dumps(call) + "\n",
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [str(folder), str(workdir), str(workdir), "3"]
    assert not waiting.exists()  # the folder it waited in is gone with the wait


def test_a_changed_environment_starts_a_fresh_process(tmp_path, no_spare, monkeypatch) -> None:
    warm_spare.prepare_spare(True)
    spare = warm_spare._spare.process
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    process = warm_spare.start_job_process(*attempt_folder(tmp_path), warm=True)
    try:
        assert process.pid != spare.pid  # read at import by the hub client: the spare cannot take it
    finally:
        process.kill()
        process.wait()
    monkeypatch.undo()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # handed over: the spare takes the attempt
    process = warm_spare.start_job_process(*attempt_folder(tmp_path / "second"), warm=True)
    assert process is spare
    process.wait(timeout=120)


def test_with_the_setting_off_no_spare_starts_and_none_is_taken(tmp_path, no_spare) -> None:
    warm_spare.prepare_spare(False)
    assert warm_spare._spare is None
    warm_spare.prepare_spare(True)
    spare = warm_spare._spare.process
    process = warm_spare.start_job_process(*attempt_folder(tmp_path), warm=False)
    try:
        assert process.pid != spare.pid
    finally:
        process.kill()
        process.wait()
