"""Experiment tracking, as TRL users know it: ``report_to: [tensorboard, wandb, mlflow]`` in the
spec sends every step's metrics, under the same names as the API's ``/metrics``, to each.

* ``tensorboard``: event files in ``<run folder>/tensorboard`` (written with ``tensorboardX``,
  which needs neither TensorFlow nor the TensorBoard server); the service serves them for download.
* ``wandb``: a Weights & Biases run through its own client (the ``[wandb]`` extra),
  offline into ``<run folder>/wandb`` unless the process has ``WANDB_API_KEY`` (and no
  ``WANDB_MODE``): a worker never blocks on a login prompt.
* ``mlflow``: an MLflow run through its own client (``[mlflow]``), to ``MLFLOW_TRACKING_URI``
  when the process has one, else a local SQLite store, ``<run folder>/mlruns/mlflow.db``.

Credentials and servers are the deployment's (the worker's environment), never a spec's: a spec
names where to report, not an address to call. Runs go to the W&B project and MLflow experiment
the environment names (``WANDB_PROJECT``, ``MLFLOW_EXPERIMENT_NAME``), else to ``project``: "grpo"
by default, the service's name when its worker builds them. Only numbers are sent; a step's NaN (a statistic
over nothing) is left out rather than charted as a gap of zeros. Eval metrics go under TRL's
``eval/`` names (``eval_reward`` is ``eval/reward``, as transformers' tracker callbacks rewrite
TRL's ``eval_`` keys), and ``eval_pass@k`` is ``eval/pass_at_k``: MLflow refuses ``@`` in a name
and TensorBoard would turn it into ``_``.

A full disk under a tracker's files ends the run as ``disk_full`` naming them, as it does under a
checkpoint: the run resumes from its checkpoint once there is room. MLflow's SQLite store rolls
its own transaction back. W&B writes from a service process of its own, which drops what does not
fit without telling its client, so after each call the W&B folder's disk is checked for a byte
left.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from grpo_core.errors import SpecError
from grpo_core.install_hints import install_hint
from grpo_core.io.disk_space import appended_whole, check_free_space, disk_full_reported
from grpo_core.run.callbacks import TrainerCallback
from grpo_core.spec.run_spec import RunSpec

TRACKERS = ("tensorboard", "wandb", "mlflow")
# W&B's project and MLflow's experiment when neither the caller nor the environment names one.
DEFAULT_PROJECT = "grpo"
_ENDINGS = ("finished", "stopped")
_WANDB_FILES = "W&B run files"


_EVAL_PREFIX = "eval_"


def tracker_name(name: str) -> str:
    """A metric's name in a tracker: the API's, but an eval metric's ``eval_`` is ``eval/`` and
    ``@`` is spelt out, the one character of a metric name some tracker refuses."""
    name = name.replace("@", "_at_")
    return "eval/" + name.removeprefix(_EVAL_PREFIX) if name.startswith(_EVAL_PREFIX) else name


def scalars(record: dict[str, Any]) -> dict[str, float]:
    return {tracker_name(name): float(value) for name, value in record.items()
            if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value)}


class TensorBoardTracker(TrainerCallback):
    """Writes the event file itself, synchronously (tensorboardX's ``SummaryWriter`` queues
    events to a thread whose ``flush`` does not wait): each step is on disk when ``on_step``
    returns, so a download or a killed process never misses the steps already reported. A step
    is appended whole or not at all: one cut short by a full disk is cut off the file again,
    since TensorBoard's reader stops at a torn record and would hide every step after it."""

    def __init__(self, folder: Path) -> None:
        from tensorboardX.proto.event_pb2 import Event

        # The name TensorBoard looks for; the pid keeps two attempts in one second apart.
        self.path = folder / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        with disk_full_reported(self.path, "TensorBoard events"):
            folder.mkdir(parents=True, exist_ok=True)
        self._append([Event(wall_time=time.time(), file_version="brain.Event:2")])

    def on_step(self, record: dict[str, Any]) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        step, now = int(record["step"]), time.time()
        self._append([Event(wall_time=now, step=step, summary=scalar(name, value))
                      for name, value in scalars(record).items()])

    def _append(self, events: list[Any]) -> None:
        data = b"".join(_tf_record(event.SerializeToString()) for event in events)
        with appended_whole(self.path, "TensorBoard events"):
            with self.path.open("ab") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())


def _tf_record(data: bytes) -> bytes:
    """TFRecord framing: length, its masked CRC-32C, the data, its masked CRC-32C."""
    from tensorboardX.record_writer import masked_crc32c

    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


class WandbTracker(TrainerCallback):
    def __init__(self, folder: Path, spec: RunSpec, run_id: str | None, project: str) -> None:
        import wandb

        self.folder = folder
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        with self._writing():
            folder.mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", project), name=spec.name,
                                  id=run_id, resume="allow", dir=str(folder), mode=mode,
                                  config=spec.model_dump(mode="json", exclude={"dataset"}))

    @contextmanager
    def _writing(self) -> Iterator[None]:
        with disk_full_reported(self.folder, _WANDB_FILES):
            yield
        # W&B's service process drops what does not fit without telling this client: a disk
        # with no byte left is where it did (or will, with the next record).
        check_free_space(self.folder, _WANDB_FILES)

    def on_step(self, record: dict[str, Any]) -> None:
        with self._writing():
            self.run.log(scalars(record), step=int(record["step"]))

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        if type in _ENDINGS:
            with self._writing():
                self.run.finish()


class MlflowTracker(TrainerCallback):
    def __init__(self, folder: Path, spec: RunSpec, project: str) -> None:
        import mlflow

        self.folder = folder
        # MLflow's own advice: a SQLite store, not the file store it now refuses by default.
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder.resolve() / 'mlflow.db'}"
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", project)
        with self._writing():
            folder.mkdir(parents=True, exist_ok=True)
            self.client = mlflow.MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            self.run_id = self.client.create_run(experiment_id, run_name=spec.name).info.run_id

    def _writing(self) -> AbstractContextManager[None]:
        return disk_full_reported(self.folder, "the MLflow store")

    def on_step(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(record["step"]), _millis()
        metrics = [Metric(name, value, now, step) for name, value in scalars(record).items()]
        with self._writing():
            self.client.log_batch(self.run_id, metrics=metrics)

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        if type in _ENDINGS:
            with self._writing():
                self.client.set_terminated(self.run_id)


def _millis() -> int:
    return int(time.time() * 1000)


def trackers(spec: RunSpec, folder: Path, run_id: str | None = None,
             project: str = DEFAULT_PROJECT) -> list[TrainerCallback]:
    """One callback per ``spec.report_to`` entry, writing under ``folder`` (the run's or job's),
    W&B and MLflow runs under ``project`` unless the environment names one. A tracker whose
    client library is missing is a spec error naming the extra to install."""
    made: list[TrainerCallback] = []
    for name in spec.report_to:
        try:
            if name == "tensorboard":
                made.append(TensorBoardTracker(folder / "tensorboard"))
            elif name == "wandb":
                made.append(WandbTracker(folder / "wandb", spec, run_id, project))
            else:
                made.append(MlflowTracker(folder / "mlruns", spec, project))
        except ImportError as exc:
            raise SpecError("report_to", f"{name} needs its client library on the worker "
                                         f"({install_hint(name, name)}): {exc}") from exc
    return made
