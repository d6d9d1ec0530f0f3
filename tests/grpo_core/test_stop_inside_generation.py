"""A stop asked for while a step is generating ends the run inside that generation: the decode
loop asks should_stop every few tokens, the step is not trained (no record, no checkpoint, the
prompt sampler put back), and the run says where it stopped. The service's side (a job cancelled
inside a long generation) is tests/worker/test_stop_inside_generation_jobs.py."""

from __future__ import annotations

from core_specs import make_spec

import grpo_core.run.trainer as trainer_module
from grpo_core.algorithm.rollout import STOP_CHECK_TOKENS
from grpo_core.run.callbacks import TrainerCallback
from grpo_core.run.components import build_components
from grpo_core.run.trainer import GRPOTrainer


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
