"""``grpo dev``'s account of the jobs (``api.cli.dev_progress.JobTicker``), on hand-built job
records: what is news, how often a running job's steps are told, how a job's end reads. Through
a real ``grpo dev``: tests/e2e/test_grpo_cli.py."""

from __future__ import annotations

from api.cli.dev_progress import JobTicker


def job(status: str, step: int = 0, **fields) -> dict:
    return {"id": 3, "name": "tiny", "status": status, "last_step": step, "max_steps": 60,
            "pending_reason": None, "error": None, **fields}


def test_only_changes_are_told_and_steps_at_most_every_ten_seconds() -> None:
    ticker = JobTicker(every=10.0)
    old = {**job("succeeded", 60), "id": 1}
    assert ticker.lines([old], now=0.0) == []  # what an earlier run left is not news
    assert ticker.lines([old, job("queued", pending_reason="no_workers")], now=1.0) == \
        ["job 3 tiny: queued (no_workers)"]
    assert ticker.lines([old, job("running")], now=2.0) == ["job 3 tiny: running"]
    assert ticker.lines([old, job("running", 4)], now=5.0) == []  # 3 s after the last line
    assert ticker.lines([old, job("running", 9)], now=12.0) == ["job 3 tiny: step 9/60"]
    assert ticker.lines([old, job("running", 9)], now=30.0) == []  # no step since
    assert ticker.lines([old, job("running", 12, max_steps=None)], now=31.0) == ["job 3 tiny: step 12/?"]
    error = {"code": "stalled", "message": "no step for 1800 s"}
    assert ticker.lines([old, job("failed", 12, error=error)], now=32.0) == \
        ["job 3 tiny: failed at step 12 [stalled] no step for 1800 s"]
    assert ticker.lines([old, job("failed", 12, error=error)], now=50.0) == []
