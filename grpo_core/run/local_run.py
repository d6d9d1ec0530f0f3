"""``grpo train``: run a RunSpec on this machine, writing JSONL records and checkpoints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grpo_core.io.disk_space import appended_whole, disk_full_reported
from grpo_core.parallel.distributed import SINGLE, Ranks
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.run.callbacks import CallbackList, TrainerCallback
from grpo_core.run.components import build_components
from grpo_core.run.tracking import trackers
from grpo_core.run.trainer import GRPOTrainer, TrainResult
from grpo_core.spec.run_spec import RunSpec


class JsonlRecorder(TrainerCallback):
    """Appends metrics, samples and events to ``DIR/*.jsonl``, one JSON object per line. A write
    that fails (a full disk: ``disk_full``) leaves the file as it was, never half a line, so
    ``--resume`` can read it back and carry on once there is room."""

    def __init__(self, output_dir: Path) -> None:
        self.metrics = output_dir / "metrics.jsonl"
        self.samples = output_dir / "samples.jsonl"
        self.events = output_dir / "events.jsonl"

    def truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint: they will be produced again."""
        for path in (self.metrics, self.samples):
            if path.exists():
                kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
                _replace(path, "".join(line + "\n" for line in kept))

    def _append(self, path: Path, objs: list[dict[str, Any]]) -> None:
        with appended_whole(path, "run records"):
            with path.open("a") as handle:
                handle.write("".join(json.dumps(obj) + "\n" for obj in objs))

    def on_step(self, record: dict[str, Any]) -> None:
        self._append(self.metrics, [record])

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self._append(self.samples, rows)

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        self._append(self.events, [{"type": type, "message": message, "data": data}])


def _replace(path: Path, text: str) -> None:
    """``path`` holding ``text``, or as it was: written beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with disk_full_reported(path, "run records", undo=lambda: tmp.unlink(missing_ok=True)):
        tmp.write_text(text)
        os.replace(tmp, path)


class ProgressBar(TrainerCallback):
    def __init__(self, total: int, initial: int = 0) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def on_step(self, record: dict[str, Any]) -> None:
        shown = {
            k: record.get(k) for k in ("reward", "kl", "clip_ratio/region_mean") if record.get(k) is not None
        }
        self.bar.set_postfix({k.split("/")[0]: f"{v:.3f}" for k, v in shown.items()}, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run_local(
    spec: RunSpec,
    spec_dir: Path,
    output_dir: Path,
    resume: bool = False,
    device: str | None = None,
    progress: bool = True,
    ranks: Ranks = SINGLE,
    verifiers: dict[str, VerifierEndpoint] | None = None,
) -> TrainResult:
    """Build (validating everything) before creating ``output_dir``, so a bad spec writes nothing.
    One of several data-parallel ``ranks`` writes only if it is rank 0."""
    components = build_components(spec, base_dir=spec_dir, device=device, ranks=ranks, verifiers=verifiers)
    callbacks = CallbackList()
    recorder = None
    if ranks.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        recorder = JsonlRecorder(output_dir)
        callbacks.callbacks += [recorder, *trackers(spec, output_dir)]
    trainer = GRPOTrainer(components, output_dir / "checkpoints", callbacks)
    if resume and trainer.resume():
        if recorder is not None:
            recorder.truncate_after(trainer.state.step)
    elif not resume and recorder is not None:
        for path in (recorder.metrics, recorder.samples, recorder.events):
            path.unlink(missing_ok=True)
    bar = ProgressBar(trainer.max_steps, trainer.state.step) if progress and ranks.is_main else None
    if bar is not None:
        callbacks.callbacks.append(bar)
    try:
        return trainer.train()
    finally:
        if bar is not None:
            bar.close()
