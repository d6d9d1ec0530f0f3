"""A job's GPU-hours estimated before it runs, pure: the tokens its shape makes it generate and
train on over a pool's rate in tokens per GPU-second, plus the GPU-seconds a job of the pool holds
beyond its steps (dispatch, process start, model loading, the first step, the final model). Both
are measured on the pool's latest succeeded jobs (:func:`measured`, from
:func:`api.store.usage.pool_history`); a pool with none assumes the deployment's
``GRPO_ESTIMATE_TOKENS_PER_GPU_SECOND`` and no start-up. ``POST /v1/jobs?dry_run=true`` answers it.

Two terms, not one rate over everything a job held: on the tiny examples a 4-step job holds its
GPU for start-up ~25 times longer than for its steps, so one rate taken from a 20-step job put a
4-step one at a fourteenth of what it used.

The tokens are counted as the ``num_tokens`` metric counts them, so that the rate measured from
that metric applies: each optimizer step that generates (a round replayed ``num_iterations``
times counts once) holds ``prompts_per_step × num_generations`` sequences of the prompt's tokens
plus ``max_completion_length``. A prompt's tokens are guessed without a tokenizer (the web
process loads none): an inline prompt's characters ÷ 4 on average (English text with a BPE
tokenizer), at most ``max_prompt_length``; a file's or hub dataset's, ``max_prompt_length``.
Completions count at their full length, so a job whose completions stop early is estimated high;
evaluation and an agent's later turns are not counted, and the measured rate covers them only as
far as the pool's past jobs had them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from api.domain.job_spec import JobSpec
from api.schemas.estimates import GpuEstimate
from api.schemas.usage import SECONDS_PER_HOUR

CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class PastRun:
    """A succeeded job of the pool, as its rows tell it."""

    gpus: int
    held_gpu_seconds: float  # its allocations: GPUs × seconds held
    tokens: float  # num_tokens at its last step record
    steady_tokens: float  # tokens trained from its first step record to its last
    steady_seconds: float  # wall-clock seconds from its first step record to its last


@dataclass(frozen=True)
class Throughput:
    tokens_per_gpu_second: float  # while a job trains, past its first step
    startup_gpu_seconds: float  # per GPU: what a job holds beyond what its tokens take at that rate
    jobs: int  # how many succeeded jobs it was measured on (0: the deployment's default)


def measured(runs: Sequence[PastRun]) -> Throughput | None:
    """The rate between the runs' first and last step records (their tokens over their GPUs ×
    seconds there), and the mean of what each held beyond its tokens at that rate, per GPU (never
    below 0); None without a run that trained a token. Runs of one step have no such span: then
    the rate is their tokens over all they held, and no start-up."""
    runs = [run for run in runs if run.tokens > 0 and run.held_gpu_seconds > 0]
    if not runs:
        return None
    steady = [run for run in runs if run.steady_tokens > 0 and run.steady_seconds > 0]
    if not steady:
        return Throughput(sum(run.tokens for run in runs) / sum(run.held_gpu_seconds for run in runs), 0.0,
                          len(runs))
    rate = sum(run.steady_tokens for run in steady) / sum(run.gpus * run.steady_seconds for run in steady)
    beyond = [(run.held_gpu_seconds - run.tokens / rate) / run.gpus for run in runs]
    return Throughput(rate, max(0.0, sum(beyond) / len(beyond)), len(runs))


def prompt_tokens(spec: JobSpec) -> int:
    """The tokens of a prompt, on average: see the module's docstring."""
    cap = spec.grpo.max_prompt_length
    rows = spec.dataset.prompts
    if not rows:
        return cap
    characters = sum(len(_text(row[spec.dataset.prompt_field])) for row in rows) / len(rows)
    return max(1, min(cap, math.ceil(characters / CHARS_PER_TOKEN)))


def _text(prompt: Any) -> str:
    """A prompt's text: a string, or a chat's messages' contents together."""
    if isinstance(prompt, str):
        return prompt
    return "".join(str(message.get("content", "")) for message in prompt)


def estimate(spec: JobSpec, throughput: Throughput, basis: Literal["measured", "default"]) -> GpuEstimate:
    """The job's GPU-hours at ``throughput``; ``gpu_hours`` None while its steps are unknown
    (``max_steps: -1`` over a file or hub dataset: counted once the job loads it)."""
    grpo = spec.grpo
    prompt = prompt_tokens(spec)
    per_step = grpo.prompts_per_step * grpo.num_generations * (prompt + grpo.max_completion_length)
    steps = spec.known_steps()
    tokens = None if steps is None else per_step * math.ceil(steps / grpo.num_iterations)
    startup = spec.resources.gpus * throughput.startup_gpu_seconds
    gpu_hours = (None if tokens is None
                 else (startup + tokens / throughput.tokens_per_gpu_second) / SECONDS_PER_HOUR)
    return GpuEstimate(gpu_hours=gpu_hours, tokens_per_step=per_step, prompt_tokens=prompt, steps=steps,
                       tokens=tokens, tokens_per_gpu_second=throughput.tokens_per_gpu_second,
                       startup_gpu_seconds=throughput.startup_gpu_seconds, basis=basis,
                       measured_jobs=throughput.jobs)
