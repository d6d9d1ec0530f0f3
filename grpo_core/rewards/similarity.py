"""``text_similarity``: how close the answer is to a reference, in [0, 1].

Two forms of args, one reward, so a grader written for OpenAI runs unchanged
(:mod:`grpo_core.spec.openai_graders`) and specs written before it keep scoring as they did:

- the column form: ``reference_field`` (a dataset column holding the reference, or a list of them)
  and ``metric`` (``fuzzy_ratio``, ``bleu``, ``rouge_l``);
- OpenAI's form: ``input`` (a template, default ``{{sample.output_text}}``), ``reference`` (a
  template, e.g. ``{{item.answer}}``) and ``evaluation_metric`` in OpenAI's names (``fuzzy_match``,
  ``bleu``, ``gleu``, ``meteor``, ``rouge_1`` to ``rouge_5``, ``rouge_l``, ``cosine``). A template
  reading a key the row lacks leaves the row unscored (:mod:`grpo_core.rewards.templates`).

A spec mixing the two is refused, naming the field: which one was meant cannot be guessed.

The metrics come from the libraries that define them, not from code of ours: rapidfuzz's
``fuzz.ratio`` (normalized Indel similarity of the characters, for ``fuzzy_ratio`` and
``fuzzy_match`` alike: OpenAI documents no other), sacrebleu's sentence BLEU (with
``effective_order``, as sacrebleu advises for single sentences), NLTK's sentence GLEU and METEOR
over sacrebleu's ``13a`` tokens (BLEU's own tokenization), rouge-score's ROUGE-N and ROUGE-L F1.
METEOR's third stage matches WordNet synonyms; NLTK reads WordNet from a corpus download this
service never makes, so it is given a WordNet with no synonyms: exact words and Porter stems are
matched, synonyms are not (a synonym scores as a different word). ``cosine`` embeds both texts
with a local model (``embedding_model``; :mod:`grpo_core.rewards.embedding_similarity`, loaded on
the worker only: this module stays torch-free for the API) and clips their cosine to [0, 1].

In the column form a reference may be a list of strings: BLEU scores against all of them at once
(its multi-reference form), the others take the best match. A row without a reference is
unscorable (None).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from grpo_core.rewards.columns import aligned_column
from grpo_core.rewards.grader_rows import grader_rows, template_columns
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn
from grpo_core.rewards.templates import MAX_TEMPLATE_CHARS, OUTPUT_TEXT, MissingValue, check_template, render
from grpo_core.spec.sources import reward_model_source

__all__ = ["TEXT_SIMILARITY", "TextSimilarityArgs", "similarity_metric"]

Metric = Literal["fuzzy_ratio", "bleu", "rouge_l"]
EvaluationMetric = Literal["fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3",
                           "rouge_4", "rouge_5", "rouge_l", "cosine"]
_COLUMN_FORM = ("reference_field", "metric")
_OPENAI_FORM = ("input", "reference", "evaluation_metric", "embedding_model")


def _located(field: str, message: str, value: Any) -> ValidationError:
    """A validation error on ``field`` itself, so a 422 names the field to fix, not the args."""
    error = PydanticCustomError("text_similarity_form", "{message}", {"message": message})
    return ValidationError.from_exception_data("TextSimilarityArgs",
                                               [InitErrorDetails(type=error, loc=(field,), input=value)])


class TextSimilarityArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reference_field: str = Field("answer", min_length=1, max_length=128, description=(
        "Column form: dataset column with the reference text (or a list of them)."))
    metric: Metric = Field("rouge_l", description=(
        "Column form: fuzzy_ratio: rapidfuzz's character similarity; bleu: sacrebleu's sentence "
        "BLEU; rouge_l: rouge-score's ROUGE-L F1."))
    input: str | None = Field(None, max_length=MAX_TEMPLATE_CHARS, description=(
        "OpenAI's form: template of the text scored; {{sample.output_text}} (the answer) when not given."))
    reference: str | None = Field(None, max_length=MAX_TEMPLATE_CHARS, description=(
        "OpenAI's form: template of the reference, e.g. {{item.answer}}."))
    evaluation_metric: EvaluationMetric | None = Field(None, description=(
        "OpenAI's form: fuzzy_match (rapidfuzz ratio), bleu, gleu, meteor (exact and stem matches, "
        "no synonyms), rouge_1..rouge_5 and rouge_l (F1), cosine (of embedding_model's mean-pooled "
        "embeddings, clipped to [0, 1])."))
    embedding_model: str | None = Field(None, min_length=1, max_length=1024, description=(
        "With evaluation_metric cosine: the embedding model, path:NAME (a Hugging Face folder under "
        "the models root), hf:owner/name where the hub is allowed, or in the service file:ID (an "
        "uploaded model) or job:ID[@STEP] (another job of the team's final model or checkpoint)."))

    @field_validator("input", "reference")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else check_template(value)

    @field_validator("embedding_model")
    @classmethod
    def _model_source(cls, value: str | None) -> str | None:
        # file: and job: sources are the service's to resolve
        return None if value is None else reward_model_source(value)

    @model_validator(mode="after")
    def _one_form(self) -> TextSimilarityArgs:
        column = [name for name in _COLUMN_FORM if name in self.model_fields_set]
        openai = [name for name in _OPENAI_FORM if getattr(self, name) is not None]
        if column and openai:
            raise _located(openai[0], (
                f"'{openai[0]}' is of OpenAI's form (input, reference, evaluation_metric) and "
                f"'{column[0]}' of the column form (reference_field, metric): use one form"),
                getattr(self, openai[0]))
        if not openai:
            return self
        for name in ("reference", "evaluation_metric"):
            if getattr(self, name) is None:
                raise _located(name, f"'{name}' is required in OpenAI's form (with {', '.join(openai)})",
                               None)
        if self.evaluation_metric == "cosine" and self.embedding_model is None:
            raise _located("embedding_model", "evaluation_metric 'cosine' needs 'embedding_model': a "
                           "local embedding model (path:NAME or file:ID) to embed both texts with", None)
        if self.evaluation_metric != "cosine" and self.embedding_model is not None:
            raise _located("embedding_model", "'embedding_model' is only read by evaluation_metric "
                           f"'cosine', not '{self.evaluation_metric}'", self.embedding_model)
        return self

    @property
    def openai_form(self) -> bool:
        return self.evaluation_metric is not None


class _NoSynonyms:
    """WordNet as METEOR's synonym stage reads it, with no synsets: the real one is a corpus
    download (see the module's docstring), so that stage matches nothing."""

    @staticmethod
    def synsets(word: str) -> list[Any]:
        return []


def _tokens() -> Callable[[str], list[str]]:
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenize = Tokenizer13a()
    return lambda text: tokenize(text).split()


def _rouge(metric: str) -> Callable[[str, list[str]], float]:
    from rouge_score import rouge_scorer

    kind = "rougeL" if metric == "rouge_l" else f"rouge{metric[-1]}"
    scorer = rouge_scorer.RougeScorer([kind])
    # rouge-score takes the target first, then the prediction.
    return lambda text, refs: max(scorer.score(ref, text)[kind].fmeasure for ref in refs)


def similarity_metric(metric: str) -> Callable[[str, list[str]], float]:
    """``score(text, references)`` in [0, 1] for ``metric`` (either form's name; ``cosine`` is
    not here: it needs a model, see :func:`_pairwise`)."""
    if metric in ("fuzzy_ratio", "fuzzy_match"):
        from rapidfuzz import fuzz

        return lambda text, refs: max(fuzz.ratio(text, ref) for ref in refs) / 100.0
    if metric == "bleu":
        from sacrebleu.metrics import BLEU

        bleu = BLEU(effective_order=True)
        # sacrebleu's geometric mean can land a rounding error above 100 on an exact match.
        return lambda text, refs: min(1.0, bleu.sentence_score(text, refs).score / 100.0)
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        tokens = _tokens()
        return lambda text, refs: sentence_gleu([tokens(ref) for ref in refs], tokens(text))
    if metric == "meteor":
        from nltk.translate.meteor_score import meteor_score

        tokens, wordnet = _tokens(), _NoSynonyms()
        return lambda text, refs: meteor_score([tokens(ref) for ref in refs], tokens(text), wordnet=wordnet)
    if metric.startswith("rouge_"):
        return _rouge(metric)
    raise ValueError(f"unknown metric '{metric}'")


def _references(value: Any) -> list[str] | None:
    if value is None:
        return None
    refs = [str(v) for v in value if v is not None] if isinstance(value, list | tuple) else [str(value)]
    return refs or None


def _build_column_form(args: TextSimilarityArgs) -> RewardFn:
    score = similarity_metric(args.metric)

    def text_similarity(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        refs = aligned_column(columns, args.reference_field, len(completions))
        return [None if r is None else score(text, r)
                for text, r in zip(completions, map(_references, refs), strict=True)]

    return text_similarity


Pairwise = Callable[[list[str], list[str]], list[float | None]]


def _pairwise(args: TextSimilarityArgs, context: RewardContext) -> Pairwise:
    """``scores(texts, references)``, one per pair: cosine embeds them all in batches."""
    if args.evaluation_metric == "cosine":
        # torch and transformers only here, on the worker: the web process never builds a reward.
        from grpo_core.rewards.embedding_similarity import load_embedder

        assert args.embedding_model is not None  # the args' validator requires it
        return load_embedder(args.embedding_model, context).cosine
    score = similarity_metric(str(args.evaluation_metric))
    return lambda texts, refs: [score(text, [ref]) for text, ref in zip(texts, refs, strict=True)]


def _build_openai_form(args: TextSimilarityArgs, context: RewardContext) -> RewardFn:
    scores_of = _pairwise(args, context)
    template = OUTPUT_TEXT if args.input is None else args.input
    reference = str(args.reference)

    def text_similarity(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        scored, texts, refs = [], [], []
        for index, row in enumerate(grader_rows(completions, prompts, columns)):
            try:
                text = render(template, row["sample"], row["item"])
                ref = render(reference, row["sample"], row["item"])
            except MissingValue:
                continue  # unscorable: the row lacks what a template reads
            scored.append(index)
            texts.append(text)
            refs.append(ref)
        out: list[float | None] = [None] * len(completions)
        for index, value in zip(scored, scores_of(texts, refs) if scored else [], strict=True):
            out[index] = value
        return out

    return text_similarity


def _build(args: TextSimilarityArgs, context: RewardContext) -> RewardFn:
    return _build_openai_form(args, context) if args.openai_form else _build_column_form(args)


def _model_sources(args: TextSimilarityArgs) -> dict[str, str]:
    return {} if args.embedding_model is None else {"embedding_model": args.embedding_model}


def _columns(args: TextSimilarityArgs) -> list[str]:
    if args.openai_form:
        return template_columns(OUTPUT_TEXT if args.input is None else args.input, str(args.reference))
    return [args.reference_field]


TEXT_SIMILARITY = RewardDefinition(
    "text_similarity",
    "Similarity of the answer to a reference in [0, 1]: a reference column with fuzzy ratio "
    "(rapidfuzz), sentence BLEU (sacrebleu) or ROUGE-L F1 (rouge-score), or OpenAI's grader form "
    "(input and reference templates; fuzzy_match, bleu, gleu, meteor, rouge_1..5, rouge_l, cosine).",
    TextSimilarityArgs,
    _build,
    required_columns=_columns,
    model_sources=_model_sources,
)
