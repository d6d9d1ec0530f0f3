"""One chat or completion request to a served model and what comes back, in OpenAI's terms.

Torch-free, so the process that takes a request in (an API route, a worker's queue reader) can
check it and refuse a bad one before anything reaches the model's process; the engine
(:mod:`grpo_core.serving.engine`) only ever sees requests that passed these checks. Every
refusal is a ``ValueError`` whose message starts with the field's name (``temperature: ...``,
``messages[2].role: ...``), so a caller can answer OpenAI's ``param`` without parsing prose.

What is not here, on purpose: ``n`` (several choices are several requests: the caller fans out
and joins), ``stream`` and ``model`` (the caller's: the engine always streams, and serves the one
model it holds). :func:`parse_request` reads an OpenAI body's own fields and leaves every other
key to the caller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant")
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class SamplingParams:
    """How a request's tokens are chosen and when its completion ends.

    ``temperature`` 0 is greedy (argmax; ``top_p`` and ``seed`` then change nothing). ``stop``:
    the completion ends before the first occurrence of any of these strings, which is not part
    of its text. ``seed``: the request's draws are a function of the seed and its token index
    only, never of the other requests sharing the batch; None draws a fresh key."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_params(
    *,
    default_max_tokens: int,
    max_tokens_limit: int,
    max_tokens: Any = None,
    temperature: Any = None,
    top_p: Any = None,
    stop: Any = None,
    seed: Any = None,
) -> SamplingParams:
    """Checked :class:`SamplingParams` from values as a JSON body gives them (None: not given).

    ``default_max_tokens`` and ``max_tokens_limit`` are the caller's (a deployment's setting, the
    model's positions): a request that names no ``max_tokens`` gets the default, one that asks
    for more than the limit is refused rather than silently cut."""
    if not _is_int(max_tokens_limit) or max_tokens_limit < 1:
        raise ValueError(f"max_tokens_limit: must be a positive integer, got {max_tokens_limit!r}")
    if not _is_int(default_max_tokens) or not 1 <= default_max_tokens <= max_tokens_limit:
        raise ValueError(f"default_max_tokens: must be an integer in [1, {max_tokens_limit}], "
                         f"got {default_max_tokens!r}")
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not _is_int(max_tokens) or not 1 <= max_tokens <= max_tokens_limit:
        raise ValueError(f"max_tokens: must be an integer in [1, {max_tokens_limit}], got {max_tokens!r}")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number("temperature", 1.0 if temperature is None else temperature, 0.0, MAX_TEMPERATURE),
        top_p=_number("top_p", 1.0 if top_p is None else top_p, 0.0, 1.0),
        stop=_stop_strings(stop),
        seed=_seed(seed),
    )


@dataclass(frozen=True)
class GenerationRequest:
    """A chat (``messages``) or a plain completion (``prompt``): exactly one of the two.

    ``messages`` are rendered by the tokenizer's chat template with the generation prompt added;
    a ``developer`` message is rendered as ``system`` (OpenAI's newer name for it, which chat
    templates do not know). ``prompt`` is tokenized as it is, no special tokens added."""

    params: SamplingParams
    messages: tuple[Mapping[str, str], ...] | None = None
    prompt: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            raise ValueError("params: must be SamplingParams (see sampling_params)")
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("messages: give either messages (a chat) or prompt (a completion), not both"
                             if self.messages is not None else
                             "messages: give either messages (a chat) or prompt (a completion)")
        if self.messages is not None:
            # Frozen: the checked copy replaces what was given, so a caller's later edit of its
            # own list cannot change a request already accepted.
            object.__setattr__(self, "messages", _checked_messages(self.messages))
        elif not isinstance(self.prompt, str) or not self.prompt:
            raise ValueError("prompt: must be a non-empty string")

    @property
    def field(self) -> str:
        """The body field the request's text came from, for errors about it."""
        return "messages" if self.messages is not None else "prompt"

    def template_messages(self) -> list[dict[str, str]]:
        """The messages as the chat template gets them (``developer`` as ``system``)."""
        assert self.messages is not None
        return [{"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]}
                for m in self.messages]


def parse_request(
    body: Mapping[str, Any], *, default_max_tokens: int, max_tokens_limit: int
) -> GenerationRequest:
    """A request from an OpenAI chat-completions or completions body (``messages`` or ``prompt``,
    ``max_tokens`` or chat's newer ``max_completion_tokens``, ``temperature``, ``top_p``, ``stop``,
    ``seed``); other keys are the caller's and are not looked at."""
    if not isinstance(body, Mapping):
        raise ValueError("body: must be a JSON object")
    max_tokens = body.get("max_tokens")
    newer = body.get("max_completion_tokens")
    if max_tokens is not None and newer is not None and max_tokens != newer:
        raise ValueError("max_completion_tokens: differs from max_tokens; give one of the two")
    params = sampling_params(
        default_max_tokens=default_max_tokens, max_tokens_limit=max_tokens_limit,
        max_tokens=newer if max_tokens is None else max_tokens,
        temperature=body.get("temperature"), top_p=body.get("top_p"), stop=body.get("stop"),
        seed=body.get("seed"),
    )
    messages, prompt = body.get("messages"), body.get("prompt")
    if messages is not None and not isinstance(messages, list | tuple):
        raise ValueError("messages: must be a list of messages")
    return GenerationRequest(params, messages=None if messages is None else tuple(messages), prompt=prompt)


@dataclass(frozen=True)
class Usage:
    """Tokens a request cost: its rendered prompt, and every token sampled for it (an EOS and
    the tokens that spelled a stop string included: the model computed them)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# A request's events, in order: any number of TextDelta, then exactly one final event.


@dataclass(frozen=True)
class TextDelta:
    """More of the completion's text: whole characters only, never the start of a stop string
    that may yet complete."""

    text: str
    final = False


@dataclass(frozen=True)
class Finished:
    """The completion ended: ``stop`` (an EOS token or a stop string) or ``length`` (max_tokens,
    or the model's positions ran out)."""

    finish_reason: str
    usage: Usage
    final = True


@dataclass(frozen=True)
class Cancelled:
    """The request was cancelled (its client went away) and left the batch; ``usage`` is what
    it had cost by then."""

    usage: Usage
    final = True


@dataclass(frozen=True)
class Failed:
    """The request could not be served: a ``ValueError`` naming the field for a request the model
    cannot take (a prompt longer than its positions), otherwise the error that stopped the batch."""

    error: Exception = field(compare=False)
    final = True


Event = TextDelta | Finished | Cancelled | Failed


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a number in [{low:g}, {high:g}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}: must be in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    strings = [stop] if isinstance(stop, str) else stop
    if not isinstance(strings, list | tuple) or len(strings) > MAX_STOP_STRINGS:
        raise ValueError(f"stop: must be a string or a list of at most {MAX_STOP_STRINGS} strings")
    for index, text in enumerate(strings):
        if not isinstance(text, str) or not text:
            raise ValueError(f"stop[{index}]: must be a non-empty string, got {text!r}")
    return tuple(strings)


def _seed(seed: Any) -> int | None:
    if seed is None:
        return None
    # OpenAI's seed is a 64-bit integer; the engine folds it into its counter-based draws.
    if not _is_int(seed) or not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed: must be a 64-bit integer, got {seed!r}")
    return seed


def _checked_messages(messages: Sequence[Any]) -> tuple[Mapping[str, str], ...]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages: must be a non-empty list of messages")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where}: must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"{where}.role: must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"{where}.content: must be a string")
        checked.append({"role": role, "content": content})
    return tuple(checked)
