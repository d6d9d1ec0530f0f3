"""``report_to``: each tracker, through its own client library, gets every step's numbers under
the API's metric names, read back from what it wrote: TensorBoard event files, a W&B offline run,
an MLflow store. A tracker whose library is missing is a spec error naming the extra."""

from __future__ import annotations

import json
import struct
import sys

import pytest
from tensorboard_events import read_scalars

from grpo_core.errors import SpecError
from grpo_core.spec import JobSpec
from grpo_core.tracking import trackers

RECORDS = [{"step": step, "reward": 0.25 * step, "rewards/contains/mean": 0.1 * step, "kl": float("nan"),
            "clip_ratio/region_mean": 0.0} for step in (1, 2, 3)]


def spec(*report_to: str) -> JobSpec:
    return JobSpec.model_validate({"name": "tracked", "model": {"source": "path:tiny"},
                                   "dataset": {"prompts": [{"prompt": "a"}]},
                                   "rewards": [{"name": "contains", "args": {"text": "y"}}],
                                   "report_to": list(report_to)})


def run(callbacks) -> None:
    for record in RECORDS:
        for callback in callbacks:
            callback.on_step(record)
    for callback in callbacks:
        callback.on_event("finished", "finished at step 3", {"step": 3})


def test_tensorboard_gets_every_finite_number_of_every_step(tmp_path) -> None:
    run(trackers(spec("tensorboard"), tmp_path))
    scalars = read_scalars(tmp_path / "tensorboard")
    assert scalars["reward"] == {1: 0.25, 2: 0.5, 3: 0.75}
    assert scalars["rewards/contains/mean"] == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})
    assert "kl" not in scalars and "step" not in scalars  # a NaN is no point on a chart


@pytest.mark.slow
def test_wandb_offline_and_mlflow_local_runs_hold_the_same_metrics(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(trackers(spec("wandb", "mlflow"), tmp_path, run_id="job-7"))

    [run_file] = (tmp_path / "wandb").rglob("offline-run-*/run-job-7.wandb")  # offline: no key here
    assert wandb_history(run_file) == {1: {"reward": 0.25, "rewards/contains/mean": 0.1,
                                           "clip_ratio/region_mean": 0.0},
                                       2: {"reward": 0.5, "rewards/contains/mean": 0.2,
                                           "clip_ratio/region_mean": 0.0},
                                       3: {"reward": 0.75, "rewards/contains/mean": pytest.approx(0.3),
                                           "clip_ratio/region_mean": 0.0}}
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    [found] = client.search_runs([client.get_experiment_by_name("grpo-service").experiment_id])
    assert found.info.run_name == "tracked" and found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "rewards/contains/mean")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert client.get_metric_history(found.info.run_id, "kl") == []


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
