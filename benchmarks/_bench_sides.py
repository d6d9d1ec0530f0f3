"""What both sides of ``core_vs_trl.py`` share in their child process.

The workload (prompts, the reward as a plain function for TRL and as registry entries for our
core, the strings on which both must agree), the tiny model build (``--side build``), the clocks
that time the model's forward calls and ``Tensor.backward``, and the child end of the lock-step
protocol. Nothing here imports torch, transformers or TRL at module level: the parent imports this
module too.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

PROMPTS = [
    "Is the sum of two and three five?",
    "Please reply with a short answer.",
    "What is 2+3?",
    "Is it good?",
    "hello world",
    "Think about the number seven.",
    "one two three four",
    "Is the cat a dog?",
    "What is 4+4?",
    "Is nine more than ten?",
    "Say yes or no.",
    "Is the answer good?",
    "What is the sum of one and one?",
    "Is a dog bad?",
    "Please think first.",
    "What is 7+1?",
    "Is eight an even number?",
    "Reply with one word.",
    "Is five plus five ten?",
    "What is 6+2?",
    "Is the world round?",
    "hello cat",
    "Is two times three six?",
    "What is 9+0?",
    "Think about it.",
    "Is the result final?",
    "What is the answer?",
    "Is it so?",
    "Add one and two.",
    "Is three minus one two?",
    "Is it long or short?",
    "What is 5+5?",
]
# Presets on the ~31M-parameter model (``_bench_realistic.py``); long-prompt gives every prompt a
# ~500-token document before its question.
REALISTIC_PRESETS = ("realistic", "long-prompt")


def workload_prompts(preset: str) -> list[str]:
    """The prompts both trainers (and the floor) see under ``preset``."""
    if preset != "long-prompt":
        return PROMPTS
    from _bench_realistic import long_prompts

    return long_prompts()


def max_prompt_tokens(preset: str) -> int:
    """The prompt bound our side gives (TRL's trainer has none): above every prompt's length, and
    with the completion within the model's 1,024 positions."""
    return 768 if preset == "long-prompt" else 64


TARGET_CHARS = 12
YES_WEIGHT, LENGTH_WEIGHT = 1.0, 0.5
CORE_REWARDS = [
    {"name": "contains", "weight": YES_WEIGHT, "args": {"text": "yes"}},
    {"name": "length_target", "weight": LENGTH_WEIGHT, "args": {"target": TARGET_CHARS, "unit": "chars"}},
]
# Strings on which both reward implementations must agree exactly.
REWARD_CHECK_STRINGS = [
    "",
    "yes",
    " yes ",
    "Yes",
    "yesyesyesyes",
    "no",
    "  the answer is yes  ",
    "eyes",
    "y e s",
    "a" * 12,
    "a" * 30,
    " " * 5 + "yes" + " " * 5,
    "<think>yes</think>",
    "yes\n",
    "\tno yes no yes no",
    "what is the answer to yes no maybe",
    "12345678901",
    "x" * 24,
    "x" * 25,
]


def plain_reward(completion: str) -> float:
    """The benchmark's reward on one completion: contains "yes", plus a length term (12 chars)."""
    answer = completion.strip()
    length_term = max(0.0, 1.0 - abs(len(answer) - TARGET_CHARS) / TARGET_CHARS)
    return YES_WEIGHT * float("yes" in answer) + LENGTH_WEIGHT * length_term


def say_yes_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function (plain-text prompts, so completions are strings)."""
    return [plain_reward(c) for c in completions]


# ----------------------------------------------------------------------------------------------
# Child: build the model
# ----------------------------------------------------------------------------------------------
def side_build(args: argparse.Namespace) -> dict[str, Any]:
    from grpo_core.io.tiny_models import build_tiny_model

    if args.preset in REALISTIC_PRESETS:
        from _bench_realistic import build_realistic_model

        path = build_realistic_model(args.model_dir, args.seed)
    else:
        path = build_tiny_model(
            args.model_dir, args.family, args.hidden_size, args.num_layers, args.num_heads, seed=args.seed
        )
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    return {
        "model_dir": str(path),
        "parameters": params,
        "vocab_size": model.config.vocab_size,
        "torch": torch.__version__,
    }


# ----------------------------------------------------------------------------------------------
# Clocks shared by both sides: time spent inside the model's forward and inside backward()
# ----------------------------------------------------------------------------------------------
class Clock:
    """Accumulates wall time between matched start/stop calls; nested calls count once."""

    def __init__(self) -> None:
        self.total = 0.0
        self._depth = 0
        self._started = 0.0

    def start(self, *_: Any) -> None:
        if self._depth == 0:
            self._started = time.perf_counter()
        self._depth += 1

    def stop(self, *_: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.total += time.perf_counter() - self._started

    def take(self) -> float:
        """The time accumulated since the last take, and reset."""
        total, self.total = self.total, 0.0
        return total


def attach_clocks(models: list[Any]) -> tuple[Clock, Clock]:
    """Time every call of ``models`` (forward hooks) and every ``Tensor.backward`` in this process.

    The model code (transformers' Llama) is the same on both sides, so these two clocks show how
    much of a step is shared work and how much is the trainer's own.
    """
    import torch

    forward, backward = Clock(), Clock()
    for model in models:
        model.register_forward_pre_hook(forward.start)
        model.register_forward_hook(forward.stop)
    original = torch.Tensor.backward

    def timed_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        backward.start()
        try:
            return original(self, *args, **kwargs)
        finally:
            backward.stop()

    torch.Tensor.backward = timed_backward  # type: ignore[method-assign]
    return forward, backward


class StepGate:
    """Child end of the lock-step protocol (see :func:`run_lockstep`); a no-op without ``--sync-fds``.

    Before each step the child writes ``R`` (ready, idle) and blocks until the parent writes
    ``G``; after the step it writes ``D``. The time spent blocked is returned so that intervals
    between steps can exclude it.
    """

    def __init__(self, fds: str | None) -> None:
        self.read_fd, self.write_fd = (int(x) for x in fds.split(",")) if fds else (-1, -1)

    def wait(self) -> float:
        if self.read_fd < 0:
            return 0.0
        started = time.perf_counter()
        os.write(self.write_fd, b"R")
        if os.read(self.read_fd, 1) != b"G":
            raise RuntimeError("lock-step parent went away")
        return time.perf_counter() - started

    def done(self) -> None:
        if self.write_fd >= 0:
            os.write(self.write_fd, b"D")
