"""Reading a run's JSONL records and comparing two runs' records, for the multi-rank tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from same_records import assert_same_record


def records(out: Path, name: str) -> list[dict]:
    """``out/{name}.jsonl`` (metrics, samples or events), one dict per line."""
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]


def assert_same_samples(one: Path, other: Path) -> None:
    """The same completions, and sample rows (rewards, advantages) within 1e-5."""
    samples_one, samples_other = records(one, "samples"), records(other, "samples")
    assert [s["completion"] for s in samples_one] == [s["completion"] for s in samples_other]
    for i, (a, b) in enumerate(zip(samples_one, samples_other, strict=True)):
        assert_same_record(a, b, f"sample {i}")


def assert_same_run(one: Path, other: Path, step: int = 3) -> None:
    """Same metrics at every step and parameters within 1e-5 after ``step``."""
    metrics_one, metrics_other = records(one, "metrics"), records(other, "metrics")
    assert [m["step"] for m in metrics_other] == list(range(1, step + 1))
    for a, b in zip(metrics_one, metrics_other, strict=False):
        assert_same_record(a, b, f"step {a['step']}")
    weights_one = load_file(one / "checkpoints" / f"step-{step}" / "model.safetensors")
    weights_other = load_file(other / "checkpoints" / f"step-{step}" / "model.safetensors")
    assert weights_one.keys() == weights_other.keys()
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_other[name], tensor, rtol=0, atol=1e-5,
                                   msg=lambda detail, name=name: f"{name}: {detail}")
