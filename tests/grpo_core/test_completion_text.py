"""Reasoning-block splitting and decoding of sampled completions."""

from __future__ import annotations

import pytest
import torch

from grpo_core.algorithm.completion_text import DecodedCompletion, decode_and_strip_padding, split_reasoning
from grpo_core.spec.run_spec import ReasoningSpec

SPEC = ReasoningSpec()


def _split(text: str) -> tuple[str, str | None, bool]:
    out = split_reasoning(text, SPEC)
    assert out.text == text
    return out.answer, out.reasoning, out.unclosed_reasoning


def test_disabled_keeps_tags_in_the_answer() -> None:
    out = split_reasoning("  <think>R</think> A ", ReasoningSpec(enabled=False))
    assert out == DecodedCompletion("  <think>R</think> A ", "<think>R</think> A", None, False)


def test_no_tags() -> None:
    assert _split("  just an answer \n") == ("just an answer", None, False)


def test_one_closed_block() -> None:
    assert _split("<think> step one </think>\n 42 ") == ("42", "step one", False)


def test_text_before_the_block_is_joined_with_the_answer() -> None:
    assert _split("Sure. <think>R</think>\n42") == ("Sure. 42", "R", False)


def test_several_blocks_are_all_removed() -> None:
    text = "<think>R1</think>A<think> R2 </think> B <think></think>"
    assert _split(text) == ("A B", "R1\nR2", False)


def test_empty_block_is_reasoning_not_none() -> None:
    assert _split("<think>\n\n</think>\n\n42") == ("42", "", False)


def test_stray_close_tag_when_the_prompt_opened_the_block() -> None:
    assert _split("thinking hard</think> 42") == ("42", "thinking hard", False)


def test_stray_close_then_another_block() -> None:
    assert _split("R1</think>A<think>R2</think>B") == ("A B", "R1\nR2", False)


def test_unclosed_block_gives_no_answer() -> None:
    # Text before the open tag must not count as an answer either: the completion never finished.
    assert _split("The answer is 42 <think> but wait") == ("", "but wait", True)


def test_unclosed_after_a_closed_block() -> None:
    assert _split("<think>R1</think>A<think>R2") == ("", "R1\nR2", True)


def test_tags_do_not_nest() -> None:
    assert _split("<think>a<think>b</think>c</think>") == ("c</think>", "a<think>b", False)


@pytest.mark.parametrize("text", ["", "  \n "])
def test_empty_text(text: str) -> None:
    assert _split(text) == ("", None, False)


def test_custom_tags() -> None:
    spec = ReasoningSpec(open_tag="<reasoning>", close_tag="</reasoning>")
    out = split_reasoning("<reasoning>R</reasoning>A<think>x</think>", spec)
    assert (out.answer, out.reasoning) == ("A<think>x</think>", "R")


def _ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids, f"add the words of {text!r} to the fixture corpus"
    return ids


def _batch(tokenizer, rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ids ending at (and including) EOS, padded with garbage words the mask excludes."""
    garbage = _ids(tokenizer, "garbage noise junk")
    ids = torch.tensor([(row + garbage * width)[:width] for row in rows])
    mask = torch.tensor([[int(i < len(row)) for i in range(width)] for row in rows])
    return ids, mask


def test_eos_inside_the_block_masks_out_later_tokens(word_tokenizer) -> None:
    eos = word_tokenizer.eos_token_id
    row = _ids(word_tokenizer, "<think> let me think") + [eos]
    ids, mask = _batch(word_tokenizer, [row], width=12)
    assert "garbage" in word_tokenizer.decode(ids[0].tolist())
    [out] = decode_and_strip_padding(ids, mask, word_tokenizer, SPEC)
    assert out == DecodedCompletion("<think> let me think", "", "let me think", True)


def test_only_padding_row(word_tokenizer) -> None:
    pad, eos = word_tokenizer.pad_token_id, word_tokenizer.eos_token_id
    ids = torch.tensor([[eos, pad, pad], [pad, pad, pad]])
    mask = torch.tensor([[1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    outs = decode_and_strip_padding(ids, mask, word_tokenizer, SPEC)
    assert outs == [DecodedCompletion("", "", None, False)] * 2


def test_tags_registered_as_special_tokens_survive(word_tokenizer_special_tags) -> None:
    tokenizer = word_tokenizer_special_tags
    assert "<think>" in tokenizer.all_special_tokens
    row = _ids(tokenizer, "<think> two plus two </think> four") + [tokenizer.eos_token_id]
    assert tokenizer.decode(row, skip_special_tokens=True) == "two plus two four"  # what we avoid
    ids, mask = _batch(tokenizer, [row], width=10)
    [out] = decode_and_strip_padding(ids, mask, tokenizer, SPEC)
    assert (out.answer, out.reasoning, out.unclosed_reasoning) == ("four", "two plus two", False)
    assert "<eos>" not in out.text and "garbage" not in out.text


def test_mixed_batch_keeps_row_order(word_tokenizer) -> None:
    tok, eos = word_tokenizer, word_tokenizer.eos_token_id
    rows = [
        _ids(tok, "the answer is 42") + [eos],
        [eos],
        _ids(tok, "<think> first then finally"),  # truncated: no EOS, fills the width
        _ids(tok, "step by step </think> done") + [eos],
        _ids(tok, "<think> so </think> four") + [eos],
    ]
    ids, mask = _batch(tok, rows, width=max(len(r) for r in rows))
    outs = decode_and_strip_padding(ids, mask.to(torch.int64), tok, SPEC)
    assert [(o.answer, o.reasoning, o.unclosed_reasoning) for o in outs] == [
        ("the answer is 42", None, False),
        ("", None, False),
        ("", "first then finally", True),
        ("done", "step by step", False),
        ("four", "so", False),
    ]
    assert outs[0].text == "the answer is 42"


def test_shape_mismatch_is_rejected(word_tokenizer) -> None:
    with pytest.raises(ValueError, match="must both be"):
        decode_and_strip_padding(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4), word_tokenizer, SPEC)


def test_empty_batch(word_tokenizer) -> None:
    empty = torch.zeros(0, 5, dtype=torch.long)
    assert decode_and_strip_padding(empty, empty, word_tokenizer, SPEC) == []
