"""Rollout: B prompts × G samples in one batched, KV-cached sampling loop (docs/grpo_reference.md, step 1).

We run our own loop instead of ``model.generate``: it does only what GRPO needs (left-padded
batch, temperature/top-k/top-p, stop at EOS, drop finished rows), which on small models removes
most of generate's per-token overhead. Its forward passes come from :mod:`grpo_core.algorithm.decoders`
(a lean KV-cached decoder for Llama-family models, the model's own forward otherwise). Its
greedy path is tested token-for-token against ``generate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_core.algorithm.decoders import LeanDecoder, RowCache
from grpo_core.algorithm.randomness import token_uniforms
from grpo_core.algorithm.sampling import sample_next_token, seen_tokens
from grpo_core.algorithm.shared_prompt_decoder import decoder_for_groups
from grpo_core.parallel.sharding import gathered_for_generation

# Decode steps between two asks of a ``should_stop``: a long generation (thousands of tokens) is
# left within a few seconds of a cancel or pause instead of at the end of the step. The caller
# makes the ask cheap (the trainer asks its callbacks at most once a second).
STOP_CHECK_TOKENS = 8


@dataclass
class TurnCaches:
    """An episode turn's KV caches (:mod:`grpo_core.algorithm.episodes`): each row's cache from
    its previous turn and the tokens of its context not in it (``None`` for a first turn, which
    prefills the prompts), and after the turn each row's cache by batch row (``kept``; empty with
    a decoder that cannot keep them, whose every turn prefills its whole context)."""

    caches: list[RowCache] | None = None
    blocks: list[list[int]] | None = None
    kept: dict[int, RowCache] | None = None


class GenerationStopped(Exception):
    """``should_stop`` said yes inside the decode loop: the batch is unfinished, and nothing of
    it may be trained on."""

    def __init__(self, tokens: int) -> None:
        super().__init__(f"generation stopped after {tokens} token(s)")
        self.tokens = tokens


@dataclass(frozen=True)
class SamplingOptions:
    """How each next token is chosen (filters applied in Hugging Face's order) and when to stop."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter
    min_p: float | None = None  # None: no min-p filter
    repetition_penalty: float = 1.0  # 1: none; applied before greedy's argmax too, as in transformers
    greedy: bool = False  # argmax, ignoring the temperature and the filters


@dataclass
class PromptBatch:
    """Left-padded prompt tokens ``(B, P)``; ``num_truncated`` prompts lost tokens on the left."""

    ids: torch.Tensor
    mask: torch.Tensor
    num_truncated: int


@dataclass
class Rollout:
    """One generation batch. Rows are grouped: row ``i`` answers prompt ``i // G``.

    ``completion_mask`` is 1 up to and including the first EOS; ``is_truncated`` marks rows that
    reached ``max_completion_length`` without an EOS. A multi-turn episode's completion holds its
    observations (tool results, an environment's answers) between the model's turns:
    ``completion_mask`` is then 1 on every token of the trajectory and ``model_mask`` 1 only on
    the tokens the model sampled, the ones trained on (:mod:`grpo_core.algorithm.episodes`); None
    for a single-turn rollout, where the two are the same.
    """

    prompt_ids: torch.Tensor  # (N, P)
    prompt_mask: torch.Tensor  # (N, P)
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T)
    is_truncated: torch.Tensor  # (N,) bool
    model_mask: torch.Tensor | None = None  # (N, T)

    @property
    def sampled_mask(self) -> torch.Tensor:
        """1 on the tokens the model sampled (the loss's, the KL's, the clip metrics')."""
        return self.completion_mask if self.model_mask is None else self.model_mask

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    def select(self, rows: torch.Tensor | slice) -> Rollout:
        return Rollout(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.completion_ids[rows],
            self.completion_mask[rows],
            self.is_truncated[rows],
            None if self.model_mask is None else self.model_mask[rows],
        )

    def to(self, device: torch.device | str) -> Rollout:
        return Rollout(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.completion_ids.to(device),
            self.completion_mask.to(device),
            self.is_truncated.to(device),
            None if self.model_mask is None else self.model_mask.to(device),
        )


def tokenize_prompts(
    tokenizer, texts: list[str], max_prompt_length: int, device: torch.device
) -> PromptBatch:
    """Tokenize and left-pad; over-long prompts keep their *last* ``max_prompt_length`` tokens,
    because the end of a prompt (the question, the generation prompt) matters most."""
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    num_truncated = sum(len(ids) > max_prompt_length for ids in encoded)
    kept = [ids[-max_prompt_length:] for ids in encoded]
    return left_padded(kept, tokenizer.pad_token_id, device, num_truncated)


def left_padded(rows: list[list[int]], pad: int, device: torch.device, num_truncated: int = 0) -> PromptBatch:
    """Token rows as one left-padded batch (at least one column wide)."""
    width = max(1, max(len(ids) for ids in rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, tokens in enumerate(rows):
        if tokens:
            ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens) :] = 1
    return PromptBatch(ids.to(device), mask.to(device), num_truncated)


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """``(N, T)`` → 1 up to and including each row's first EOS, 0 after it."""
    is_eos = torch.isin(completion_ids, eos_ids)
    eos_before = is_eos.long().cumsum(dim=1) - is_eos.long()
    return (eos_before == 0).long()


