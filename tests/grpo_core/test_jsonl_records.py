"""``grpo train``'s records (``DIR/metrics.jsonl``, ``samples.jsonl``, ``events.jsonl``) on a real
full disk (tests/full_disk.py: a small tmpfs, filled): the write is ``disk_full`` naming the file
and the bytes free, the file keeps whole lines only, and once there is room ``--resume`` reads it
back (dropping the steps it will train again) and appends on."""

from __future__ import annotations

import json

import pytest
from full_disk import small_disk

from grpo_core.errors import GRPOError
from grpo_core.run.local_run import JsonlRecorder


def rows(step: int, width: int = 10) -> list[dict]:
    return [{"step": step, "completion": f"answer {n} " + "x" * width, "reward": 0.5} for n in range(4)]


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_full_disk_under_the_sample_dump_is_disk_full_and_leaves_whole_lines(tmp_path) -> None:
    with small_disk(tmp_path / "disk", 1 << 20) as disk:
        recorder = JsonlRecorder(disk.path)
        recorder.on_samples(1, rows(1))
        disk.fill(leave=4096)  # one page: the next rows fit partly, as on a disk that fills mid-write
        with pytest.raises(GRPOError) as raised:
            recorder.on_samples(2, rows(2, width=3000))
        assert raised.value.code == "disk_full"
        assert f"{recorder.samples} ({disk.free_bytes} bytes free)" in raised.value.message
        assert lines(recorder.samples) == rows(1)  # no half-written row for the next reader to choke on

        disk.free()
        recorder.on_samples(2, rows(2))
        recorder.truncate_after(1)  # what --resume from a step-1 checkpoint does
        recorder.on_samples(2, rows(2))
        assert lines(recorder.samples) == rows(1) + rows(2)


def test_resuming_on_a_full_disk_is_disk_full_and_keeps_the_records(tmp_path) -> None:
    with small_disk(tmp_path / "disk", 1 << 20) as disk:
        recorder = JsonlRecorder(disk.path)
        for step in (1, 2):
            recorder.on_step({"step": step, "reward": 0.1 * step})
        disk.fill()
        with pytest.raises(GRPOError) as raised:
            recorder.truncate_after(1)  # rewritten beside the file, then renamed over it
        assert raised.value.code == "disk_full" and str(recorder.metrics) in raised.value.message
        assert [r["step"] for r in lines(recorder.metrics)] == [1, 2]
        assert sorted(p.name for p in disk.path.iterdir()) == [".filler", "metrics.jsonl"]  # no temp file
