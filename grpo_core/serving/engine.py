"""Many chat and completion requests answered at once by one loaded model: continuous batching,
a KV cache, and text streamed as it is sampled.

Why batch: a decode step of a small or mid-size model costs about the same for one row as for
sixteen (the weights are read once either way), so requests that decode together cost each a
fraction of decoding alone. Why *continuous*: chat requests arrive at any time and end at very
different lengths; a batch that waited for its slowest row, or that a new request had to wait
out, would leave its slots idle. So every :meth:`ServingEngine.step`:

1. drops the cancelled requests (their clients went away);
2. decodes one token for every running request, and a request that finishes (EOS, a stop string,
   ``max_tokens``, the model's positions) leaves the batch at once, freeing its slot;
3. admits waiting requests into the free slots: renders and tokenizes them, prefills them
   together and samples their first token, then joins them to the running batch.

The batch is the model's own forward with its own ``DynamicCache`` (through
:class:`grpo_core.algorithm.decoders.ModelForwardDecoder`, the rollout's decoder for any
architecture), left-padded with a 2-D attention mask and per-row positions: every row's tokens
end at the cache's last column. A joining group is prefilled on its own and its cache is
concatenated to the running one, both left-padded to the longer (padding is masked out, so each
row computes what it would alone, to float rounding); columns that are padding for every row are
trimmed when rows leave, so the cache stays as long as the longest live row. Caches that are not
plain per-layer tensors (sliding-window or linear-attention layers) cannot be padded and
concatenated that way: for them a join re-prefills every running row's context with the
newcomers (slower, equally exact). The rollout's :class:`~grpo_core.algorithm.decoders.LeanDecoder`
is not used: its preallocated cache is sized once for a fixed batch, which continuous batching
would have to rebuild at every join; that speed-up is future work.

Sampling reuses the rollout's: :func:`~grpo_core.algorithm.sampling.sample_next_token` (top-p,
temperature, inverse-CDF draws) and counter-based uniforms
(:mod:`grpo_core.algorithm.randomness`) keyed by the request's seed and token index, so a seeded
request draws the same tokens whichever requests share its batch.

Text: a request's tokens are decoded incrementally (:class:`_TextStream`): a delta holds whole
characters only (a multi-byte character split across tokens waits for its last byte) and never
the start of a stop string that could still complete (held back until it is known not to be
one), so a client never receives text it must take back. Special tokens are left out of the
text, and an EOS token is never decoded.

Threads: :meth:`ServingEngine.submit` and :meth:`RequestHandle.cancel` may be called from any
thread; :meth:`~ServingEngine.step` (and :meth:`~ServingEngine.run_until_idle`) from one driver
thread only, which is where the model, the tokenizer and every event callback run.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

from grpo_core.algorithm.decoders import ModelForwardDecoder
from grpo_core.algorithm.randomness import seed_key, token_uniforms
from grpo_core.algorithm.rollout import left_padded
from grpo_core.algorithm.sampling import sample_next_token
from grpo_core.serving.requests import (
    Cancelled,
    Event,
    Failed,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
    Usage,
)
from grpo_core.spec.size_checks import model_positions

log = logging.getLogger(__name__)

EventCallback = Callable[[Event], None]


class RequestHandle:
    """One submitted request: its events (on the handle's queue, or to the callback given at
    submit, called on the engine's driver thread), and :meth:`cancel`."""

    def __init__(self, request: GenerationRequest, request_id: int, on_event: EventCallback | None):
        self.request = request
        self.id = request_id
        # The tokens sampled for it so far, EOS included (the engine's, appended on the driver
        # thread: read them once the request is done).
        self.token_ids: list[int] = []
        self._on_event = on_event
        self._queue: queue.SimpleQueue[Event] | None = None if on_event is not None else queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._done = threading.Event()

    def cancel(self) -> None:
        """The client went away: the request leaves the batch at the engine's next step, and its
        last event is :class:`~grpo_core.serving.requests.Cancelled` (unless it ended first)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        """Whether the final event has been delivered."""
        return self._done.is_set()

    def next_event(self, timeout: float | None = None) -> Event:
        """The next event from the handle's queue; ``queue.Empty`` after ``timeout`` seconds."""
        if self._queue is None:
            raise RuntimeError("this request's events go to its callback")
        return self._queue.get(timeout=timeout)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """The request's events up to and including its final one (``timeout`` for each)."""
        while True:
            event = self.next_event(timeout)
            yield event
            if event.final:
                return

    def _deliver(self, event: Event) -> None:
        if self._done.is_set():
            return
        if event.final:
            self._done.set()
        if self._queue is not None:
            self._queue.put(event)
            return
        assert self._on_event is not None
        try:
            self._on_event(event)
        except Exception:
            # The consumer of this request is broken; the batch and the other requests are not.
            log.exception("the event callback of request %s failed; cancelling it", self.id)
            self.cancel()


class _TextStream:
    """A completion's text as its tokens arrive: what may be sent now, and where a stop string cut
    it (the module docstring says why text is held back).

    Decoding is windowed: ``decode(ids[prefix:])`` minus ``decode(ids[prefix:read])`` is the new
    text, so each token costs a decode of a few tokens rather than of the whole completion, and a
    tokenizer that spells a token differently at the start of a text (SentencePiece's leading
    space) still gets its left context. The window closes only on text that does not end in an
    incomplete character (U+FFFD from a partial UTF-8 sequence)."""

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.ids: list[int] = []
        self.prefix = self.read = 0
        self.window_text = ""  # decode(ids[prefix:read])
        self.text = ""  # the completion's whole characters so far
        self.sent = 0  # characters of ``text`` already released
        self.searched = 0  # ``text`` was searched for stop strings up to here

    def push(self, token: int) -> tuple[str, bool]:
        """Add a sampled token: ``(text to send now, whether a stop string ended the text)``."""
        self.ids.append(token)
        decoded = self._decode(self.ids[self.prefix:])
        if len(decoded) > len(self.window_text) and not decoded.endswith("\ufffd"):
            self.text += decoded[len(self.window_text):]
            self.prefix, self.read = self.read, len(self.ids)
            self.window_text = self._decode(self.ids[self.prefix:])
        return self._release(final=False)

    def flush(self) -> tuple[str, bool]:
        """The completion ended: everything not yet sent (an incomplete character as U+FFFD, as
        decoding the whole completion gives it), still cut at a stop string."""
        decoded = self._decode(self.ids[self.prefix:])
        self.text += decoded[len(self.window_text):]
        self.prefix = self.read = len(self.ids)
        self.window_text = ""
        return self._release(final=True)

    def _decode(self, ids: list[int]) -> str:
        # No clean-up of spaces: it can rewrite text already sent ("a ." -> "a.") as more arrives.
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _release(self, final: bool) -> tuple[str, bool]:
        cut = self._first_stop()
        if cut is not None:
            out, self.sent = self.text[self.sent:cut], cut
            return out, True
        end = len(self.text) if final else len(self.text) - self._held()
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out, False

    def _first_stop(self) -> int | None:
        """Where the first stop string starts, if one has completed."""
        if not self.stops:
            return None
        # An occurrence not found by an earlier search ends past what that search saw.
        start = max(0, self.searched - max(map(len, self.stops)) + 1)
        self.searched = len(self.text)
        found = [at for stop in self.stops if (at := self.text.find(stop, start)) != -1]
        return min(found) if found else None

    def _held(self) -> int:
        """How many trailing characters could be the start of a stop string."""
        held = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:length]):
                    held = length
                    break
        return held


