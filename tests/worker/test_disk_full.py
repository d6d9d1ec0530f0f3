"""A full disk under a job's checkpoint, through the job process's body (run in this process, so
``torch.save`` can be made to fail like a full disk) and the supervisor's recording of its outcome:
the job fails ``disk_full`` rather than ``internal_error``, no temporary folder is left, the
checkpoint before it stays whole, and failure text a database would refuse (a NUL) is still
recorded. Retention runs through the whole task body (supervisor and job process)."""

from __future__ import annotations

import errno
from pathlib import Path

import torch

from api.domain.lifecycle import Transition
from api.store.attempts import claim
from api.store.db import session_scope
from api.store.jobs import transition
from api.store.tables import utcnow

real_save = torch.save


def test_a_full_disk_at_a_checkpoint_fails_the_job_as_disk_full_and_cleans_up(
    task_settings, submit, tiny_spec, job_of, database_url, monkeypatch, tmp_path
):
    from api.artifacts.paths import checkpoint_dir
    from worker.attempt import run_attempt
    from worker.attempt_files import AttemptFiles
    from worker.runner import record_outcome

    job_id = submit(tiny_spec(max_steps=3, checkpoint_every=1))
    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
        job = claim(session, job_id, "late-worker")

    def full_at_step_2(obj, f, *args, **kwargs):
        if ".step-2.tmp-" in str(f):
            Path(f).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device\x00")  # the NUL: text Postgres refuses
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_at_step_2)
    outcome = run_attempt(job, task_settings, "late-worker", AttemptFiles(tmp_path))
    assert record_outcome(job, "late-worker", task_settings, None, outcome) == "failed"

    job = job_of(job_id)
    assert (job.status, job.error.code) == ("failed", "disk_full")
    assert ".step-2.tmp-" in job.error.message and "bytes free" in job.error.message
    assert "\x00" not in job.error.message
    checkpoints = checkpoint_dir(task_settings, job_id)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1"]
    assert (checkpoints / "step-1" / "trainer_state.json").is_file()
    assert job.latest_checkpoint == str(checkpoints / "step-1")


def test_retention_removes_pruned_checkpoints_from_the_jobs_list(task_settings, submit, tiny_spec, job_of,
                                                                 database_url):
    from api.artifacts.paths import checkpoint_dir
    from api.store.telemetry import list_checkpoints
    from worker.tasks import run_job

    job_id = submit(tiny_spec(max_steps=4, checkpoint_every=1, checkpoint_keep_last=2))
    with session_scope(database_url) as session:
        assert transition(session, job_id, via=Transition.DISPATCH, values={"dispatched_at": utcnow()})
    assert run_job(job_id) == "succeeded"

    folders = sorted(p.name for p in checkpoint_dir(task_settings, job_id).iterdir())
    assert folders == ["step-3", "step-4"]
    with session_scope(database_url) as session:
        listed = list_checkpoints(session, job_id)
    # The job lists what is on disk: the rows of deleted checkpoints go with their folders.
    assert [(c.step, Path(c.path).name) for c in listed] == [(3, "step-3"), (4, "step-4")]
    assert job_of(job_id).latest_checkpoint.endswith("step-4")
