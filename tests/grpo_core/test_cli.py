"""``grpo train`` end to end, as a user runs it: a subprocess on a YAML spec. Where a test has
already run one and checks more of what ``main`` does, ``main`` runs in this process (it returns
the exit status), since each subprocess spends seconds importing torch before it starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from core_specs import spec_dict

from grpo_core.cli import main

GRPO = [sys.executable, "-m", "grpo_core.cli"]


def grpo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GRPO, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_train_writes_metrics_samples_and_checkpoints_then_resumes(tiny_model_dir, tmp_path):
    data = spec_dict(tiny_model_dir, max_steps=4)
    data["checkpoint_every"] = 2
    spec = write_spec(tmp_path / "job.yaml", data)
    out = tmp_path / "run"
    done = grpo("train", str(spec), "--output-dir", str(out), "--max-steps", "2", "--quiet")
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert (out / "checkpoints" / "step-2" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "step-2" / "tokenizer.json").is_file()
    assert json.loads((out / "samples.jsonl").read_text().splitlines()[0])["completion"] is not None

    assert main(["train", str(spec), "--output-dir", str(out), "--resume", "--quiet"]) == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2", "step-4"]


def test_max_steps_override_is_the_length_the_lr_schedule_decays_over(tiny_model_dir, tmp_path):
    """In-process: ``--max-steps`` changes the spec itself, so the schedule reads the same value."""
    linear = spec_dict(tiny_model_dir, max_steps=4, lr_scheduler_type="linear")
    spec = write_spec(tmp_path / "job.yaml", linear)
    out = tmp_path / "run"
    assert main(["train", str(spec), "--output-dir", str(out), "--max-steps", "2", "--quiet"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    base = spec_dict(tiny_model_dir)["grpo"]["learning_rate"]
    assert [r["learning_rate"] for r in records] == pytest.approx([base, base / 2])


def test_resume_with_a_longer_max_steps_follows_the_longer_schedule(tiny_model_dir, tmp_path):
    """3 steps, then ``--resume --max-steps 6``: steps 4-6 train at the rates of an uninterrupted
    6-step linear decay, the first resumed one included (the 3-step schedule had reached 0)."""
    spec = write_spec(tmp_path / "job.yaml", spec_dict(tiny_model_dir, lr_scheduler_type="linear"))
    split, whole = tmp_path / "split", tmp_path / "whole"
    done = grpo("train", str(spec), "--output-dir", str(split), "--max-steps", "3", "--quiet")
    assert done.returncode == 0, done.stderr
    resumed = ["train", str(spec), "--output-dir", str(split), "--resume", "--max-steps", "6", "--quiet"]
    assert main(resumed) == 0
    assert main(["train", str(spec), "--output-dir", str(whole), "--max-steps", "6", "--quiet"]) == 0

    def rates(out: Path) -> dict[int, float]:
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["learning_rate"] for r in records}

    base = spec_dict(tiny_model_dir)["grpo"]["learning_rate"]
    assert rates(whole) == pytest.approx({s: base * (7 - s) / 6 for s in range(1, 7)})
    assert rates(split) == {**{s: pytest.approx(base * (4 - s) / 3) for s in (1, 2, 3)},
                            **{s: rates(whole)[s] for s in (4, 5, 6)}}


def test_relative_model_path_is_relative_to_the_spec_file(tiny_model_dir, tmp_path, monkeypatch):
    """In-process, from another working directory: where the path resolves is ``main``'s doing."""
    link = tmp_path / "models" / "tiny"
    link.parent.mkdir()
    link.symlink_to(tiny_model_dir)
    spec = write_spec(
        tmp_path / "job.yaml", {**spec_dict(tiny_model_dir), "model": {"source": "path:models/tiny"}}
    )
    monkeypatch.chdir("/")
    out = tmp_path / "run"
    assert main(["train", str(spec), "--output-dir", str(out), "--max-steps", "1", "--quiet"]) == 0
    assert (out / "metrics.jsonl").read_text().count("\n") == 1


def test_bad_spec_exits_2_with_one_message_per_field_and_writes_nothing(tiny_model_dir, tmp_path):
    data = spec_dict(tiny_model_dir, num_generations=1, temperature=-1)
    data["surprise"] = True
    spec = write_spec(tmp_path / "bad.yaml", data)
    out = tmp_path / "never"
    done = grpo("train", str(spec), "--output-dir", str(out))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert any(line.startswith("error: grpo.num_generations:") for line in lines)
    assert any(line.startswith("error: grpo.temperature:") for line in lines)
    assert any(line.startswith("error: surprise:") for line in lines)
    assert not out.exists()


