"""Loading a reward model and scoring texts with it (torch; see :mod:`grpo_core.rewards.reward_model`).

Texts follow TRL's reward models: a string prompt is concatenated with its completion; a prompt
given as messages gets the completion appended as the assistant's message and goes through the
reward tokenizer's chat template (a reward tokenizer without one gets the policy-rendered prompt
and the completion concatenated). Texts are tokenized without adding special tokens, right-padded
so every row's positions are those of its unpadded forward, and truncated from the left so the
last token, where a sequence classifier reads its score, is always the completion's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo_core.errors import SpecError
from grpo_core.rewards.frozen_models import SEQUENCE_CLASSIFIER, load_frozen_model
from grpo_core.rewards.reward_model_args import RewardModelArgs
from grpo_core.rewards.reward_types import RewardContext

__all__ = ["RewardModelScorer", "load_scorer", "reward_texts"]

FIELD = "model"  # bind_rewards prefixes rewards.N.args.


def reward_texts(tokenizer: Any, prompts: list[str], completions: list[str],
                 prompt_messages: list[list[dict[str, str]] | None]) -> list[str]:
    """What the reward model reads for each row (see the module's docstring)."""
    templated = bool(getattr(tokenizer, "chat_template", None))
    texts = []
    for prompt, completion, messages in zip(prompts, completions, prompt_messages, strict=True):
        if messages is not None and templated:
            conversation = [*messages, {"role": "assistant", "content": completion}]
            texts.append(tokenizer.apply_chat_template(conversation, tokenize=False))
        else:
            texts.append(prompt + completion)
    return texts


@dataclass
class RewardModelScorer:
    """A loaded reward model, called as a reward function; forward passes in batches of
    ``batch_size`` under ``inference_mode``."""

    model: torch.nn.Module
    tokenizer: Any
    device: torch.device
    args: RewardModelArgs

    def __call__(self, completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        texts = columns.get("raw_completions", completions) if self.args.completion == "raw" else completions
        messages = columns.get("prompt_messages") or [None] * len(completions)
        return list(self.scores(reward_texts(self.tokenizer, prompts, list(texts), messages)))

    @torch.inference_mode()
    def scores(self, texts: list[str]) -> list[float]:
        out: list[float] = []
        size = self.args.batch_size
        for start in range(0, len(texts), size):
            batch = self.tokenizer(texts[start:start + size], return_tensors="pt", padding=True,
                                   truncation=True, max_length=self.args.max_length, add_special_tokens=False)
            logits = self.model(**batch.to(self.device)).logits
            out += logits[:, self.args.logit_index].float().cpu().tolist()
        return out


def load_scorer(args: RewardModelArgs, context: RewardContext) -> RewardModelScorer:
    """Load the model once (this job's device and dtype, :mod:`grpo_core.rewards.frozen_models`)
    and return the reward function."""
    loaded = load_frozen_model(args.model, context, SEQUENCE_CLASSIFIER, FIELD)
    model, tokenizer = loaded.model, loaded.tokenizer
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    if args.logit_index >= model.config.num_labels:
        raise SpecError("logit_index", f"the model has {model.config.num_labels} output logit(s); "
                                       f"logit_index {args.logit_index} is past them")
    # The classifier reads each row at its last non-pad token: it must know the pad id.
    model.config.pad_token_id = tokenizer.pad_token_id
    return RewardModelScorer(model, tokenizer, loaded.device, args)
