"""The judge of ``score_model`` and ``label_model`` (torch; see :mod:`grpo_core.rewards.judge_args`):
loaded once per bind, run over each call's rows in batches, its answers read as scores.

**Input.** For each row, every message of ``input`` is rendered with the row's ``sample`` (the
completion's answer, its JSON, a multi-turn episode's messages) and ``item`` (the dataset's
columns, ``prompt`` as the dataset gave it), then the conversation goes through the judge's chat
template with the generation prompt, tokenized without adding special tokens (the template writes
those the model expects), as TRL tokenizes a chat prompt. ``developer`` messages are given as
``system``. A row whose template reads a key it lacks, or whose input with the answer's room
passes the judge's positions, is unscored with that reason; nothing is cut from an input (a cut
instruction would be a different question).

**Decoding.** Exactly the grader's ``sampling_params`` (greedy unless ``temperature`` > 0; no
top-k, no repetition penalty): the folder's ``generation_config.json`` keeps only its token ids,
since a model's suggested decoding (top_k 20, a penalty, beams) is not what the grader asked for.
Rows are generated ``batch_size`` at a time, left-padded, the shortest inputs first so that a
budget that runs out leaves the fewest rows unscored; greedy decoding of identical inputs (a group's
identical answers) runs once. Sampling draws from random streams forked for the call (seeded by
``seed`` when given) and restored after, so the training's own draws do not depend on the judge.

**Budget.** The call stops at ``context.own_budget_seconds()``: no batch starts after it, and a
batch under way stops at its next token; rows not reached, and rows of a stopped batch that had not
finished their answer, are unscored ("not reached"), as ``python``'s rows are.

**Reading the answer** (the whole decoded text, special tokens skipped):

- ``score_model``: the ``result`` of a JSON object in the answer (OpenAI's score model answers
  ``{"steps": [...], "result": 0.8}``), else its ``score``; the last such object when there are
  several. Without one, the last number in the text (``8``, ``-0.5``, ``1e-3``; a sign counts
  only when no letter or digit comes right before it). A score below ``range``'s min or above its
  max, or no number at all, leaves the row unscored. Scores are returned as they are.
- ``label_model``: the ``result`` of a JSON object in the answer when it is a label; else the
  whole answer with the quotes, punctuation and spaces around it stripped, when it is a label;
  else the label that occurs first as a whole word (the longer one where two start at the same
  place). Labels match without regard to case. A passing label scores 1.0, another 0.0, no label
  leaves the row unscored.

Unscored rows come back with why (:class:`JudgedRows`), so the step's ``reward_unscored``
warning quotes the judge's answer that could not be read.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from grpo_core.errors import SpecError
from grpo_core.rewards.frozen_models import CAUSAL_LM, load_frozen_model
from grpo_core.rewards.grader_rows import grader_rows
from grpo_core.rewards.reward_types import RewardContext
from grpo_core.rewards.scoring import PartlyScored
from grpo_core.rewards.templates import MissingValue, render

__all__ = [
    "Decoding", "Judge", "JudgedRows", "label_verdict", "load_judge", "parse_label", "parse_score",
    "score_verdict",
]

FIELD = "model"  # bind_rewards prefixes rewards.N.args.
_QUOTED_CHARS = 200  # of a judge's answer quoted in a row's problem
_ROLES = {"developer": "system"}
# A number: digits with an optional fraction and exponent; a sign only where no word or number
# runs into it ("3-4" is 3 then 4, not 3 then -4).
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# Around a bare label: quotes, punctuation, Markdown emphasis and spaces ("**Yes.**", "'no'").
_LABEL_EDGES = " \t\r\n\"'`\u2018\u2019\u201c\u201d.,;:!?()[]{}<>*_"

Verdict = Callable[[str], tuple[float | None, str | None]]


class JudgedRows(PartlyScored):
    """The scores (None for unscored rows) and why each unscored row is (index -> message)."""

    def __init__(self, values: list[float | None], problems: dict[int, str]) -> None:
        super().__init__(values, len(problems))
        self.problems = problems


def _quoted(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS] + "…")


def _json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``text`` that is not inside another, in order (fenced or bare)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            found, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(found, dict):
            yield found
        start = text.find("{", end)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past a float: no usable score
        return math.inf


def parse_score(text: str, low: float, high: float) -> tuple[float | None, str | None]:
    """The score in a judge's answer and, when there is none, why (module docstring)."""
    score = None
    for found in _json_objects(text):
        value = _number(found.get("result"))
        value = _number(found.get("score")) if value is None else value
        score = value if value is not None else score
    if score is None:
        numbers = _NUMBER.findall(text)
        if not numbers:
            return None, f"the judge's answer holds no score: {_quoted(text)}"
        score = float(numbers[-1])  # "1e999" reads as inf, refused below
    if not (math.isfinite(score) and low <= score <= high):
        return None, f"the judge scored {score:g}, outside the range [{low:g}, {high:g}]: {_quoted(text)}"
    return score, None


