"""Where a run's tensors live and at which precision its forward passes run.

One value handed to every function that runs the model, so each signature shows that it does;
multi-rank training adds a rank's device here, not to every signature.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from grpo_core.parallel.distributed import SINGLE, Ranks


@dataclass(frozen=True)
class Placement:
    device: torch.device
    autocast_dtype: torch.dtype | None = None  # None: forwards run in the weights' own dtype
    ranks: Ranks = SINGLE  # the data-parallel ranks this process is one of

    def autocast(self) -> AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def place(requested: str | None, weights_dtype: str, ranks: Ranks = SINGLE) -> Placement:
    """``requested`` device (default: CUDA when present). fp32 weights on CUDA run under bf16
    autocast; on CPU autocast would only slow us down, and half-precision weights need none.
    A rank's device is its own GPU (``ranks.device``) when it trains on CUDA."""
    device = pick_device(requested)
    if device.type == "cuda" and ranks.device.type == "cuda":
        device = ranks.device
    if device.type == "cuda" and weights_dtype == "float32":
        return Placement(device, torch.bfloat16, ranks)
    return Placement(device, None, ranks)
