"""``text_similarity``'s ``cosine`` (OpenAI's name): how close two texts' embeddings point.

An embedding here is the mean of a local transformers ``AutoModel``'s last hidden states over the
text's tokens (padding left out by the attention mask), the pooling sentence-embedding models are
trained for; the score is the cosine of the two means, clipped to [0, 1] (a reward in OpenAI's
range: opposite directions are as dissimilar as it gets).

Torch lives here, imported by :mod:`grpo_core.rewards.similarity` only when a cosine reward is
built, on the worker. The model is loaded once per job as ``reward_model``'s is
(:mod:`grpo_core.rewards.frozen_models`: the service's models root or the spec's folder, the job's
device and dtype, eval mode, no gradients). Texts are
padded on the right and run in batches: with positions counted from each text's first token and
the padding masked, a text embeds as it would alone. A text that gives no token at all (an empty
text with a tokenizer that adds none) has no embedding: its row is unscored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo_core.rewards.frozen_models import ModelHead, load_frozen_model
from grpo_core.rewards.reward_types import RewardContext

__all__ = ["Embedder", "load_embedder"]

FIELD = "embedding_model"  # bind_rewards prefixes rewards.N.args.
BATCH_SIZE = 32
MAX_TOKENS = 8192  # a text's most tokens, when neither the tokenizer nor the model says fewer
# Any architecture: AutoModel loads the base model of an encoder, a causal LM or a classifier alike,
# and the last hidden states are what is pooled (every name ends with "").
ENCODER = ModelHead("a model transformers' AutoModel loads", ("",), "AutoModel")


@dataclass
class Embedder:
    """A loaded embedding model: :meth:`cosine` of pairs of texts."""

    model: torch.nn.Module
    tokenizer: Any
    device: torch.device
    max_length: int

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, hidden) float32 mean-pooled embeddings, and (N,) whether each text had a token."""
        vectors, present = [], []
        for start in range(0, len(texts), BATCH_SIZE):
            batch = self.tokenizer(texts[start:start + BATCH_SIZE], return_tensors="pt", padding=True,
                                   truncation=True, max_length=self.max_length)
            mask = batch["attention_mask"]
            if mask.shape[1] == 0:  # no text of the batch has a token: nothing to run
                hidden_size = self.model.config.hidden_size
                vectors.append(torch.zeros(mask.shape[0], hidden_size))
                present.append(torch.zeros(mask.shape[0], dtype=torch.bool))
                continue
            hidden = self.model(**batch.to(self.device)).last_hidden_state.float()
            weights = mask.to(hidden.device).unsqueeze(-1).float()
            counts = weights.sum(dim=1)
            vectors.append(((hidden * weights).sum(dim=1) / counts.clamp(min=1.0)).cpu())
            present.append(counts.squeeze(-1).cpu() > 0)
        return torch.cat(vectors), torch.cat(present)

    def cosine(self, texts: list[str], references: list[str]) -> list[float | None]:
        """Each text's cosine with its reference, clipped to [0, 1]; None where either had no token."""
        if not texts:
            return []
        # One pass over the distinct texts: a group's completions often share their reference.
        distinct = list(dict.fromkeys([*texts, *references]))
        position = {text: index for index, text in enumerate(distinct)}
        vectors, present = self.embed(distinct)
        a = vectors[[position[text] for text in texts]]
        b = vectors[[position[text] for text in references]]
        cosines = torch.nn.functional.cosine_similarity(a, b, dim=-1).clamp(0.0, 1.0).tolist()
        return [value if present[position[text]] and present[position[ref]] else None
                for value, text, ref in zip(cosines, texts, references, strict=True)]


def _max_length(tokenizer: Any, config: Any) -> int:
    # A tokenizer without a limit reports a huge sentinel; a model's positions are a hard limit.
    limits = [MAX_TOKENS, getattr(tokenizer, "model_max_length", None),
              getattr(config, "max_position_embeddings", None)]
    return min(int(limit) for limit in limits if isinstance(limit, int | float) and limit > 0)


def load_embedder(source: str, context: RewardContext) -> Embedder:
    """Load the model named by ``source`` (a ``path:``/``hf:`` source, a ``file:`` one the worker
    rewrote) once, on this job's device and in its dtype."""
    loaded = load_frozen_model(source, context, ENCODER, FIELD)
    tokenizer = loaded.tokenizer
    tokenizer.padding_side, tokenizer.truncation_side = "right", "right"
    return Embedder(loaded.model, tokenizer, loaded.device, _max_length(tokenizer, loaded.model.config))