def parse_label(text: str, labels: list[str]) -> str | None:
    """The label a judge's answer gives (as spelled in ``labels``), or None (module docstring)."""
    by_key = {label.strip().casefold(): label for label in labels}
    for found in reversed(list(_json_objects(text))):
        result = found.get("result")
        if isinstance(result, str) and result.strip(_LABEL_EDGES).casefold() in by_key:
            return by_key[result.strip(_LABEL_EDGES).casefold()]
    bare = text.strip(_LABEL_EDGES).casefold()
    if bare in by_key:
        return by_key[bare]
    first: tuple[int, int, str] | None = None  # (where, -length, label): the earliest, then the longest
    for label in labels:
        match = re.search(rf"(?<!\w){re.escape(label.strip())}(?!\w)", text, re.IGNORECASE)
        if match is not None:
            candidate = (match.start(), -len(label.strip()), label)
            first = candidate if first is None or candidate < first else first
    return None if first is None else first[2]


def score_verdict(low: float, high: float) -> Verdict:
    """``score_model``'s reading: the score and, for an unscored row, why."""
    return lambda text: parse_score(text, low, high)


def label_verdict(labels: list[str], passing_labels: list[str]) -> Verdict:
    """``label_model``'s reading: 1.0 for a passing label, 0.0 for another, else None and why."""
    passing = set(passing_labels)

    def verdict(text: str) -> tuple[float | None, str | None]:
        label = parse_label(text, labels)
        if label is None:
            return None, f"the judge's answer is none of the labels: {_quoted(text)}"
        return (1.0 if label in passing else 0.0), None

    return verdict


