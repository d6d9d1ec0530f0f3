"""What OpenAI-style graders see of one scored row: ``sample`` (what the model produced) and
``item`` (the dataset's row).

One definition for every grader that speaks OpenAI's terms, the ``python`` reward's
``grade(sample, item)`` and the templates of ``string_check``, ``text_similarity`` and ``multi``,
so ``{{item.answer}}`` in a template and ``item["answer"]`` in a grader's source always read the
same value:

- ``sample``: ``output_text`` (the completion's answer, reasoning parsed off), ``output_json``
  (that text as JSON, or null; :func:`grpo_core.rewards.templates.sample_of`) and, for a
  multi-turn episode, ``messages`` (every turn after the prompt and what answered it);
- ``item``: the dataset's columns by name, without what the scorer adds for every reward
  (``raw_completions``...), and ``prompt`` as the dataset gave it: chat messages where it had
  them, else the text. So ``prompt`` is always there, whatever the dataset's prompt field is named.
"""

from __future__ import annotations

from typing import Any

from grpo_core.rewards.scoring import SCORER_COLUMNS
from grpo_core.rewards.templates import item_columns, sample_of

__all__ = ["ALWAYS_IN_ITEM", "grader_rows", "template_columns"]

ALWAYS_IN_ITEM = frozenset({"prompt"})  # not a column a reward needs declared: every item has it


def template_columns(*templates: str) -> list[str]:
    """The dataset columns ``templates`` read (``{{item.COLUMN}}``), but ``prompt``, which every
    item has: what a reward built on them declares as its ``required_columns``."""
    return [column for column in item_columns(*templates) if column not in ALWAYS_IN_ITEM]


def grader_rows(completions: list[str], prompts: list[str],
                columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """``{"sample": ..., "item": ...}`` for each completion, from a reward function's arguments."""
    messages = columns.get("prompt_messages") or [None] * len(completions)
    conversations = columns.get("completion_messages") or [None] * len(completions)
    row_columns = {name: values for name, values in columns.items() if name not in SCORER_COLUMNS}
    rows = []
    for index, text in enumerate(completions):
        item = {name: values[index] for name, values in row_columns.items()}
        item["prompt"] = messages[index] if messages[index] is not None else prompts[index]
        rows.append({"sample": sample_of(text, conversations[index]), "item": item})
    return rows
