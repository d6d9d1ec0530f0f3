"""Counter-based sampling randomness: the uniform a completion row uses at token ``t`` is a pure
function of ``(seed, draw, g, t)``.

``draw`` is the prompt's serial number in the sampler's stream (``PromptSampler.draws_taken``
before the batch), so it tells apart the optimizer step, the dynamic-sampling round and the
prompt; ``g`` is the completion's index within its group. Nothing depends on the row's position
in the batch, on the other rows or on any RNG state: a group gives the same tokens whether it is
sampled alone, in another batch order or on another data-parallel rank, and a resumed run
re-draws exactly what the uninterrupted one drew.

The mixer is splitmix64's finalizer done in wrapping int64 arithmetic on the device (torch has
no uint64 multiply), so a decode step costs a few element-wise ops on ``(N,)``. The finalizer maps
0 to 0, and so does folding a 0 into a 0 state: the seed is offset before it is mixed, as
splitmix64's own generator does, or seed 0's first row would draw exactly 0.0 at its first token.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``value``."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MUL1 = _signed(0xBF58476D1CE4E5B9)
_MUL2 = _signed(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (``>>`` on int64 is arithmetic: it copies the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer, a bijection on 64-bit words, element-wise on an int64 tensor."""
    x = (x ^ _shift_right(x, 30)) * _MUL1
    x = (x ^ _shift_right(x, 27)) * _MUL2
    return x ^ _shift_right(x, 31)


def absorb(state: torch.Tensor, value: torch.Tensor | int) -> torch.Tensor:
    """Fold ``value`` into the hashes ``state``; for a fixed state, distinct values (mod 2^64)
    give distinct results, since multiplying by an odd constant, xor and ``mix64`` are bijections."""
    return mix64(state ^ (torch.as_tensor(value, dtype=torch.long, device=state.device) * _GOLDEN))


def seed_key(seed: int) -> int:
    """splitmix64's first output for ``seed``: ``mix64(seed + golden)``, as an int64. Nonzero for
    every seed but ``−golden`` (mod 2^64), far outside the seeds a config accepts."""
    return int(mix64(torch.tensor(_signed(seed + _GOLDEN), dtype=torch.long)))


def row_keys(seed: int, draws: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``draws (B,)`` int64 prompt serials → ``(B·G,)`` row keys, grouped like the rollout's rows
    (row ``i`` is generation ``i % G`` of prompt ``i // G``)."""
    prompts = absorb(torch.full_like(draws, seed_key(seed), dtype=torch.long), draws)
    generations = torch.arange(num_generations, dtype=torch.long, device=draws.device)
    return absorb(prompts.repeat_interleave(num_generations), generations.repeat(draws.numel()))


def token_uniforms(keys: torch.Tensor, position: int) -> torch.Tensor:
    """``keys (N,)`` → ``(N,)`` float64 uniforms in [0, 1) for completion token ``position``:
    the top 53 bits of the mixed word, so every value is an exact multiple of 2^-53."""
    bits = absorb(keys, position)
    return _shift_right(bits, 11).double() * 2.0**-53


# Folded in before an eval key's step, so no eval row shares a key with a training row.
_EVAL_DOMAIN = int.from_bytes(b"eval", "big")


def eval_row_keys(seed: int, step: int, prompt_indices: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``prompt_indices (B,)`` eval-set rows → ``(B·G,)`` row keys of the eval at ``step``, a
    function of ``(seed, "eval", step, prompt index, generation index)`` only: the same on any
    number of ranks, in any batch, and after a resume."""
    state = torch.full_like(prompt_indices, seed_key(seed), dtype=torch.long)
    prompts = absorb(absorb(absorb(state, _EVAL_DOMAIN), step), prompt_indices)
    generations = torch.arange(num_generations, dtype=torch.long, device=prompt_indices.device)
    return absorb(prompts.repeat_interleave(num_generations), generations.repeat(prompt_indices.numel()))
