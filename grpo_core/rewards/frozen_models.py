"""Loading a model a reward scores with (torch): ``reward_model``'s sequence classifier and the
judge of ``score_model``/``label_model``, the same way.

Both name their model in an args field (``model``) with the sources a policy's ``model.source``
takes in the core (``path:``, ``hf:``; the service has rewritten a ``file:`` upload or a ``job:``
model to a ``path:`` under the root it gives), so the source is resolved like one, errors named at
that field. The folder's config is read first and its architecture checked against the head the
reward needs: transformers would otherwise load a causal LM as a classifier (or the reverse) with a
freshly initialised head and only a warning, and the reward would score with random weights. The model is
loaded once, when the job binds its rewards, on this rank's device in the job's dtype, in eval
mode with no gradients: a reward model is never trained, and every rank of a multi-GPU job holds
its own copy and scores its own rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_core.errors import SpecError
from grpo_core.io.model_loading import DTYPES, load_pretrained, load_tokenizer, resolve_source_location
from grpo_core.rewards.reward_types import RewardContext

__all__ = ["CAUSAL_LM", "SEQUENCE_CLASSIFIER", "FrozenModel", "ModelHead", "load_frozen_model"]


@dataclass(frozen=True)
class ModelHead:
    """What a reward needs its model to be: named in errors (``what``), recognised by the
    architectures a folder's config lists (``suffixes``), loaded by a transformers auto class."""

    what: str
    suffixes: tuple[str, ...]
    auto_class: str


SEQUENCE_CLASSIFIER = ModelHead("a sequence classifier", ("ForSequenceClassification",),
                                "AutoModelForSequenceClassification")
# GPT-2's family names its causal LM *LMHeadModel; multimodal families that also generate text
# name theirs *ForConditionalGeneration (the auto class refuses those it cannot load as a causal LM).
CAUSAL_LM = ModelHead("a causal language model", ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"),
                      "AutoModelForCausalLM")


@dataclass
class FrozenModel:
    """A loaded model on its device, with its tokenizer (left padding, EOS as pad when it has none)."""

    model: torch.nn.Module
    tokenizer: Any
    device: torch.device
    location: str


def _load_model(location: str, dtype: str, head: ModelHead, field: str) -> torch.nn.Module:
    import transformers

    config = load_pretrained(location, "a model config from", lambda name, revision: (
        transformers.AutoConfig.from_pretrained(name, revision=revision)),
        f"could not read the config of '{location}'", field)
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(a.endswith(head.suffixes) for a in architectures):
        # Loading it with the other head would succeed, with that head random.
        raise SpecError(field, f"'{location}' holds a {architectures[0]}, not {head.what}")
    auto_class = getattr(transformers, head.auto_class)
    return load_pretrained(location, f"{head.what} from",
                           lambda name, revision: auto_class.from_pretrained(
                               name, revision=revision, dtype=DTYPES[dtype]),
                           f"'{location}' does not hold {head.what}", field)


def load_frozen_model(source: str, context: RewardContext, head: ModelHead, field: str = "model",
                      check_tokenizer: Callable[[Any], None] | None = None) -> FrozenModel:
    """Resolve ``source`` (under ``context.models_root``, else relative to ``context.base_dir``),
    load its tokenizer (``check_tokenizer`` may refuse it with a SpecError), then the model (a
    SpecError at ``field`` for anything unusable, a SourceUnavailable for a folder gone), frozen,
    on ``context.device`` in ``context.dtype``."""
    location = resolve_source_location(source, context.models_root, context.base_dir, field)
    # The tokenizer first: a folder that cannot be used fails before its weights are read.
    tokenizer = load_tokenizer(location, field)
    if check_tokenizer is not None:
        check_tokenizer(tokenizer)
    model = _load_model(location, context.dtype, head, field)
    device = torch.device(context.device or "cpu")
    model.requires_grad_(False)
    return FrozenModel(model.to(device).eval(), tokenizer, device, location)