class _Deadline(StoppingCriteria):
    """Stops every row of a batch once the call's budget is spent."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                 **kwargs: Any) -> torch.BoolTensor:
        spent = time.monotonic() >= self.deadline
        return torch.full((input_ids.shape[0],), spent, dtype=torch.bool, device=input_ids.device)


@dataclass(frozen=True)
class Decoding:
    """How the judge writes its answer: greedy when ``temperature`` is 0, else sampled with
    ``top_p`` (and ``seed``); at most ``max_tokens``."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Judge:
    """A loaded judge, called as a reward function (see the module's docstring)."""

    model: torch.nn.Module
    tokenizer: Any
    device: torch.device
    messages: list[tuple[str, str]]  # (role, template), as the grader wrote them
    decoding: Decoding
    generation: GenerationConfig
    eos_ids: frozenset[int]
    batch_size: int
    verdict: Verdict
    budget_seconds: float | None = None
    max_positions: int | None = None

    def __call__(self, completions: list[str], prompts: list[str], **columns: Any) -> JudgedRows:
        deadline = None if self.budget_seconds is None else time.monotonic() + self.budget_seconds
        problems: dict[int, str] = {}
        inputs: dict[int, list[int]] = {}
        for index, row in enumerate(grader_rows(completions, prompts, columns)):
            try:
                ids = self.encode([{"role": _ROLES.get(role, role),
                                    "content": render(template, row["sample"], row["item"])}
                                   for role, template in self.messages])
            except MissingValue as exc:
                problems[index] = f"the judge's input cannot be written: {exc}"
                continue
            room = len(ids) + self.decoding.max_tokens
            if self.max_positions is not None and room > self.max_positions:
                problems[index] = (f"the judge's input is {len(ids)} tokens: with {self.decoding.max_tokens} "
                                   f"for its answer, past the judge's {self.max_positions} positions")
                continue
            inputs[index] = ids
        answers = self.answers(inputs, deadline)
        values: list[float | None] = [None] * len(completions)
        for index in inputs:
            answer = answers.get(index)
            if answer is None:
                problems[index] = "not reached: the judge ran out of the reward's time budget"
                continue
            values[index], problem = self.verdict(answer)
            if problem is not None:
                problems[index] = problem
        return JudgedRows(values, problems)

    def encode(self, conversation: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def answers(self, inputs: dict[int, list[int]], deadline: float | None = None) -> dict[int, str]:
        """The judge's answer to each input by row; a row missing was not reached in time."""
        units: dict[Any, tuple[list[int], list[int]]] = {}  # key -> (input ids, its rows)
        for index, ids in inputs.items():
            # Greedy decoding answers an input the same every time: identical ones run once.
            key = tuple(ids) if self.decoding.greedy else index
            units.setdefault(key, (ids, []))[1].append(index)
        ordered = sorted(units.values(), key=lambda unit: len(unit[0]))
        found: dict[int, str] = {}
        with self._own_random_streams():
            for start in range(0, len(ordered), self.batch_size):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                batch = ordered[start:start + self.batch_size]
                for (_, rows), answer in zip(batch, self.generate([ids for ids, _ in batch], deadline),
                                             strict=True):
                    if answer is not None:
                        found.update(dict.fromkeys(rows, answer))
        return found

    @torch.inference_mode()
    def generate(self, batch: list[list[int]], deadline: float | None = None) -> list[str | None]:
        """The decoded answer to each input of one batch; None for one a deadline cut short."""
        # Padded on the left, so every row's answer starts right after its input.
        width, pad = max(map(len, batch)), self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=self.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=self.device)
        stopping = StoppingCriteriaList([_Deadline(deadline)]) if deadline is not None else None
        out = self.model.generate(input_ids=input_ids, attention_mask=mask, generation_config=self.generation,
                                  stopping_criteria=stopping)
        answers: list[str | None] = []
        for row in out[:, input_ids.shape[1]:].tolist():
            end = next((i for i, token in enumerate(row) if token in self.eos_ids), None)
            if end is None and len(row) < self.decoding.max_tokens:
                answers.append(None)  # neither ended nor at its length: the deadline stopped it
                continue
            answers.append(self.tokenizer.decode(row[:end], skip_special_tokens=True))
        return answers

    @contextlib.contextmanager
    def _own_random_streams(self) -> Iterator[None]:
        """Sampling draws from streams forked for this call, restored after: the policy's
        sampling draws stay what they would be without a judge."""
        if self.decoding.greedy:
            yield
            return
        cuda = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self.device] if cuda else []):
            if self.decoding.seed is not None:
                # This device's streams only: fork_rng restores no other (torch.manual_seed seeds all).
                torch.random.default_generator.manual_seed(self.decoding.seed)
                if cuda:
                    with torch.cuda.device(self.device):
                        torch.cuda.manual_seed(self.decoding.seed)
            yield


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> frozenset[int]:
    """Where the judge's answer ends: the folder's generation EOS ids (chat models list their
    end-of-turn token there), else the tokenizer's EOS."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = tokenizer.eos_token_id
    ids = configured if isinstance(configured, list | tuple) else [configured]
    return frozenset(int(i) for i in ids if i is not None)


def _generation_config(decoding: Decoding, eos: frozenset[int], pad: int) -> GenerationConfig:
    chosen: dict[str, Any] = {"do_sample": False}
    if not decoding.greedy:
        # top_k 0: no top-k cut, which OpenAI's sampling has not (transformers' default is 50).
        chosen = {"do_sample": True, "temperature": decoding.temperature, "top_p": decoding.top_p, "top_k": 0}
    return GenerationConfig(max_new_tokens=decoding.max_tokens, eos_token_id=sorted(eos), pad_token_id=pad,
                            repetition_penalty=1.0, num_beams=1, **chosen)


def _has_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise SpecError(FIELD, "the judge's tokenizer has no chat template: it reads the input messages "
                               "through one (use a chat or instruct model)")


def load_judge(source: str, messages: list[tuple[str, str]], decoding: Decoding, batch_size: int,
               verdict: Verdict, context: RewardContext) -> Judge:
    """Load the judge named by ``source`` once (this job's device and dtype) and return the reward
    function: ``messages`` (role, template) templated per row, answered as ``decoding`` says, read
    by ``verdict``. Takes plain values, not the args models, so that the args module imports this
    one (lazily, on the worker) and not the reverse."""
    loaded = load_frozen_model(source, context, CAUSAL_LM, FIELD, check_tokenizer=_has_chat_template)
    model, tokenizer = loaded.model, loaded.tokenizer
    eos = _eos_ids(model, tokenizer)
    # Only the folder's token ids are kept of its generation config: its decoding is not ours.
    bos = getattr(model.generation_config, "bos_token_id", None)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=sorted(eos),
                                               pad_token_id=tokenizer.pad_token_id)
    generation = _generation_config(decoding, eos, tokenizer.pad_token_id)
    positions = getattr(model.config, "max_position_embeddings", None)
    return Judge(model, tokenizer, loaded.device, list(messages), decoding, generation, eos, batch_size,
                 verdict, context.own_budget_seconds(), positions)
