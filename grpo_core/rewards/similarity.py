"""``text_similarity``: how close the answer is to a reference column, in [0, 1].

The metrics come from the libraries that define them, not from code of ours: rapidfuzz's
``fuzz.ratio`` (normalized Indel similarity of the characters), sacrebleu's sentence BLEU (with
``effective_order``, as sacrebleu advises for single sentences) and rouge-score's ROUGE-L F1.
A reference may be a string or a list of strings: BLEU scores against all of them at once (its
multi-reference form), the other two take the best match. A row without a reference is
unscorable (None).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grpo_core.rewards.columns import aligned_column
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn

__all__ = ["TEXT_SIMILARITY", "similarity_metric"]

Metric = Literal["fuzzy_ratio", "bleu", "rouge_l"]


class TextSimilarityArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reference_field: str = Field("answer", min_length=1, max_length=128,
                                 description="Dataset column with the reference text (or a list of them).")
    metric: Metric = Field("rouge_l", description="fuzzy_ratio: rapidfuzz's character similarity; "
                           "bleu: sacrebleu's sentence BLEU; rouge_l: rouge-score's ROUGE-L F1.")


def similarity_metric(metric: Metric) -> Callable[[str, list[str]], float]:
    """``score(text, references)`` in [0, 1] for ``metric``."""
    if metric == "fuzzy_ratio":
        from rapidfuzz import fuzz

        return lambda text, refs: max(fuzz.ratio(text, ref) for ref in refs) / 100.0
    if metric == "bleu":
        from sacrebleu.metrics import BLEU

        bleu = BLEU(effective_order=True)
        # sacrebleu's geometric mean can land a rounding error above 100 on an exact match.
        return lambda text, refs: min(1.0, bleu.sentence_score(text, refs).score / 100.0)
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    return lambda text, refs: max(scorer.score(ref, text)["rougeL"].fmeasure for ref in refs)


def _references(value: Any) -> list[str] | None:
    if value is None:
        return None
    refs = [str(v) for v in value if v is not None] if isinstance(value, list | tuple) else [str(value)]
    return refs or None


def _build(args: TextSimilarityArgs, context: RewardContext) -> RewardFn:
    score = similarity_metric(args.metric)

    def text_similarity(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        refs = aligned_column(columns, args.reference_field, len(completions))
        return [None if r is None else score(text, r)
                for text, r in zip(completions, map(_references, refs), strict=True)]

    return text_similarity


TEXT_SIMILARITY = RewardDefinition(
    "text_similarity",
    "Similarity of the answer to a reference column in [0, 1]: fuzzy ratio (rapidfuzz), sentence "
    "BLEU (sacrebleu) or ROUGE-L F1 (rouge-score).",
    TextSimilarityArgs,
    _build,
    required_columns=lambda args: [args.reference_field],
)
