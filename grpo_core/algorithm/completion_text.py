"""Turn sampled completion ids into the text rewards see, splitting off reasoning blocks.

Reward functions score the *answer*; the reasoning block is kept apart so a format or exact-match
reward cannot be satisfied (or spoiled) by what the model wrote while thinking. ``text`` is the
whole completion and is what gets logged. Shapes, with the default tags:

==========================================  ================  ==============  ========
completion text                             answer            reasoning       unclosed
==========================================  ================  ==============  ========
anything, with ``reasoning.enabled`` false  ``text.strip()``  ``None``        no
``A`` (no tags)                             ``A``             ``None``        no
``<think>R</think>A``                       ``A``             ``R``           no
``P<think>R</think>A``                      ``P A``           ``R``           no
``<think>R1</think>A<think>R2</think>B``    ``A B``           ``R1\\nR2``     no
``R</think>A`` (stray close tag)            ``A``             ``R``           no
``<think>R`` or ``P<think>R`` (unclosed)    ``""``            ``R``           yes
empty (only padding or EOS)                 ``""``            ``None``        no
==========================================  ================  ==============  ========

Every piece is stripped; answer pieces outside the blocks are joined with one space, reasoning
pieces with a newline. The stray-close rule exists because chat templates such as Qwen3's and
DeepSeek-R1's put the open tag in the *prompt*, so the completion starts inside the block; it only
applies to a close tag seen before any open tag. Tags do not nest: an open tag inside a block is
reasoning text, and a close tag after the first block with no open tag before it stays in the
answer as literal text (a malformed completion a format reward should see). An unclosed block
(truncated, or EOS sampled while thinking) gives an empty answer even if text preceded the open
tag, because there is no way to tell a finished answer from thinking that never ended.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_core.spec.run_spec import ReasoningSpec

__all__ = ["DecodedCompletion", "decode_and_strip_padding", "split_reasoning"]


@dataclass(frozen=True)
class DecodedCompletion:
    """One completion as logged (``text``) and as rewarded (``answer``)."""

    text: str
    answer: str
    reasoning: str | None
    unclosed_reasoning: bool


def _join(parts: Iterable[str], sep: str) -> str:
    return sep.join(p for p in (part.strip() for part in parts) if p)


def split_reasoning(text: str, spec: ReasoningSpec) -> DecodedCompletion:
    """Split ``text`` into answer and reasoning following the table in the module docstring."""
    if not spec.enabled or not text.strip():
        return DecodedCompletion(text=text, answer=text.strip(), reasoning=None, unclosed_reasoning=False)
    open_tag, close_tag = spec.open_tag, spec.close_tag
    reasoning: list[str] = []
    answer: list[str] = []
    rest = text
    first_open, first_close = text.find(open_tag), text.find(close_tag)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        reasoning.append(text[:first_close])
        rest = text[first_close + len(close_tag) :]
    while True:
        start = rest.find(open_tag)
        if start == -1:
            answer.append(rest)
            break
        answer.append(rest[:start])
        body_start = start + len(open_tag)
        end = rest.find(close_tag, body_start)
        if end == -1:
            reasoning.append(rest[body_start:])
            return DecodedCompletion(
                text=text, answer="", reasoning=_join(reasoning, "\n"), unclosed_reasoning=True
            )
        reasoning.append(rest[body_start:end])
        rest = rest[end + len(close_tag) :]
    return DecodedCompletion(
        text=text,
        answer=_join(answer, " "),
        # An empty block (``<think></think>``, what Qwen3 emits with thinking off) still counts as
        # a block, so reasoning is "" rather than None.
        reasoning=_join(reasoning, "\n") if reasoning else None,
        unclosed_reasoning=False,
    )


def _ids_to_drop(tokenizer: Any, spec: ReasoningSpec) -> set[int]:
    """Ids of special tokens (pad, EOS, BOS, unk, chat markers) except the reasoning tags.

    This is what ``skip_special_tokens=True`` would drop, minus the tags: some tokenizers
    register ``<think>``/``</think>`` as special, and dropping them would merge reasoning into the
    answer. The tags are kept even with reasoning disabled so the logged text shows them.
    """
    tags = {spec.open_tag, spec.close_tag}
    drop = {
        int(token_id)
        for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
        if getattr(added, "special", False) and getattr(added, "content", str(added)) not in tags
    }
    for token, token_id in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=False):
        if token not in tags and token_id is not None:
            drop.add(int(token_id))
    return drop


def decode_and_strip_padding(
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    tokenizer: Any,
    spec: ReasoningSpec,
) -> list[DecodedCompletion]:
    """Decode the masked part of each ``(N, T)`` row and split off its reasoning, keeping row order.

    Tokens after the first EOS are masked out but may be arbitrary samples, so only masked tokens
    are decoded. Special tokens are removed by id before one ``batch_decode`` with
    ``skip_special_tokens=False`` rather than by ``skip_special_tokens=True``, which would also
    drop reasoning tags registered as special; filtering ids (not strings) also leaves alone any
    answer text that merely looks like a special token.
    """
    if completion_ids.dim() != 2 or completion_ids.shape != completion_mask.shape:
        raise ValueError(
            f"completion_ids and completion_mask must both be (N, T); got "
            f"{tuple(completion_ids.shape)} and {tuple(completion_mask.shape)}"
        )
    drop = _ids_to_drop(tokenizer, spec)
    rows = [
        [token for token, keep in zip(ids, mask, strict=True) if keep and token not in drop]
        for ids, mask in zip(completion_ids.tolist(), completion_mask.bool().tolist(), strict=True)
    ]
    if not rows:
        return []
    texts = tokenizer.batch_decode(rows, skip_special_tokens=False)
    return [split_reasoning(text, spec) for text in texts]
