"""A stop asked for while a step is generating ends the run inside that generation: the decode
loop asks should_stop every few tokens, the step is not trained (no record, no checkpoint, the
prompt sampler put back), and the run says where it stopped. The service's side (a job cancelled
inside a long generation) is tests/worker/test_stop_inside_generation_jobs.py."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from core_specs import make_spec

import grpo_core.run.trainer as trainer_module
from grpo_core.algorithm.rollout import STOP_CHECK_TOKENS
from grpo_core.parallel.distributed import Ranks
from grpo_core.run.callbacks import TrainerCallback
from grpo_core.run.components import build_components
from grpo_core.run.launch import launch_ranks
from grpo_core.run.trainer import GRPOTrainer
from grpo_core.spec.run_spec import RunSpec


class _StopInsideStepTwo(TrainerCallback):
    """Says stop at the second question after step 1's record: the first is the ask before step
    2, the second comes from inside its generation. Records what the run reports."""

    def __init__(self) -> None:
        self.asked_since_step = 0
        self.records: list[dict] = []
        self.events: list[tuple[str, str, dict]] = []

    def should_stop(self) -> bool:
        self.asked_since_step += 1
        return bool(self.records) and self.asked_since_step >= 2

    def on_step(self, record):
        self.records.append(record)
        self.asked_since_step = 0

    def on_event(self, type, message, data):  # noqa: A002
        self.events.append((type, message, data))


def test_a_stop_inside_a_generation_ends_the_run_without_training_that_step(tiny_model_dir, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(trainer_module, "STOP_POLL_SECONDS", 0.0)  # ask at every check
    completion = 900
    spec = make_spec(tiny_model_dir, max_steps=3, max_prompt_length=32, max_completion_length=completion)
    components = build_components(spec, device="cpu")
    callbacks = _StopInsideStepTwo()
    result = GRPOTrainer(components, tmp_path, callbacks).train()

    assert result.stopped and result.step == 1
    assert [r["step"] for r in callbacks.records] == [1]
    stopped = [(message, data) for kind, message, data in callbacks.events if kind == "stopped"]
    [(message, data)] = stopped
    assert data["step"] == 1 and data["generation_tokens"] == STOP_CHECK_TOKENS
    assert "inside step 2's generation" in message and "not trained" in message
    # Step 2's prompts were put back: the checkpoint resumes where an uninterrupted run would.
    assert components.sampler.draws_taken == spec.grpo.prompts_per_round
    assert result.checkpoint is not None and result.checkpoint.name == "step-1"


def _train_stopping_inside_step_two(ranks: Ranks, spec: RunSpec, folder: str) -> tuple[bool, int, list]:
    """A rank of the launch below: rank 0 hears the stop (as the service's rank 0 reads the job's
    stop request), the other rank only through the launch's stop flag."""
    trainer_module.STOP_POLL_SECONDS = 0.0  # ask at every check (this is a fresh interpreter)
    callbacks = _StopInsideStepTwo() if ranks.is_main else TrainerCallback()
    components = build_components(spec, device="cpu", ranks=ranks)
    result = GRPOTrainer(components, Path(folder) / "checkpoints", callbacks).train()
    events = callbacks.events if ranks.is_main else []
    return result.stopped, result.step, [(kind, data) for kind, _, data in events]


def test_a_stop_inside_a_generation_ends_every_rank_of_a_data_parallel_run(tiny_model_dir, tmp_path):
    # Each rank decodes its own rows, so they cannot agree on a stop with a collective per ask:
    # rank 0 raises the launch's stop flag, the other rank reads it inside its own loop, and both
    # end the run at step 1 together (a rank that missed the flag would hang the other in the
    # checkpoint's collectives, or train step 2 alone).
    spec = make_spec(tiny_model_dir, max_steps=3, prompts_per_step=4, max_prompt_length=32,
                     max_completion_length=900)
    results = launch_ranks(_train_stopping_inside_step_two, (spec, str(tmp_path)), 2, device="cpu",
                           hang_timeout=timedelta(seconds=120))
    assert [(stopped, step) for stopped, step, _ in results] == [(True, 1), (True, 1)]
    events = results[0][2]
    [stopped] = [data for kind, data in events if kind == "stopped"]
    assert stopped["step"] == 1 and stopped["generation_tokens"] == STOP_CHECK_TOKENS
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]


def test_ranks_whose_launch_store_cannot_be_reached_train_on_without_the_flag(monkeypatch, caplog):
    # The flag only speeds a stop up: a store that does not answer must not fail the run.
    import socket

    import grpo_core.parallel.stop_flag as stop_flag_module

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(stop_flag_module, "_CONNECT_TIMEOUT", timedelta(seconds=1))
    launch = {"TORCHELASTIC_RUN_ID": "r", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    assert stop_flag_module.stop_flag(Ranks(rank=1, world_size=2)) is None
    assert "no stop flag" in caplog.text
