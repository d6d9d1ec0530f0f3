"""What ``grpo dev``'s terminal says about jobs while it serves: a line when a job appears or
changes status, one about every ``every`` seconds while it makes steps, and how it ended. The
services' own output goes to their logs (``api.cli.dev``); this is the short account instead.

:class:`JobTicker` is pure (jobs in, lines out); :func:`read_jobs` reads them from the stack's
database, which ``grpo dev`` has open anyway and which needs no API key whatever the auth mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.domain.lifecycle import TERMINAL_STATUSES

RECENT_JOBS = 50  # the newest jobs are the ones being watched; older ones have ended long ago


@dataclass
class JobTicker:
    every: float = 10.0  # seconds between two step lines of one job
    seen: dict[int, tuple[str, int]] | None = None  # job id -> (status, last step) at the last look
    stepped_at: dict[int, float] = field(default_factory=dict)  # job id -> when its last step line was

    def lines(self, jobs: list[dict[str, Any]], now: float) -> list[str]:
        """What changed since the last call; the first call only takes note (the jobs an earlier
        run left are not news)."""
        known, self.seen = self.seen, {job["id"]: (job["status"], job["last_step"]) for job in jobs}
        if known is None:
            return []
        out = []
        for job in sorted(jobs, key=lambda item: item["id"]):
            status, step = known.get(job["id"], (None, 0))
            if job["status"] != status:
                out.append(self._status_line(job))
                self.stepped_at[job["id"]] = now
            elif job["last_step"] > step and now - self.stepped_at.get(job["id"], 0.0) >= self.every:
                total = job["max_steps"] or "?"
                out.append(f"job {job['id']} {job['name']}: step {job['last_step']}/{total}")
                self.stepped_at[job["id"]] = now
        return out

    @staticmethod
    def _status_line(job: dict[str, Any]) -> str:
        detail = f" ({job['pending_reason']})" if job.get("pending_reason") else ""
        if job["status"] in TERMINAL_STATUSES:
            error = job.get("error")
            failure = f" [{error['code']}] {error['message']}" if error else ""
            detail = f" at step {job['last_step']}{failure}"
        return f"job {job['id']} {job['name']}: {job['status']}{detail}"


def read_jobs(database_url: str) -> list[dict[str, Any]]:
    from api.store import jobs
    from api.store.db import session_scope

    with session_scope(database_url) as session:
        return [job.model_dump(mode="json") for job in jobs.list_jobs(session, None, limit=RECENT_JOBS,
                                                                      newest_first=True)]
