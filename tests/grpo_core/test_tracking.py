"""``report_to``: each tracker, through its own client library, gets every step's numbers under
the API's metric names, read back from what it wrote: TensorBoard event files, a W&B offline run,
an MLflow store. A tracker whose library is missing is a spec error naming the extra. A real full
disk under a tracker's files is ``disk_full`` naming them, and what the tracker kept stays readable."""

from __future__ import annotations

import json
import struct
import sys

import pytest
from full_disk import small_disk
from tensorboard_events import read_scalars

from grpo_core.errors import GRPOError, SpecError
from grpo_core.run.tracking import trackers
from grpo_core.spec.run_spec import RunSpec

RECORDS = [{"step": step, "reward": 0.25 * step, "rewards/contains/mean": 0.1 * step, "kl": float("nan"),
            "clip_ratio/region_mean": 0.0} for step in (1, 2, 3)]
RECORDS[1] |= {"eval_reward": 0.5, "eval_pass@k": 0.75}  # an eval point, under TRL's eval/ names


def spec(*report_to: str) -> RunSpec:
    return RunSpec.model_validate({"name": "tracked", "model": {"source": "path:tiny"},
                                   "dataset": {"prompts": [{"prompt": "a"}]},
                                   "rewards": [{"name": "contains", "args": {"text": "y"}}],
                                   "report_to": list(report_to)})


def run(callbacks) -> None:
    for record in RECORDS:
        for callback in callbacks:
            callback.on_step(record)
    for callback in callbacks:
        callback.on_event("finished", "finished at step 3", {"step": 3})


@pytest.fixture
def offline_trackers(monkeypatch):
    """W&B offline and MLflow on its local store whatever this machine's environment says; the
    ``mlflow`` module."""
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    return mlflow


def test_tensorboard_gets_every_finite_number_of_every_step(tmp_path) -> None:
    run(trackers(spec("tensorboard"), tmp_path))
    scalars = read_scalars(tmp_path / "tensorboard")
    assert scalars["reward"] == {1: 0.25, 2: 0.5, 3: 0.75}
    assert scalars["rewards/contains/mean"] == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})
    assert "kl" not in scalars and "step" not in scalars  # a NaN is no point on a chart
    assert (scalars["eval/reward"], scalars["eval/pass_at_k"]) == ({2: 0.5}, {2: 0.75})


@pytest.mark.slow
def test_wandb_offline_and_mlflow_local_runs_hold_the_same_metrics(tmp_path, offline_trackers) -> None:
    mlflow = offline_trackers
    run(trackers(spec("wandb", "mlflow"), tmp_path, run_id="job-7"))

    [run_file] = (tmp_path / "wandb").rglob("offline-run-*/run-job-7.wandb")  # offline: no key here
    assert wandb_history(run_file) == {1: {"reward": 0.25, "rewards/contains/mean": 0.1,
                                           "clip_ratio/region_mean": 0.0},
                                       2: {"reward": 0.5, "rewards/contains/mean": 0.2,
                                           "clip_ratio/region_mean": 0.0, "eval/reward": 0.5,
                                           "eval/pass_at_k": 0.75},
                                       3: {"reward": 0.75, "rewards/contains/mean": pytest.approx(0.3),
                                           "clip_ratio/region_mean": 0.0}}
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    # The core's default experiment; the service's worker passes its own name (worker/training.py).
    [found] = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    assert found.info.run_name == "tracked" and found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "rewards/contains/mean")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert client.get_metric_history(found.info.run_id, "kl") == []
    [pass_at_k] = client.get_metric_history(found.info.run_id, "eval/pass_at_k")
    assert (pass_at_k.step, pass_at_k.value) == (2, 0.75)


def wandb_records(path):
    """The records of a W&B run file (W&B 0.31 ships no reader): a 7-byte header, then LevelDB's
    log format, 32 KiB blocks of (CRC, length, kind, data) chunks; kind 1 is a whole record, 2-4
    its first, middle and last chunks."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, chunks = 7, []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        chunks.append(data[position + 7: position + 7 + length])
        position += 7 + length
        if kind in (1, 4):
            yield b"".join(chunks)
            chunks = []


def wandb_history(path) -> dict[int, dict[str, float]]:
    """The ``history`` rows of a W&B run file, by step, parsed with W&B's own protobufs."""
    from wandb.proto import wandb_internal_pb2

    rows: dict[int, dict[str, float]] = {}
    for data in wandb_records(path):
        record = wandb_internal_pb2.Record.FromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                     for item in record.history.item}
            step = int(items.pop("_step"))
            rows[step] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


def test_a_tracker_without_its_library_is_a_spec_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(SpecError, match=r"report_to: wandb needs its client library .*grpo-service\[wandb\]"):
        trackers(spec("wandb"), tmp_path)


# ==== A real full disk under each tracker (tests/full_disk.py: a small tmpfs, filled) ====

def disk_full_naming(raised: pytest.ExceptionInfo, path, disk) -> None:
    assert raised.value.code == "disk_full", raised.value
    assert f"{path} ({disk.free_bytes} bytes free)" in raised.value.message


def test_a_full_disk_under_tensorboard_is_disk_full_and_leaves_no_torn_record(tmp_path) -> None:
    with small_disk(tmp_path / "disk", 1 << 20) as disk:
        [tracker] = trackers(spec("tensorboard"), disk.path)
        tracker.on_step(RECORDS[0])
        disk.fill()
        wide = {**RECORDS[1], **{f"wide/{n}": float(n) for n in range(300)}}  # more than a page of events
        with pytest.raises(GRPOError) as raised:
            tracker.on_step(wide)
        [events] = (disk.path / "tensorboard").iterdir()
        disk_full_naming(raised, events, disk)
        assert read_scalars(disk.path / "tensorboard")["reward"] == {1: 0.25}  # step 1 whole, step 2 gone
        disk.free()
        tracker.on_step(RECORDS[2])  # a torn record before it would hide this step from readers
        assert read_scalars(disk.path / "tensorboard")["reward"] == {1: 0.25, 3: 0.75}


@pytest.mark.slow
def test_a_full_disk_under_mlflow_and_wandb_is_disk_full(tmp_path, offline_trackers) -> None:
    mlflow = offline_trackers
    with small_disk(tmp_path / "disk", 8 << 20) as disk:
        wandb_tracker, mlflow_tracker = trackers(spec("wandb", "mlflow"), disk.path, run_id="job-8")
        for tracker in (wandb_tracker, mlflow_tracker):
            tracker.on_step(RECORDS[0])
        disk.fill()
        with pytest.raises(GRPOError) as raised:
            mlflow_tracker.on_step(RECORDS[1])  # SQLite: "database or disk is full"
        disk_full_naming(raised, disk.path / "mlruns", disk)
        # W&B's service process drops what does not fit without telling its client.
        with pytest.raises(GRPOError) as raised:
            wandb_tracker.on_step(RECORDS[1])
        disk_full_naming(raised, disk.path / "wandb", disk)
        disk.free()
        for tracker in (wandb_tracker, mlflow_tracker):  # the run goes on once there is room
            tracker.on_step(RECORDS[2])
            tracker.on_event("finished", "finished at step 3", {"step": 3})
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{disk.path / 'mlruns' / 'mlflow.db'}")
        history = client.get_metric_history(mlflow_tracker.run_id, "reward")
        assert [(m.step, m.value) for m in history] == [(1, 0.25), (3, 0.75)]  # no part of step 2
