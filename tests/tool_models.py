"""A tiny model that uses a tool, for the tests of multi-turn episodes (core and service): the
tiny random-init model with ``<tool_call>``/``</tool_call>`` added as tokens, fitted by a few
hundred steps of supervised training to write :data:`CALL` to the ``add`` tool of :data:`TOOLS`
at its first turn and, once the result is back, to answer "5". Greedy decoding then takes that
path; sampling mostly does. Nothing is downloaded."""

from __future__ import annotations

import copy
from pathlib import Path

from grpo_core.agents.rendering import Conversations
from grpo_core.spec.tool_schemas import tool_set

TOOLS = '''
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b
'''
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
QUESTIONS = ["What is 2+3?", "Add 2 and 3."]


def prompt_texts(conversations: Conversations) -> list[str]:
    return [conversations.prompt_text([{"role": "user", "content": question}]) for question in QUESTIONS]


class Script:
    """What the tuned model writes: :data:`CALL` at its first turn, then the answer."""

    def __init__(self, tokenizer) -> None:
        eos = tokenizer.eos_token_id
        self.call = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [eos]
        self.answer = tokenizer("5", add_special_tokens=False)["input_ids"] + [eos]


def with_tool_tokens(folder: Path):
    """``(model, tokenizer)``: the tiny model, its tokenizer holding the tool-call tags as tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.io.tiny_models import build_tiny_model

    build_tiny_model(folder, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])  # one token each, as in Qwen's vocabulary
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    return model.eval(), tokenizer


def tuned_to_call(model, tokenizer, steps: int = 150):
    """A copy of ``model`` fitted to the script, in the context of the prompts as rendered."""
    import torch  # here: the API's tests take TOOLS from this module without loading torch

    model = copy.deepcopy(model).train()
    script = Script(tokenizer)
    conversations = Conversations(tokenizer, tool_set([TOOLS]))
    observation = conversations.observation_ids(conversations.tool_messages([("add", "5")]), chat=True)
    completion = script.call + observation + script.answer
    rows = [(tokenizer(text, add_special_tokens=False)["input_ids"], completion)
            for text in prompt_texts(conversations)]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        for prompt, completion in rows:  # the completion learned, in the prompt's context
            ids = torch.tensor([prompt + completion])
            labels = torch.tensor([[-100] * len(prompt) + completion])
            model(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.eval(), tokenizer


def save_tool_user(folder: Path, scratch: Path) -> Path:
    """The tuned model and its tokenizer saved as a model folder (a job's ``path:`` source)."""
    model, tokenizer = tuned_to_call(*with_tool_tokens(scratch))
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
