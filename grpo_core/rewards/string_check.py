"""``string_check``: OpenAI's string check grader, 1.0 or 0.0 from comparing two rendered templates.

Its args are OpenAI's grader object without ``type`` and ``name``, so a grader written for OpenAI
runs unchanged (:mod:`grpo_core.spec.openai_graders`): ``input`` (default
``{{sample.output_text}}``, the answer) and ``reference`` are templates
(:mod:`grpo_core.rewards.templates`) rendered for each row, then compared by ``operation``:

- ``eq``: equal, character for character (no stripping, case counts);
- ``ne``: not equal;
- ``like``: the reference occurs in the input, case counting;
- ``ilike``: the same with case ignored (``str.casefold``, so ``"STRASSE"`` holds ``"straße"``).

A template that reads a key the row lacks (or a null) leaves the row unscored (None), as the
templates define: the check cannot be made. That includes ``{{sample.output_json.KEY}}`` when the
answer is no JSON or lacks the key; pair it with ``json_valid`` (or a ``multi``) where malformed
answers should cost. The columns its templates read are declared, so a dataset without one is
refused before training.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_core.rewards.grader_rows import grader_rows, template_columns
from grpo_core.rewards.reward_types import RewardContext, RewardDefinition, RewardFn
from grpo_core.rewards.templates import MAX_TEMPLATE_CHARS, OUTPUT_TEXT, MissingValue, check_template, render

__all__ = ["STRING_CHECK", "StringCheckArgs"]

Operation = Literal["eq", "ne", "like", "ilike"]


class StringCheckArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str = Field(OUTPUT_TEXT, max_length=MAX_TEMPLATE_CHARS, description=(
        "Template of the text checked: {{sample.output_text}} (the answer), "
        "{{sample.output_json.KEY}}, {{item.COLUMN}}, with text around them."))
    reference: str = Field(..., max_length=MAX_TEMPLATE_CHARS, description=(
        "Template of the text it is checked against, e.g. {{item.answer}}."))
    operation: Operation = Field(..., description=(
        "eq: equal; ne: not equal; like: the reference occurs in the input; ilike: the same, "
        "case ignored."))

    @field_validator("input", "reference")
    @classmethod
    def _template(cls, value: str) -> str:
        return check_template(value)


def _check(operation: Operation, text: str, reference: str) -> bool:
    if operation == "eq":
        return text == reference
    if operation == "ne":
        return text != reference
    if operation == "like":
        return reference in text
    return reference.casefold() in text.casefold()


def _build(args: StringCheckArgs, context: RewardContext) -> RewardFn:
    def string_check(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
        scores: list[float | None] = []
        for row in grader_rows(completions, prompts, columns):
            try:
                text = render(args.input, row["sample"], row["item"])
                reference = render(args.reference, row["sample"], row["item"])
            except MissingValue:
                scores.append(None)
                continue
            scores.append(1.0 if _check(args.operation, text, reference) else 0.0)
        return scores

    return string_check


STRING_CHECK = RewardDefinition(
    "string_check",
    "OpenAI's string check: 1.0 when the rendered input template equals (eq), differs from (ne) or "
    "contains the rendered reference (like; ilike ignoring case), else 0.0.",
    StringCheckArgs,
    _build,
    required_columns=lambda args: template_columns(args.input, args.reference),
)
