"""Checkpoints and the disk, through the real trainer (``run_local``): a failing or full disk
leaves no temporary folder and earlier checkpoints intact, and is reported as ``disk_full``;
retention (``checkpoint_keep_last``) bounds what a run keeps; a resume sweeps the temporary folders
of writers that died; a callback may refuse a checkpoint (a quota) before it is written."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from core_specs import spec_dict
from pydantic import ValidationError

from grpo_core.errors import GRPOError
from grpo_core.io.disk_space import disk_full_error
from grpo_core.io.paths import folder_bytes
from grpo_core.run.callbacks import TrainerCallback
from grpo_core.run.checkpoint import prune_checkpoints
from grpo_core.run.components import build_components
from grpo_core.run.local_run import run_local
from grpo_core.run.trainer import GRPOTrainer
from grpo_core.spec.run_spec import RunSpec

real_save = torch.save


def spec(model_dir: Path, max_steps: int, **top) -> RunSpec:
    return RunSpec.model_validate({**spec_dict(model_dir, max_steps=max_steps), "checkpoint_every": 1, **top})


def fail_writes_into(step: int, error: BaseException):
    """A ``torch.save`` that writes part of the file, then fails, for files of ``step``'s
    checkpoint: what a disk filling up mid-write does."""

    def save(obj, f, *args, **kwargs):
        if f".step-{step}.tmp-" in str(f):
            Path(f).write_bytes(b"partial")
            raise error
        return real_save(obj, f, *args, **kwargs)

    return save


def step_folders(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def test_a_full_disk_fails_as_disk_full_leaves_no_temp_folder_and_keeps_earlier_checkpoints(
    tiny_model_dir, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    full = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(torch, "save", fail_writes_into(2, full))
    with pytest.raises(GRPOError) as raised:
        run_local(spec(tiny_model_dir, 3), tmp_path, out, device="cpu", progress=False)
    assert raised.value.code == "disk_full"
    assert str(out / "checkpoints" / ".step-2.tmp-") in raised.value.message
    assert "bytes free" in raised.value.message
    assert step_folders(out) == ["step-1"]
    # The checkpoint before the full disk is whole: the run resumes from it once there is room.
    monkeypatch.setattr(torch, "save", real_save)
    result = run_local(spec(tiny_model_dir, 3), tmp_path, out, resume=True, device="cpu", progress=False)
    assert result.step == 3
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert {"type": "resumed", "step": 1} in [
        {"type": e["type"], "step": e["data"].get("step")} for e in events
    ]
    assert step_folders(out) == ["step-1", "step-2", "step-3"]


def test_any_other_write_failure_also_removes_the_temp_folder_and_is_raised_as_it_was(
    tiny_model_dir, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    monkeypatch.setattr(torch, "save", fail_writes_into(1, PermissionError(errno.EACCES, "denied")))
    with pytest.raises(PermissionError):
        run_local(spec(tiny_model_dir, 1), tmp_path, out, device="cpu", progress=False)
    assert step_folders(out) == []


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file"),
        RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1024 vs 998"),
    ],
)
def test_what_a_full_disk_raises_is_recognised(error, tmp_path):
    found = disk_full_error(error, tmp_path / ".step-3.tmp-1" / "optimizer.pt")
    assert found is not None and found.code == "disk_full"
    assert f"{tmp_path / '.step-3.tmp-1' / 'optimizer.pt'}" in found.message and "bytes free" in found.message


@pytest.mark.parametrize(
    "error", [OSError(errno.EACCES, "denied"), RuntimeError("size mismatch"), ValueError()]
)
def test_other_errors_are_not_taken_for_a_full_disk(error, tmp_path):
    assert disk_full_error(error, tmp_path) is None


def test_retention_keeps_the_newest_checkpoints_with_the_optimizer_only_in_the_newest(
    tiny_model_dir, tmp_path
):
    out = tmp_path / "run"
    run_local(spec(tiny_model_dir, 5, checkpoint_keep_last=2), tmp_path, out, device="cpu", progress=False)
    assert step_folders(out) == ["step-4", "step-5"]
    checkpoints = out / "checkpoints"
    assert (checkpoints / "step-5" / "optimizer.pt").is_file()
    assert not (checkpoints / "step-4" / "optimizer.pt").exists()
    assert (checkpoints / "step-4" / "trainer_state.json").is_file()  # still a usable model folder
    # --resume takes the newest, which has everything; a longer run continues from it.
    longer = spec(tiny_model_dir, 6, checkpoint_keep_last=2)
    result = run_local(longer, tmp_path, out, resume=True, device="cpu", progress=False)
    assert result.step == 6
    assert step_folders(out) == ["step-5", "step-6"]
    assert not (checkpoints / "step-5" / "optimizer.pt").exists()


def test_an_older_checkpoint_without_its_optimizer_state_is_refused_by_name(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    run_local(spec(tiny_model_dir, 2, checkpoint_keep_last=2), tmp_path, out, device="cpu", progress=False)
    components = build_components(spec(tiny_model_dir, 3), device="cpu")
    trainer = GRPOTrainer(components, out / "checkpoints")
    with pytest.raises(GRPOError) as raised:
        trainer.resume(out / "checkpoints" / "step-1")
    assert raised.value.code == "resume_unsupported" and "optimizer" in raised.value.message


def test_keep_last_is_validated_by_field(tiny_model_dir):
    with pytest.raises(ValidationError) as raised:
        spec(tiny_model_dir, 2, checkpoint_keep_last=0)
    assert raised.value.errors()[0]["loc"] == ("checkpoint_keep_last",)
    assert spec(tiny_model_dir, 2).checkpoint_keep_last == 3


def dead_pid() -> int:
    """The pid of a process that has ended (reaped), as a writer killed mid-checkpoint leaves."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_resume_sweeps_the_temp_folders_of_dead_writers_and_leaves_live_ones(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    run_local(spec(tiny_model_dir, 1), tmp_path, out, device="cpu", progress=False)
    checkpoints = out / "checkpoints"
    stale = checkpoints / f".step-2.tmp-{dead_pid()}"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live_writer:
        try:
            live = checkpoints / f".step-2.tmp-{live_writer.pid}"
            for folder in (stale, live):
                folder.mkdir()
                (folder / "optimizer.pt").write_bytes(b"half a file")
            result = run_local(spec(tiny_model_dir, 2), tmp_path, out, resume=True, device="cpu",
                               progress=False)
            assert result.step == 2
            assert not stale.exists()
            assert live.is_dir()  # perhaps another process's write in progress: not ours to remove
        finally:
            live_writer.kill()
    assert step_folders(out) == sorted(["step-1", "step-2", live.name])