def test_errors_found_before_training_exit_2_and_write_nothing(tiny_model_dir, tmp_path, capsys):
    """The first case as a user runs it (a process's exit status); the others through the same
    ``main`` in this process, which returns that status (each subprocess costs seconds of imports)."""
    def in_process(*args: str) -> subprocess.CompletedProcess:
        code = main(list(args))
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    cases = {
        "unknown reward": ({"rewards": [{"name": "nope"}]}, "rewards.0.name"),
        "missing model": ({"model": {"source": "path:/does/not/exist"}}, "model.source"),
        "empty dataset": ({"dataset": {"prompts": []}}, "dataset"),
        "bad reward args": (
            {"rewards": [{"name": "length_target", "args": {"target": -3}}]},
            "rewards.0.args.target",
        ),
        "missing column": (
            {"rewards": [{"name": "numeric_match", "args": {"field": "solution"}}]},
            "rewards.0.args",
        ),
    }
    for index, (name, (override, field)) in enumerate(cases.items()):
        spec = write_spec(tmp_path / "bad.yaml", {**spec_dict(tiny_model_dir), **override})
        out = tmp_path / "never"
        done = (grpo if index == 0 else in_process)("train", str(spec), "--output-dir", str(out))
        assert done.returncode == 2, (name, done.stderr)
        assert f"error: {field}" in done.stderr, (name, done.stderr)
        assert not out.exists(), name


def test_model_folder_without_a_causal_lm_is_a_clear_error(tmp_path, tiny_model_dir, capsys):
    """In-process: ``main`` returns the exit status the process would end with."""
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    spec = write_spec(
        tmp_path / "job.yaml", {**spec_dict(tiny_model_dir), "model": {"source": f"path:{folder}"}}
    )
    assert main(["train", str(spec), "--output-dir", str(tmp_path / "never")]) == 2
    assert "error: model.source" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_spec_files_refuse_yaml_aliases_and_name_the_problem(tmp_path):
    """Aliases can expand exponentially once the data is copied; a spec never needs them."""
    from grpo_core.spec.spec_file import InvalidSpec, load_spec_file, load_yaml

    assert load_yaml("a: [1, 2]\nb: {c: d}\n") == {"a": [1, 2], "b": {"c": "d"}}
    spec = tmp_path / "aliased.yaml"
    spec.write_text("lol: &a [x, x]\nlol2: [*a, *a]\n")
    with pytest.raises(InvalidSpec) as aliased:
        load_spec_file(spec)
    assert aliased.value.errors[0].field == "spec" and "aliases" in aliased.value.errors[0].reason
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("name: !!python/object/apply:os.system ['true']\n")  # never executed
    with pytest.raises(InvalidSpec) as tagged:
        load_spec_file(unsafe)
    assert "not valid YAML" in tagged.value.errors[0].reason


@pytest.mark.slow
def test_nproc_per_node_trains_on_ranks_and_a_rank_failure_exits_1(tiny_model_dir, tmp_path, capsys):
    data = spec_dict(tiny_model_dir, max_steps=2, num_iterations=2)
    spec = write_spec(tmp_path / "job.yaml", data)
    out = tmp_path / "run"
    args = ["train", str(spec), "--output-dir", str(out), "--quiet", "--device", "cpu"]
    done = grpo(*args, "--nproc-per-node", "2", "--max-steps", "1")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    # Its checkpoint without the optimizer state: every rank refuses to resume from it. Launched
    # from this process through main (its return value is the exit status): a launcher process
    # fewer to import torch, the ranks as real as above.
    (out / "checkpoints" / "step-1" / "optimizer.pt").unlink()
    capsys.readouterr()
    assert main([*args, "--nproc-per-node", "2", "--resume"]) == 1
    stderr = capsys.readouterr().err
    # Every rank refuses; which one the launcher reports first is a race.
    assert re.search(r"rank [01] failed", stderr) and "has no optimizer state" in stderr


def test_nproc_per_node_that_splits_groups_is_refused_before_anything_runs(tiny_model_dir, tmp_path, capsys):
    spec = write_spec(tmp_path / "job.yaml", spec_dict(tiny_model_dir, prompts_per_step=3))
    done = grpo("train", str(spec), "--output-dir", str(tmp_path / "run"), "--nproc-per-node", "2")
    assert done.returncode == 2
    assert "grpo.prompts_per_step" in done.stderr
    assert not (tmp_path / "run").exists()
    # The same check in-process: a second subprocess costs seconds of imports.
    assert main(["train", str(spec), "--output-dir", str(tmp_path / "run"), "--nproc-per-node", "0"]) == 2
    assert "--nproc-per-node" in capsys.readouterr().err


def test_train_with_gradient_checkpointing_prints_no_deprecation_warning(tiny_model_dir, tmp_path):
    """A subprocess: pytest's own warning filters do not reach it, so stderr is what a user sees."""
    spec = write_spec(tmp_path / "job.yaml", spec_dict(tiny_model_dir, gradient_checkpointing=True))
    done = grpo("train", str(spec), "--output-dir", str(tmp_path / "run"), "--max-steps", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "checkpointing_enable" not in done.stderr, done.stderr
