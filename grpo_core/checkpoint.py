"""Checkpoints: everything needed to continue a run exactly where it stopped.

``step-N/`` holds the weights as a Hugging Face folder (safetensors; the adapter only with
LoRA) plus the tokenizer, so it is usable on its own, and beside them the optimizer,
scheduler, RNG states, data position and, when stopped in the middle of a ``num_iterations``
cycle, the generation batch being trained on. A checkpoint is written to a temporary folder
and renamed into place, so a crash never leaves a half-written ``step-N``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file

from grpo_core.data import PromptSampler
from grpo_core.models import PolicyAndReference

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from grpo_core.experience import Experience

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class TrainerState:
    step: int
    num_tokens: int
    sampler: dict[str, int]
    iteration: int  # optimizer passes already taken over the pending experience
    has_experience: bool


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    state: TrainerState,
    *,
    models: PolicyAndReference,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    experience: Experience | None = None,
) -> Path:
    """Write ``root/step-{state.step}`` atomically and return it."""
    final = root / f"step-{state.step}"
    tmp = root / f".step-{state.step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    models.policy.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    if experience is not None:
        torch.save(experience, tmp / "experience.pt")
    # Written last: its presence marks the checkpoint complete.
    (tmp / STATE_FILE).write_text(json.dumps(state.__dict__, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    if not root.is_dir():
        return None
    complete = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return max(complete)[1] if complete else None


def load_checkpoint(
    path: Path,
    *,
    models: PolicyAndReference,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler: PromptSampler,
) -> tuple[TrainerState, Experience | None]:
    """Restore weights, optimizer, scheduler, data position and RNG in place; return the trainer
    state and the pending experience (or None)."""
    state = TrainerState(**json.loads((path / STATE_FILE).read_text()))
    _load_weights(path, models)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    sampler.load_state_dict(state.sampler)
    restore_rng_state(torch.load(path / "rng.pt", weights_only=False))
    experience = torch.load(path / "experience.pt", weights_only=False) if state.has_experience else None
    return state, experience


def _load_weights(path: Path, models: PolicyAndReference) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    if models.uses_adapters:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(models.policy, tensors)
        return
    missing, unexpected = models.policy.load_state_dict(tensors, strict=False)
    tied = set(getattr(models.policy, "_tied_weights_keys", None) or [])
    if unexpected or [k for k in missing if k not in tied]:
        raise RuntimeError(
            f"checkpoint {path} does not match the model: missing={missing} unexpected={unexpected}"
        )
