"""The files through which a job's process and its supervisor talk, in one folder per attempt.

The supervisor writes the call (what to train) and, when a cancel or a preemption arrives, the
stop request; the job's process writes its progress after every step and, at the end, its
:class:`worker.outcome.Outcome` or :class:`worker.outcome.Fault`. Files, not pipes: either side
may die at any moment, and a file written whole (under another name, then renamed) is never
half-read, needs no reader thread, and holds no GIL the other side needs (a job stuck in a regex
holds its own interpreter's, not its supervisor's).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from api.domain.lifecycle import StopRequest, stronger_stop
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store.gangs import HostPart
from grpo_core.run.processes import write_whole
from worker.outcome import Fault, Outcome, PartDone

_CALL, _OUTCOME, _PROGRESS, _STOP = "call.pkl", "outcome.pkl", "progress.json", "stop.json"
_SUPERVISED = "supervised.json"


class AttemptFiles:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    # The supervisor's side.
    def write_call(self, job: JobRead, settings: Settings, worker_id: str,
                   part: HostPart | None = None) -> None:
        """What to train; ``part``: this host's part of a gang (None: the job runs here alone)."""
        write_whole(self.folder / _CALL, pickle.dumps((job, settings, worker_id, part)))

    def request_stop(self, reason: StopRequest) -> None:
        """``cancel``, ``pause`` or ``preempt``; a request replaces an earlier one only if it
        outranks it (:func:`api.domain.lifecycle.stronger_stop`)."""
        current = self.stop_reason()
        if stronger_stop(current, reason) != current:
            write_whole(self.folder / _STOP, json.dumps({"reason": reason}).encode())

    def mark_supervised(self, beat: int) -> None:
        """The supervisor is alive and renewing the lease (its ``beat``-th turn): the job's
        process stops on its own when this stops changing (:meth:`supervised`)."""
        write_whole(self.folder / _SUPERVISED, json.dumps({"beat": beat}).encode())

    def read_outcome(self) -> Outcome | Fault | PartDone | None:
        """None when the job's process ended without saying how (it was killed, or crashed)."""
        try:
            return pickle.loads((self.folder / _OUTCOME).read_bytes())
        except FileNotFoundError:
            return None

    def progress(self) -> tuple[int, int] | None:
        """``(last step finished, marks so far)``: any change is progress. None before the first."""
        try:
            data = json.loads((self.folder / _PROGRESS).read_text())
            return int(data["step"]), int(data["mark"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    # The job's side.
    def read_call(self) -> tuple[JobRead, Settings, str, HostPart | None]:
        return pickle.loads((self.folder / _CALL).read_bytes())

    def write_outcome(self, outcome: Outcome | Fault | PartDone) -> None:
        write_whole(self.folder / _OUTCOME, pickle.dumps(outcome))

    def mark_progress(self, step: int, mark: int) -> None:
        write_whole(self.folder / _PROGRESS, json.dumps({"step": step, "mark": mark}).encode())

    def supervised(self) -> int | None:
        """The supervisor's last beat (:meth:`mark_supervised`); None before the first."""
        try:
            return int(json.loads((self.folder / _SUPERVISED).read_text())["beat"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def stop_reason(self) -> StopRequest | None:
        try:
            data: Any = json.loads((self.folder / _STOP).read_text())
            return StopRequest(data["reason"])
        except (FileNotFoundError, ValueError, TypeError, KeyError):
            return None