class RefuseAt(TrainerCallback):
    """Refuses the checkpoint of ``step`` as a quota would; notes every estimate it is given."""

    def __init__(self, step: int) -> None:
        self.step, self.estimates = step, {}

    def before_checkpoint(self, step: int, estimated_bytes: int) -> None:
        self.estimates[step] = estimated_bytes
        if step == self.step:
            raise GRPOError(f"no room for step {step}", code="artifact_quota_exceeded")


def test_before_checkpoint_can_refuse_a_checkpoint_before_a_byte_of_it_is_written(tiny_model_dir, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    refuse = RefuseAt(2)
    trainer = GRPOTrainer(build_components(spec(tiny_model_dir, 3), device="cpu"), checkpoints, refuse)
    with pytest.raises(GRPOError) as raised:
        trainer.train()
    assert raised.value.code == "artifact_quota_exceeded"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1"]  # no step-2, no temp folder
    # The first estimate comes from the weights and optimizer; later ones are the last checkpoint's size.
    assert refuse.estimates[1] > 0
    assert refuse.estimates[2] == folder_bytes(checkpoints / "step-1")


def test_the_checkpoint_just_written_is_kept_even_when_older_than_the_rest(tiny_model_dir, tmp_path):
    # A run resumed from an older checkpoint (steps 2 and 3 exist from before) writes step 2 again:
    # it is the run's newest state (the final one of a run that ends there), whatever keep_last says.
    out = tmp_path / "run"
    run_local(spec(tiny_model_dir, 3, checkpoint_keep_last=3), tmp_path, out, device="cpu", progress=False)
    checkpoints = out / "checkpoints"
    removed = prune_checkpoints(checkpoints, 1, checkpoints / "step-2")
    assert removed == [1]
    assert step_folders(out) == ["step-2", "step-3"]
    assert (checkpoints / "step-3" / "optimizer.pt").is_file()  # what a resume would pick


class NoteReported(TrainerCallback):
    """At each report, which earlier reported checkpoints still hold their optimizer state: what a
    process killed right after the report would leave for a resume to use."""

    def __init__(self) -> None:
        self.reported: list[Path] = []
        self.whole_at_report: list[bool] = []

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self.reported:
            self.whole_at_report.append((self.reported[-1] / "optimizer.pt").is_file())
        self.reported.append(path)


def test_older_checkpoints_keep_their_optimizer_state_until_the_new_one_is_reported(tiny_model_dir, tmp_path):
    # Retention drops optimizer.pt from all but the newest. If it ran before the new checkpoint was
    # reported, a kill in between would leave the last *reported* checkpoint (the one the service
    # resumes from) without its optimizer state, and the job could not resume.
    checkpoints = tmp_path / "checkpoints"
    noted = NoteReported()
    trainer = GRPOTrainer(build_components(spec(tiny_model_dir, 3, checkpoint_keep_last=3), device="cpu"),
                          checkpoints, noted)
    trainer.train()
    assert [p.name for p in noted.reported] == ["step-1", "step-2", "step-3"]
    assert noted.whole_at_report == [True, True]
    assert not (checkpoints / "step-2" / "optimizer.pt").exists()  # retention still ran afterwards