@torch.no_grad()
def sample_completions(
    model: torch.nn.Module,
    prompts: PromptBatch,
    num_generations: int,
    eos_ids: torch.Tensor,
    pad_id: int,
    options: SamplingOptions,
    row_keys: torch.Tensor | None = None,
    should_stop: Callable[[], bool] | None = None,
    turn: TurnCaches | None = None,
) -> Rollout:
    """Sample ``G`` completions for each prompt in one batch of ``N = B·G`` rows.

    ``row_keys (N,)`` (``grpo_core.algorithm.randomness.row_keys``) key each row's random draws, so a row's
    tokens depend on its key and prompt only, never on the rest of the batch; greedy needs none.
    ``should_stop`` is asked every :data:`STOP_CHECK_TOKENS` tokens; its yes raises
    :class:`GenerationStopped`. The model is put in eval mode while sampling (no dropout) and
    restored afterwards. ``turn`` (episodes, G = 1): start from the rows' caches and keep them.
    """
    if not options.greedy and (row_keys is None or row_keys.numel() != prompts.ids.size(0) * num_generations):
        raise ValueError("sampling needs one row key per completion (B·G)")
    was_training = model.training
    model.eval()
    try:
        prompt_ids = prompts.ids.repeat_interleave(num_generations, dim=0)
        prompt_mask = prompts.mask.repeat_interleave(num_generations, dim=0)
        # A sharded model is gathered for the whole loop: its length differs between ranks.
        # inference_mode (not just no_grad) skips autograd's per-op bookkeeping (version counters,
        # view tracking), which is a visible share of each decode step on small models. Only the loop
        # runs in it: the Rollout's tensors are computed outside, so they are ordinary tensors that
        # training may modify in place or save for backward (inference tensors allow neither).
        with gathered_for_generation(model), torch.inference_mode():
            tokens = _decode_loop(model, prompt_ids, prompt_mask, eos_ids, pad_id, options, row_keys,
                                  should_stop, turn, group=num_generations if turn is None else 1)
    finally:
        model.train(was_training)
    completion_mask = completion_mask_from_eos(tokens, eos_ids)
    completion_ids = tokens.masked_fill(completion_mask == 0, pad_id)
    is_truncated = ~torch.isin(tokens, eos_ids).any(dim=1)
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, is_truncated)


def _decode_loop(
    model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, eos_ids: torch.Tensor,
    pad_id: int, options: SamplingOptions, row_keys: torch.Tensor | None,
    should_stop: Callable[[], bool] | None = None, turn: TurnCaches | None = None, group: int = 1,
) -> torch.Tensor:
    """Prefill, then one token per step for the rows still generating. Rows come in runs of
    ``group`` equal prompts, each prefilled and cached once where the decoder allows it.

    A row that emits EOS leaves the batch (its KV cache rows are dropped), so the long tail of
    a group costs only the rows still running: GRPO batches finish at very different lengths.
    """
    n, max_new_tokens = prompt_ids.size(0), options.max_new_tokens
    tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=prompt_ids.device)
    active = torch.arange(n, device=prompt_ids.device)
    decoder = decoder_for_groups(model, max_new_tokens, group)
    caching = turn is not None and isinstance(decoder, LeanDecoder)
    if caching and turn.caches is not None:
        logits = decoder.resume(turn.caches, turn.blocks, prompt_ids.device)
    else:
        logits = decoder.prefill(prompt_ids, prompt_mask)
    if caching:
        decoder.keep_caches(n)
    can_shrink = True
    finished = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)
    # The tokens each row holds so far (prompt, then what it sampled), only when they are penalized.
    penalized = options.repetition_penalty != 1.0
    seen = seen_tokens(prompt_ids, prompt_mask, logits.size(-1)) if penalized else None
    width = 0
    for step in range(max_new_tokens):
        # ``active`` maps the shrunken batch back to the rows' keys.
        uniforms = None if options.greedy else token_uniforms(row_keys[active], step)
        token = sample_next_token(
            logits, options.temperature, options.top_k, options.top_p, options.greedy, uniforms,
            options.min_p, options.repetition_penalty, seen,
        )
        if seen is not None:
            seen[torch.arange(token.size(0), device=token.device), token] = True
        if not can_shrink:
            token = token.masked_fill(finished, pad_id)
        tokens[active, step] = token
        width = step + 1
        done = torch.isin(token, eos_ids)
        if not can_shrink:
            finished |= done
            done = finished
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        if should_stop is not None and width % STOP_CHECK_TOKENS == 0 and should_stop():
            raise GenerationStopped(width)
        if can_shrink and bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            can_shrink = decoder.keep(keep)
            if can_shrink:
                active, token = active[keep], token[keep]
                seen = seen[keep] if seen is not None else None
            else:  # this cache cannot drop rows: finished rows stay, padded, from now on
                finished |= done
        logits = decoder.step(token)
    if turn is not None:
        turn.kept = decoder.caches() if caching else {}
    return tokens[:, :width]


def micro_batches(num_rows: int, accumulation_steps: int) -> list[slice]:
    """``accumulation_steps`` equal slices of a batch's rows (the config guarantees they divide)."""
    size = num_rows // accumulation_steps
    return [slice(start, start + size) for start in range(0, num_rows, size)]


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Join rollouts of different widths: prompts are left-padded, completions right-padded."""
    if len(parts) == 1:
        return parts[0]
    prompt_width = max(p.prompt_ids.size(1) for p in parts)
    completion_width = max(p.completion_ids.size(1) for p in parts)

    def pad(t: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
        extra = width - t.size(1)
        return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

    multi_turn = any(p.model_mask is not None for p in parts)
    return Rollout(
        torch.cat([pad(p.prompt_ids, prompt_width, pad_id, True) for p in parts]),
        torch.cat([pad(p.prompt_mask, prompt_width, 0, True) for p in parts]),
        torch.cat([pad(p.completion_ids, completion_width, pad_id, False) for p in parts]),
        torch.cat([pad(p.completion_mask, completion_width, 0, False) for p in parts]),
        torch.cat([p.is_truncated for p in parts]),
        torch.cat([pad(p.sampled_mask, completion_width, 0, False) for p in parts]) if multi_turn else None,
    )