@dataclass(eq=False)
class _Row:
    """A request in the batch: its tokens, its budget and its text so far."""

    handle: RequestHandle
    prompt_ids: list[int]
    budget: int  # max_tokens, or fewer where the model's positions run out first
    key: int  # keys the request's random draws
    text: _TextStream
    finished: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.handle.token_ids

    @property
    def params(self) -> SamplingParams:
        return self.handle.request.params

    @property
    def cached(self) -> list[int]:
        """The tokens the KV cache holds for this row: all but the last sampled one, which the
        next decode step feeds."""
        return self.prompt_ids + self.tokens[:-1]

    def usage(self) -> Usage:
        return Usage(len(self.prompt_ids), len(self.tokens))


class ServingEngine:
    """Serve ``model`` on ``device`` to up to ``max_batch`` requests decoding at once (the
    module docstring says how). ``eos_token_ids``: the tokens that end a completion ("stop"),
    ``grpo_core.run.components.eos_token_ids`` gives the training's. ``max_positions``: the
    model's context length, read from its config when not given (None there: unbounded)."""

    def __init__(self, model: torch.nn.Module, tokenizer, device: torch.device | str, max_batch: int, *,
                 eos_token_ids: Sequence[int], max_positions: int | None = None):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch: must be a positive integer, got {max_batch!r}")
        self.eos = frozenset(int(token) for token in eos_token_ids)
        if not self.eos:
            raise ValueError("eos_token_ids: name at least one token that ends a completion")
        if max_positions is None:
            config = getattr(model, "config", None)
            found = model_positions(config.to_dict()) if config is not None else None
            max_positions = None if found is None else found[1]
        elif isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 2:
            raise ValueError(f"max_positions: must be an integer of at least 2, got {max_positions!r}")
        self.max_positions = max_positions
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch = max_batch
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else min(self.eos)  # masked out; any id will do
        self._lock = threading.Lock()
        self._waiting: deque[RequestHandle] = deque()
        self._wakeup = threading.Event()  # set by submit: wait_for_work's signal
        self._ids = count(1)
        self._rows: list[_Row] = []
        self._joining: list[_Row] = []  # admitted this step, not yet in the batch
        self._decoder: ModelForwardDecoder | None = None
        self._mergeable: bool | None = None  # whether caches join by concatenation (first prefill tells)

    # ------------------------------------------------------------------ the caller's side

    def submit(self, request: GenerationRequest, on_event: EventCallback | None = None) -> RequestHandle:
        """Queue ``request`` for the next step; any thread. Its events go to ``on_event`` (called
        on the driver thread; it must not block) or, without one, to the handle's queue."""
        if not isinstance(request, GenerationRequest):
            raise TypeError("submit takes a GenerationRequest (grpo_core.serving.requests)")
        with self._lock:
            handle = RequestHandle(request, next(self._ids), on_event)
            self._waiting.append(handle)
            self._wakeup.set()
        return handle

    @property
    def running(self) -> int:
        """Requests in the batch."""
        return len(self._rows)

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet admitted."""
        with self._lock:
            return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not self._rows and not self.waiting

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Block the driver while the engine is idle, until a request arrives or ``timeout``
        seconds pass; whether there is work."""
        if self._rows:
            return True
        with self._lock:  # cleared under the lock submit sets it under: no arrival is missed
            if self._waiting:
                return True
            self._wakeup.clear()
        self._wakeup.wait(timeout)
        return not self.idle

    # ------------------------------------------------------------------ the driver's side

    def run_until_idle(self) -> None:
        """Step until no request runs or waits."""
        while self.step():
            pass

    def step(self) -> bool:
        """One step of the batch (the module docstring lists what it does); whether work is left.

        An error of the model (out of memory, say) fails every request in the batch with it,
        empties the batch and is raised; waiting requests stay queued."""
        with torch.inference_mode():
            try:
                self._drop_cancelled()
                if self._rows:
                    self._decode()
                self._admit()
            except Exception as exc:
                for row in self._rows + self._joining:
                    if not row.finished:
                        row.finished = True
                        row.handle._deliver(Failed(exc))
                self._rows, self._joining, self._decoder = [], [], None
                raise
        return not self.idle

    def _drop_cancelled(self) -> None:
        with self._lock:
            gone = [handle for handle in self._waiting if handle.cancelled]
            for handle in gone:
                self._waiting.remove(handle)
        for handle in gone:
            handle._deliver(Cancelled(Usage(0, 0)))
        for row in self._rows:
            if row.handle.cancelled:
                row.finished = True
                row.handle._deliver(Cancelled(row.usage()))
        self._keep_unfinished()

    def _decode(self) -> None:
        assert self._decoder is not None
        last = torch.tensor([row.tokens[-1] for row in self._rows], dtype=torch.long, device=self.device)
        logits = self._decoder.step(last)
        for row, token in zip(self._rows, self._sample(logits, self._rows), strict=True):
            self._advance(row, token)
        self._keep_unfinished()

    def _admit(self) -> None:
        joining = self._take(self.max_batch - len(self._rows))
        if not joining:
            return
        self._joining = joining
        running = len(self._rows)
        if self._rows and not self._mergeable:
            # Caches that cannot be concatenated: prefill every row's context again, together.
            self._decoder, logits = self._prefilled([row.cached for row in self._rows + joining])
            logits = logits[running:]
        else:
            decoder, logits = self._prefilled([row.prompt_ids for row in joining])
            if self._mergeable is None:
                self._mergeable = _concatenable(decoder.cache)
            if self._decoder is None:
                self._decoder = decoder
            else:
                _join(self._decoder, decoder)
        self._rows, self._joining = self._rows + joining, []
        for row, token in zip(joining, self._sample(logits, joining), strict=True):
            self._advance(row, token)
        self._keep_unfinished()

    def _take(self, free: int) -> list[_Row]:
        """Up to ``free`` waiting requests as rows; one the model cannot take fails here."""
        rows: list[_Row] = []
        while len(rows) < free:
            with self._lock:
                if not self._waiting:
                    break
                handle = self._waiting.popleft()
            if handle.cancelled:
                handle._deliver(Cancelled(Usage(0, 0)))
                continue
            try:
                rows.append(self._row(handle))
            except Exception as exc:  # this request's alone: a ValueError naming its field, mostly
                handle._deliver(Failed(exc))
        return rows

    def _row(self, handle: RequestHandle) -> _Row:
        request, name = handle.request, handle.request.field
        if request.messages is not None:
            if getattr(self.tokenizer, "chat_template", None) is None:
                raise ValueError("messages: this model's tokenizer has no chat template; send a prompt")
            try:
                text = self.tokenizer.apply_chat_template(
                    request.template_messages(), tokenize=False, add_generation_prompt=True)
            except Exception as exc:  # a template may refuse roles or orders it does not support
                raise ValueError(f"messages: the model's chat template could not render them: {exc}") from exc
        else:
            text = request.prompt
        # The rendered text carries its own special tokens (the template's BOS), as in training.
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"{name}: renders to no tokens")
        budget = request.params.max_tokens
        if self.max_positions is not None:
            room = self.max_positions - len(ids)
            if room < 1:
                raise ValueError(f"{name}: {len(ids)} tokens leave no room for a completion in the model's "
                                 f"{self.max_positions} positions")
            budget = min(budget, room)
        seed = request.params.seed
        key = seed_key(seed) if seed is not None else seed_key(secrets.randbits(64))
        return _Row(handle, ids, budget, key, _TextStream(self.tokenizer, request.params.stop))

    def _prefilled(self, contexts: list[list[int]]) -> tuple[ModelForwardDecoder, torch.Tensor]:
        decoder = ModelForwardDecoder(self.model)
        batch = left_padded(contexts, self.pad_id, self.device)
        return decoder, decoder.prefill(batch.ids, batch.mask)

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> list[int]:
        """One token per row. The rollout's sampler takes one temperature and top-p for a batch,
        so rows are sampled in groups of equal settings (a batch rarely holds many)."""
        groups: dict[tuple[float, float], list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault((row.params.temperature, row.params.top_p), []).append(index)
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        for (temperature, top_p), members in groups.items():
            index = torch.tensor(members, dtype=torch.long, device=logits.device)
            if temperature == 0.0:
                tokens[index] = sample_next_token(logits[index], 1.0, greedy=True)
                continue
            keys = torch.tensor([rows[i].key for i in members], dtype=torch.long, device=logits.device)
            # Each row's own token index (rows of a batch are at different ones): token_uniforms
            # folds it in element-wise, so a tensor gives each row what its own int would.
            drawn = torch.tensor([len(rows[i].tokens) for i in members], dtype=torch.long,
                                 device=logits.device)
            uniforms = token_uniforms(keys, drawn)
            tokens[index] = sample_next_token(logits[index], temperature, top_p=top_p, uniforms=uniforms)
        return tokens.tolist()

    def _advance(self, row: _Row, token: int) -> None:
        """Record ``row``'s sampled token and send what it adds; mark the row finished when it ends."""
        row.tokens.append(token)
        if token in self.eos:
            self._finish(row, "stop")
            return
        text, stopped = row.text.push(token)
        if text:
            row.handle._deliver(TextDelta(text))
        if stopped:
            row.finished = True
            row.handle._deliver(Finished("stop", row.usage()))
        elif len(row.tokens) >= row.budget:
            self._finish(row, "length")

    def _finish(self, row: _Row, reason: str) -> None:
        text, stopped = row.text.flush()
        if text:
            row.handle._deliver(TextDelta(text))
        row.finished = True
        row.handle._deliver(Finished("stop" if stopped else reason, row.usage()))

    def _keep_unfinished(self) -> None:
        """Finished rows leave the batch (and their cache rows with them)."""
        keep = [index for index, row in enumerate(self._rows) if not row.finished]
        if len(keep) == len(self._rows):
            return
        rows = [self._rows[index] for index in keep]
        self._rows = rows
        if not rows:
            self._decoder = None  # the cache's memory goes back now, not at the next request
            return
        assert self._decoder is not None
        if not self._decoder.keep(torch.tensor(keep, dtype=torch.long, device=self.device)):
            self._decoder, _ = self._prefilled([row.cached for row in rows])
        elif self._mergeable:
            _trim(self._decoder)


def _concatenable(cache) -> bool:
    """Whether ``cache`` is plain per-layer key and value tensors, ``(batch, heads, length, dim)``,
    that rows of another such cache can be padded and concatenated to."""
    layers = getattr(cache, "layers", None)
    return (type(cache) is DynamicCache and bool(layers)
            and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers))


