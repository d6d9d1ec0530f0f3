"""Keyed sampling randomness: the hash against a scalar reference, its distribution, and the
invariance it buys: a row's tokens do not depend on what else is in its batch, or where."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_core.algorithm.randomness import row_keys, token_uniforms
from grpo_core.algorithm.rollout import SamplingOptions, sample_completions, tokenize_prompts
from grpo_core.algorithm.sampling import sample_next_token
from grpo_core.io.model_loading import load_tokenizer

_M64 = (1 << 64) - 1


def _naive_mix(x: int) -> int:
    """splitmix64's finalizer on Python ints (unsigned 64-bit), as published."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _naive_seed_key(seed: int) -> int:
    """splitmix64's first output for ``seed``: the state advanced by the golden gamma, then mixed."""
    return _naive_mix((seed + 0x9E3779B97F4A7C15) & _M64)


def _naive_uniform(seed: int, draw: int, g: int, t: int) -> float:
    state = _naive_seed_key(seed)
    for value in (draw, g, t):
        state = _naive_mix(state ^ ((value * 0x9E3779B97F4A7C15) & _M64))
    return (state >> 11) / 2.0**53


def test_the_scalar_reference_is_splitmix64() -> None:
    # The published first outputs of splitmix64 seeded with 0 and with 1234567.
    assert _naive_seed_key(0) == 0xE220A8397B1DCDAF
    assert _naive_seed_key(1234567) == 0x599ED017FB08FC85


@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1])
def test_uniforms_match_a_scalar_reference(seed: int) -> None:
    draws = torch.tensor([0, 1, 7, 2**40 + 3])
    keys = row_keys(seed, draws, num_generations=3)
    for t in (0, 1, 255, 131071):
        got = token_uniforms(keys, t).tolist()
        expected = [_naive_uniform(seed, d, g, t) for d in draws.tolist() for g in range(3)]
        assert got == expected


def test_uniforms_are_uniform_and_distinct() -> None:
    keys = row_keys(0, torch.arange(2000), num_generations=8)
    u = torch.cat([token_uniforms(keys, t) for t in range(16)])  # 256k draws
    n = u.numel()
    assert bool(((u >= 0) & (u < 1)).all())
    assert abs(float(u.mean()) - 0.5) < 4 * (1 / 12) ** 0.5 / n**0.5
    # Kolmogorov-Smirnov: 1.95/sqrt(n) is the 0.1% critical value.
    ecdf = torch.arange(1, n + 1, dtype=torch.float64) / n
    assert float((ecdf - u.sort().values).abs().max()) < 1.95 / n**0.5
    assert u.unique().numel() == n  # 53-bit draws: any repeat would mean colliding keys
    # Neighbouring positions of one row are not correlated.
    a, b = token_uniforms(keys, 0), token_uniforms(keys, 1)
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.02


def test_seed_zero_does_not_draw_zero_first() -> None:
    """The finalizer maps 0 to 0: a seed mixed without an offset gave seed 0's first row (draw 0,
    generation 0) the uniform 0.0 at token 0, so every seed-0 run's first completion began with
    the lowest token id that had any probability."""
    keys = row_keys(0, torch.arange(4), num_generations=4)
    first = token_uniforms(keys, 0)
    assert float(first[0]) > 0.0
    assert first.unique().numel() == first.numel()
    flat = torch.zeros(keys.numel(), 1000)  # every token equally likely: the token is about u·V
    tokens = sample_next_token(flat, temperature=1.0, uniforms=first)
    assert int(tokens[0]) != 0
    assert ((tokens - first * 1000).abs() <= 1).all()


PROMPTS = ["What is 2+3?", "hello world please reply with a long answer", "one", "two words"]
G = 3


def _completions(model, tokenizer, order: list[int], draws: list[int]) -> dict[tuple[int, int], list[int]]:
    """Sample prompts ``order`` (with their draw serials) in one batch; ``(prompt, g) -> tokens``."""
    prompts = tokenize_prompts(tokenizer, [PROMPTS[i] for i in order], 64, torch.device("cpu"))
    options = SamplingOptions(max_new_tokens=12, temperature=1.0, top_k=40, top_p=0.95)
    eos = torch.tensor([tokenizer.eos_token_id])
    keys = row_keys(5, torch.tensor([draws[i] for i in order]), G)
    rollout = sample_completions(model, prompts, G, eos, tokenizer.pad_token_id, options, keys)
    lengths = rollout.completion_mask.sum(1).tolist()
    return {
        (prompt, row % G): rollout.completion_ids[row, : lengths[row]].tolist()
        for row, prompt in enumerate(p for p in order for _ in range(G))
    }


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_rows_tokens_do_not_depend_on_its_batch(tiny_model_factory, family) -> None:
    folder = tiny_model_factory(family)
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder).float()
    draws = [40, 41, 42, 43]
    whole = _completions(model, tokenizer, [0, 1, 2, 3], draws)
    halves = _completions(model, tokenizer, [0, 1], draws) | _completions(model, tokenizer, [2, 3], draws)
    shuffled = _completions(model, tokenizer, [3, 1, 0, 2], draws)
    assert halves == whole
    assert shuffled == whole
    # Not trivially equal: the generations of a group differ, and another draw changes them.
    assert len({tuple(whole[(1, g)]) for g in range(G)}) > 1
    assert _completions(model, tokenizer, [0, 1, 2, 3], [50, 51, 52, 53]) != whole


def test_sampling_without_keys_is_refused(tiny_model_dir) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompts = tokenize_prompts(tokenizer, PROMPTS[:2], 64, torch.device("cpu"))
    eos = torch.tensor([tokenizer.eos_token_id])
    with pytest.raises(ValueError, match="row key"):
        sample_completions(model, prompts, G, eos, tokenizer.pad_token_id, SamplingOptions(4))
    with pytest.raises(ValueError, match="row key"):
        keys = row_keys(0, torch.arange(1), G)  # one prompt's keys for two prompts
        sample_completions(model, prompts, G, eos, tokenizer.pad_token_id, SamplingOptions(4), keys)
