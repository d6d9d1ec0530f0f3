"""OpenAI's chat completions and (legacy) completions, as this service serves them from a job's
model (``POST /v1/chat/completions``, ``POST /v1/completions``): the request bodies and the
``chat.completion``, ``chat.completion.chunk`` and ``text_completion`` objects, in OpenAI's field
names so its clients work unchanged.

A body field this service does not do (tools, logprobs, response formats, penalties...) is a 422
naming it, unless it holds its neutral value (``n: 1``, ``logprobs: false``, a penalty of 0);
:func:`unsupported_field` says which. Pure pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Chat and completion bodies carry these OpenAI fields, which this service does not implement: each
# maps to the values that ask for nothing (accepted as if absent).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0), "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "tools": (None, []),
    "tool_choice": (None, "none"), "parallel_tool_calls": (None,), "functions": (None, []),
    "function_call": (None, "none"), "response_format": (None, {"type": "text"}), "echo": (None, False),
    "best_of": (None, 1), "suffix": (None, ""), "modalities": (None, ["text"]), "audio": (None,),
    "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,),
    "service_tier": (None, "auto", "default"), "store": (None, False), "metadata": (None, {}),
    "verbosity": (None,), "prompt_cache_key": (None,), "safety_identifier": (None,),
}
MAX_MESSAGES = 1024
MODEL_DESCRIPTION = ("The model: a job's `fine_tuned_model` (`job:ID`: its final model, else its newest "
                     "checkpoint) or `job:ID@STEP` (that checkpoint); a job of your team")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"] = Field(
        description="Who says it; `developer` is read as `system`")
    content: str | list[TextPart] = Field(description="The text, or text parts (joined)")
    name: str | None = Field(None, max_length=64, description="Accepted and ignored")

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: bool = Field(False, description="A last chunk with `usage` and no choices")
    include_obfuscation: bool | None = Field(None, description="Accepted and ignored")


class _Generation(_Body):
    """The fields both bodies share."""

    model: str = Field(..., min_length=1, max_length=64, description=MODEL_DESCRIPTION)
    stream: bool | None = Field(False, description="Server-sent events: `data: {chunk}` lines, then "
                                "`data: [DONE]`")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, description="The most tokens to generate "
                                   "(`GRPO_SERVE_MAX_TOKENS` at most)")
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False, description="0: greedy")
    top_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    stop: str | list[str] | None = Field(None, description="Up to 4 strings; the text ends before the "
                                         "first of them")
    seed: int | None = Field(None, description="Draws that depend on the seed and the token only, "
                             "whatever else shares the batch")
    user: str | None = Field(None, max_length=256, description="Accepted and ignored")
    # OpenAI's fields this service does not implement: their neutral values only (unsupported_field).
    n: int | None = Field(None, description="1 only: one choice per request")
    logprobs: Any = Field(None, description="Not supported: false or absent")
    top_logprobs: Any = None
    presence_penalty: Any = Field(None, description="Not supported: 0 or absent")
    frequency_penalty: Any = Field(None, description="Not supported: 0 or absent")
    logit_bias: Any = None
    service_tier: Any = None
    store: Any = None
    metadata: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None


class ChatCompletionRequest(_Generation):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(..., min_length=1, max_length=MAX_MESSAGES,
                                        description="The conversation, rendered by the model's chat template")
    max_completion_tokens: int | None = Field(None, ge=1, description="The same as max_tokens")
    tools: Any = Field(None, description="Not supported")
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = Field(None, description="Not supported: text only")
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    verbosity: Any = None


class CompletionRequest(_Generation):
    """``POST /v1/completions`` (OpenAI's legacy completions): a prompt continued as it is."""

    prompt: str | list[str] = Field(..., description="The text to continue (a list of one string too)")
    max_tokens: int | None = Field(16, ge=1, description="The most tokens to generate (16 unless given, as "
                                   "OpenAI's default)")
    echo: Any = Field(None, description="Not supported: false or absent")
    best_of: Any = None
    suffix: Any = None


def unsupported_field(body: BaseModel) -> str | None:
    """The first field of ``body`` given a value this service does not implement (n > 1, tools...)."""
    for name in sorted(body.model_fields_set):
        if name in _NEUTRAL and getattr(body, name) not in _NEUTRAL[name]:
            return name
    return None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str = Field(description="`chatcmpl-...`")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(description="Unix seconds")
    model: str = Field(description="The model as asked (`job:ID[@STEP]`)")
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = Field(None, description="The serving job (`job-N`)")


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(BaseModel):
    """A completion, or (streamed) one chunk of it: OpenAI's ``text_completion`` either way."""

    id: str = Field(description="`cmpl-...`")
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
