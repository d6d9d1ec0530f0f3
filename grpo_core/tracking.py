"""Experiment tracking, as TRL users know it: ``report_to: [tensorboard, wandb, mlflow]`` in the
spec sends every step's metrics, under the same names as the API's ``/metrics``, to each.

* ``tensorboard``: event files in ``<run folder>/tensorboard`` (written with ``tensorboardX``,
  which needs neither TensorFlow nor the TensorBoard server); the service serves them for download.
* ``wandb``: a Weights & Biases run through its own client (``pip install 'grpo-service[wandb]'``),
  offline into ``<run folder>/wandb`` unless the process has ``WANDB_API_KEY`` (and no
  ``WANDB_MODE``): a worker never blocks on a login prompt.
* ``mlflow``: an MLflow run through its own client (``[mlflow]``), to ``MLFLOW_TRACKING_URI``
  when the process has one, else a local SQLite store, ``<run folder>/mlruns/mlflow.db``.

Credentials and servers are the deployment's (the worker's environment), never a spec's: a spec
names where to report, not an address to call. Only numbers are sent; a step's NaN (a statistic
over nothing) is left out rather than charted as a gap of zeros.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from grpo_core.callbacks import TrainerCallback
from grpo_core.errors import SpecError
from grpo_core.spec import JobSpec

TRACKERS = ("tensorboard", "wandb", "mlflow")
_ENDINGS = ("finished", "stopped")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    return {name: float(value) for name, value in record.items()
            if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value)}


class TensorBoardTracker(TrainerCallback):
    """Writes events itself, synchronously (tensorboardX's ``SummaryWriter`` queues them to a
    thread whose ``flush`` does not wait): each step is on disk when ``on_step`` returns, so a
    download or a killed process never misses the steps already reported."""

    def __init__(self, folder: Path) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        folder.mkdir(parents=True, exist_ok=True)
        self.writer = EventsWriter(str(folder / "events"))

    def on_step(self, record: dict[str, Any]) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        step, now = int(record["step"]), time.time()
        for name, value in scalars(record).items():
            self.writer.write_event(Event(wall_time=now, step=step, summary=scalar(name, value)))
        self.writer.flush()

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        if type in _ENDINGS:
            self.writer.close()


class WandbTracker(TrainerCallback):
    def __init__(self, folder: Path, spec: JobSpec, run_id: str | None) -> None:
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "grpo-service"), name=spec.name,
                              id=run_id, resume="allow", dir=str(folder), mode=mode,
                              config=spec.model_dump(mode="json", exclude={"dataset"}))

    def on_step(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=int(record["step"]))

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        if type in _ENDINGS:
            self.run.finish()


class MlflowTracker(TrainerCallback):
    def __init__(self, folder: Path, spec: JobSpec) -> None:
        import mlflow

        folder.mkdir(parents=True, exist_ok=True)
        # MLflow's own advice: a SQLite store, not the file store it now refuses by default.
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder.resolve() / 'mlflow.db'}"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "grpo-service")
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=spec.name).info.run_id

    def on_step(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(record["step"]), _millis()
        metrics = [Metric(name, value, now, step) for name, value in scalars(record).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        if type in _ENDINGS:
            self.client.set_terminated(self.run_id)


def _millis() -> int:
    return int(time.time() * 1000)


def trackers(spec: JobSpec, folder: Path, run_id: str | None = None) -> list[TrainerCallback]:
    """One callback per ``spec.report_to`` entry, writing under ``folder`` (the run's or job's).
    A tracker whose client library is missing is a spec error naming the extra to install."""
    made: list[TrainerCallback] = []
    for name in spec.report_to:
        try:
            if name == "tensorboard":
                made.append(TensorBoardTracker(folder / "tensorboard"))
            elif name == "wandb":
                made.append(WandbTracker(folder / "wandb", spec, run_id))
            else:
                made.append(MlflowTracker(folder / "mlruns", spec))
        except ImportError as exc:
            raise SpecError("report_to", f"{name} needs its client library on the worker "
                                         f"(pip install 'grpo-service[{name}]'): {exc}") from exc
    return made