def _left_padded(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``tensor`` padded with zeros on the left of ``dim`` (counted from the end) to ``width``."""
    extra = width - tensor.size(dim)
    if extra == 0:
        return tensor
    return F.pad(tensor, (0, 0) * (-dim - 1) + (extra, 0))


def _join(running: ModelForwardDecoder, joining: ModelForwardDecoder) -> None:
    """Append ``joining``'s rows to ``running``'s batch: caches and masks left-padded to the
    longer of the two, so every row's tokens still end at the last column."""
    width = max(running.attention.size(1), joining.attention.size(1))
    layers = [
        tuple(torch.cat([_left_padded(mine, width, -2), _left_padded(theirs, width, -2)])
              for mine, theirs in ((a.keys, b.keys), (a.values, b.values)))
        for a, b in zip(running.cache.layers, joining.cache.layers, strict=True)
    ]
    running.cache = DynamicCache(layers)
    running.attention = torch.cat([_left_padded(running.attention, width, -1),
                                   _left_padded(joining.attention, width, -1)])
    running.next_position = torch.cat([running.next_position, joining.next_position])


def _trim(decoder: ModelForwardDecoder) -> None:
    """Drop the leading columns that are padding for every row (left by rows that left)."""
    first = int(decoder.attention.bool().any(0).int().argmax())
    if first == 0:
        return
    decoder.cache = DynamicCache([(layer.keys[:, :, first:], layer.values[:, :, first:])
                                  for layer in decoder.cache.layers])
    decoder.attention = decoder.attention[:, first:]
