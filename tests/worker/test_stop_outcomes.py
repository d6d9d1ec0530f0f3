"""A stop the job was asked for ends in one status, whether the job stopped at a step
(:func:`worker.training.ending`) or its supervisor killed a process that did not stop in time
(:func:`worker.runner.forced_outcome`): both read :func:`worker.outcome.outcome_for_stop`."""

from __future__ import annotations

import pytest

from api.domain.lifecycle import JobStatus, StopRequest
from api.schemas.jobs import JobRead
from api.settings import Settings
from grpo_core.run.trainer import TrainResult
from worker.outcome import STATUS_AFTER_STOP
from worker.runner import forced_outcome
from worker.supervisor import Ended
from worker.training import ending

EXPECTED = {StopRequest.CANCEL: JobStatus.CANCELLED, StopRequest.PAUSE: JobStatus.PAUSED,
            StopRequest.PREEMPT: JobStatus.PREEMPTED}


def test_every_stop_request_has_its_status() -> None:
    assert STATUS_AFTER_STOP == EXPECTED


@pytest.mark.parametrize("stop", list(StopRequest))
def test_a_stop_ends_in_the_same_status_by_the_job_or_by_its_supervisor(stop: StopRequest) -> None:
    by_job = ending(TrainResult(step=7, stopped=True, checkpoint=None), stop)
    job = JobRead.model_construct(id=1)
    settings = Settings(database_url="sqlite:///./grpo.db", cancel_grace_seconds=30)
    killed = Ended(report=None, killed_for=stop.value, returncode=-9, last_step=7)
    forced = forced_outcome(killed, settings, job)
    assert by_job.status is forced.status is EXPECTED[stop]
    assert (by_job.step, forced.step) == (7, 7)
    assert by_job.message == f"{EXPECTED[stop].value} at step 7"
    assert forced.message == (f"{EXPECTED[stop].value}: did not stop within 30 s; its process was killed "
                              "after step 7")


def test_a_run_that_was_not_asked_to_stop_finished() -> None:
    assert ending(TrainResult(step=5, stopped=False, checkpoint=None), StopRequest.CANCEL).status \
        is JobStatus.SUCCEEDED
    assert ending(TrainResult(step=5, stopped=True, checkpoint=None), None).status is JobStatus.SUCCEEDED


def test_an_unknown_reason_to_kill_is_refused() -> None:
    settings = Settings(database_url="sqlite:///./grpo.db")
    with pytest.raises(ValueError, match="unknown reason"):
        forced_outcome(Ended(report=None, killed_for="boredom", returncode=-9, last_step=0), settings,
                       JobRead.model_construct(id=1))
