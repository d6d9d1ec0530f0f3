"""Shared fixtures for the core tests; nothing here touches the network."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Every word the tests decode must be here: anything else becomes <unk>, which decoding drops.
WORD_TOKENIZER_CORPUS = [
    "the answer is 42",
    "let me think about this step by step",
    "two plus two is four so",
    "first then finally done",
    "garbage noise junk hello world",
]


def _build_word_tokenizer(*, special_tags: bool) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer trained in memory; decoding joins words with spaces."""
    # Imported here: transformers pulls in torch, which collection does not need.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"])
    backend.train_from_iterator(WORD_TOKENIZER_CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tags = ["<think>", "</think>"]
    if special_tags:
        # The spelling transformers 4.x and 5.x both accept for extra special tokens.
        tokenizer.add_special_tokens({"additional_special_tokens": tags})
    else:
        tokenizer.add_tokens(tags)
    return tokenizer


@pytest.fixture
def word_tokenizer() -> PreTrainedTokenizerFast:
    """Tiny offline tokenizer with ``<think>``/``</think>`` as ordinary added tokens, no chat template.

    Function-scoped because tests may set ``chat_template`` on it.
    """
    return _build_word_tokenizer(special_tags=False)


@pytest.fixture
def word_tokenizer_special_tags() -> PreTrainedTokenizerFast:
    """Same vocabulary, but the reasoning tags are registered as *special* tokens."""
    return _build_word_tokenizer(special_tags=True)
