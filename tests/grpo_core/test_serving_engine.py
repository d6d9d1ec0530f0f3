"""The serving engine (grpo_core.serving) against transformers' ``generate``: greedy requests give
its tokens exactly, submitted together or joining a batch mid-decode (caches concatenated, or
re-prefilled where they cannot be); how requests end (max_tokens, EOS, stop strings, the model's
positions) and what they count; seeded sampling that the rest of the batch cannot change;
cancellation; and the checks a request's fields get."""

from __future__ import annotations

import math
import subprocess
import sys
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_core.io.model_loading import load_tokenizer
from grpo_core.serving.engine import ServingEngine, _TextStream
from grpo_core.serving.requests import (
    Cancelled,
    Failed,
    Finished,
    GenerationRequest,
    TextDelta,
    Usage,
    parse_request,
    sampling_params,
)

PROMPTS = ["What is 2+3?", "hello world please reply with a long answer", "one",
           "seven eight nine ten hello world what is the sum of two and three"]
CHAT = [{"role": "developer", "content": "reply with short answers"},
        {"role": "user", "content": "What is 4+4?"}]


def _chatty(folder) -> tuple[torch.nn.Module, object]:
    """The tiny model with its weights redrawn larger: at the default init its greedy output
    repeats one token, which would make "token for token" a weak check."""
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            base = 1.0 if param.dim() == 1 and name.endswith("weight") else 0.0  # norms' scales around 1
            param.copy_(torch.randn(param.shape, generator=generator) * 0.15 + base)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def llama(tiny_model_factory):
    return _chatty(tiny_model_factory("llama"))


@pytest.fixture(scope="module")
def gpt2(tiny_model_factory):
    return _chatty(tiny_model_factory("gpt2"))


def ask(prompt=None, messages=None, max_tokens=12, temperature=0, **fields) -> GenerationRequest:
    params = sampling_params(default_max_tokens=16, max_tokens_limit=256, max_tokens=max_tokens,
                             temperature=temperature, **fields)
    return GenerationRequest(params, messages=messages, prompt=prompt)


def engine_for(served, max_batch=8, **options) -> ServingEngine:
    model, tokenizer = served
    options.setdefault("eos_token_ids", [tokenizer.eos_token_id])
    return ServingEngine(model, tokenizer, "cpu", max_batch, **options)


def rendered(tokenizer, prompt=None, messages=None) -> list[int]:
    """The prompt's tokens as the engine must render them (developer as system)."""
    if messages is not None:
        as_system = [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages]
        prompt = tokenizer.apply_chat_template(as_system, tokenize=False, add_generation_prompt=True)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def generated(served, ids: list[int], max_new_tokens: int, eos=None) -> list[int]:
    """``generate``'s greedy completion of ``ids`` alone (no padding), EOS included."""
    model, tokenizer = served
    eos = tokenizer.eos_token_id if eos is None else eos
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id)
    return out[0, len(ids):].tolist()


def collected(handle) -> tuple[str, object, list[str]]:
    """A finished request's text, final event and text deltas (each event checked in order)."""
    events = list(handle.events(timeout=0))
    deltas = [event.text for event in events[:-1]]
    assert all(isinstance(event, TextDelta) and event.text for event in events[:-1])
    assert events[-1].final and handle.done
    return "".join(deltas), events[-1], deltas


def decoded(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def assert_matches_generate(served, handle, prompt=None, messages=None, max_tokens=12) -> None:
    _, tokenizer = served
    ids = rendered(tokenizer, prompt, messages)
    expected = generated(served, ids, max_tokens)
    assert len(set(expected)) > 3 or len(expected) < 8, "the reference should not repeat one token"
    assert handle.token_ids == expected
    text, final, _ = collected(handle)
    assert final == Finished("stop" if expected[-1] == tokenizer.eos_token_id else "length",
                             Usage(len(ids), len(expected)))
    assert text == decoded(tokenizer, [t for t in expected if t != tokenizer.eos_token_id])


def test_greedy_requests_submitted_together_match_generate(llama):
    engine = engine_for(llama)
    handles = [engine.submit(ask(p, max_tokens=10 + i)) for i, p in enumerate(PROMPTS)]
    chat = engine.submit(ask(messages=CHAT, max_tokens=14))
    engine.run_until_idle()
    assert engine.idle and engine.running == 0
    for index, (prompt, handle) in enumerate(zip(PROMPTS, handles, strict=True)):
        assert_matches_generate(llama, handle, prompt, max_tokens=10 + index)
    assert_matches_generate(llama, chat, messages=CHAT, max_tokens=14)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("joins", ["concatenated", "re-prefilled"])
def test_requests_joining_mid_decode_match_generate(family, joins, request):
    """Joiners longer than the running rows (the chat) and shorter ("one"), and rows leaving
    before and after them: every request still gets generate's tokens."""
    served = request.getfixturevalue(family)
    engine = engine_for(served)
    if joins == "re-prefilled":
        engine._mergeable = False  # as for a model whose cache layers cannot be concatenated
    widths = []

    def step() -> bool:
        more = engine.step()
        if engine._decoder is not None:
            widths.append(engine._decoder.attention.size(1))
            longest = max(len(row.cached) for row in engine._rows)
            # Concatenated caches are trimmed to their longest row as rows leave; re-prefilled
            # ones are rebuilt that short at each join.
            assert widths[-1] == longest if joins == "concatenated" else widths[-1] >= longest
        return more

    early = [engine.submit(ask(p, max_tokens=16)) for p in PROMPTS[:2]]
    for _ in range(5):
        step()
    assert engine.running == 2 and len(early[0].token_ids) == 5
    late = [engine.submit(ask(PROMPTS[3], max_tokens=12)), engine.submit(ask(messages=CHAT))]
    step()
    assert engine.running == 4 and len(early[0].token_ids) == 6 and len(late[0].token_ids) == 1
    for _ in range(3):
        step()
    last = engine.submit(ask(PROMPTS[2], max_tokens=16))
    while step():
        pass
    trimmed = any(later < earlier for earlier, later in zip(widths, widths[1:], strict=False))
    assert trimmed or joins == "re-prefilled"
    for prompt, handle in zip(PROMPTS[:2], early, strict=True):
        assert_matches_generate(served, handle, prompt, max_tokens=16)
    assert_matches_generate(served, late[0], PROMPTS[3])
    assert_matches_generate(served, late[1], messages=CHAT)
    assert_matches_generate(served, last, PROMPTS[2], max_tokens=16)


def test_finished_rows_free_their_slots_for_waiting_requests(llama):
    engine = engine_for(llama, max_batch=2)
    lengths = [3, 9, 5, 4]
    handles = [engine.submit(ask(p, max_tokens=n)) for p, n in zip(PROMPTS, lengths, strict=True)]
    busiest = 0
    while engine.step():
        busiest = max(busiest, engine.running)
        assert engine.running <= 2
    assert busiest == 2
    for prompt, handle, n in zip(PROMPTS, handles, lengths, strict=True):
        assert_matches_generate(llama, handle, prompt, max_tokens=n)


def test_max_tokens_ends_with_length_after_exactly_that_many_tokens(llama):
    engine = engine_for(llama)
    handles = [engine.submit(ask(PROMPTS[1], max_tokens=n)) for n in (1, 7)]
    engine.run_until_idle()
    for handle, n in zip(handles, (1, 7), strict=True):
        text, final, _ = collected(handle)
        assert final.finish_reason == "length" and final.usage.completion_tokens == n == len(handle.token_ids)
        assert text == decoded(llama[1], handle.token_ids)


def test_eos_ends_with_stop_and_is_not_text(llama):
    free = generated(llama, rendered(llama[1], PROMPTS[0]), 12, eos=[])
    eos = free[4]  # a token the free run samples early: as EOS, it ends the completion there
    engine = engine_for(llama, eos_token_ids=[eos])
    handle = engine.submit(ask(PROMPTS[0], max_tokens=12))
    engine.run_until_idle()
    expected = free[: free.index(eos) + 1]
    assert handle.token_ids == expected == generated(llama, rendered(llama[1], PROMPTS[0]), 12, eos=eos)
    text, final, _ = collected(handle)
    assert final == Finished("stop", Usage(len(rendered(llama[1], PROMPTS[0])), len(expected)))
    assert text == decoded(llama[1], expected[:-1])


def _stop_across_tokens(tokenizer, tokens: list[int]) -> str:
    """Two characters that two consecutive tokens of ``tokens`` spell, one each (not the first
    two tokens: text must come before the stop string), neither a byte decoding cannot place."""
    for k in range(3, len(tokens) - 1):
        before, after = decoded(tokenizer, tokens[:k]), decoded(tokenizer, tokens[: k + 1])
        if len(after) > len(before) and after.startswith(before):
            stop = before[-1] + after[len(before)]
            if "\ufffd" not in stop:
                return stop
    raise AssertionError("no two consecutive tokens both spell text")


def test_a_stop_string_split_across_tokens_cuts_the_text_and_is_never_sent(llama):
    _, tokenizer = llama
    prompt = PROMPTS[3]
    free = generated(llama, rendered(tokenizer, prompt), 24, eos=[])
    full = decoded(tokenizer, free)
    stop = _stop_across_tokens(tokenizer, free)
    engine = engine_for(llama)
    handle = engine.submit(ask(prompt, max_tokens=24, stop=["never in this text", stop]))
    other = engine.submit(ask(PROMPTS[0], max_tokens=24, stop="zzzz"))
    engine.run_until_idle()
    text, final, deltas = collected(handle)
    assert text == full[: full.index(stop)] and stop not in text
    assert final.finish_reason == "stop"
    assert final.usage.completion_tokens == len(handle.token_ids) < 24
    # The sampled tokens spell the stop string: the request ended on the token that completed it.
    assert stop in decoded(tokenizer, handle.token_ids)
    assert stop not in decoded(tokenizer, handle.token_ids[:-1])
    # A stop string that never completes changes nothing.
    other_text, other_final, _ = collected(other)
    assert other_final.finish_reason == "length"
    assert other_text == decoded(tokenizer, generated(llama, rendered(tokenizer, PROMPTS[0]), 24))


def test_text_is_sent_in_whole_characters_and_held_while_it_may_start_a_stop_string(llama):
    _, tokenizer = llama
    text = "héllo wörld ✓ the answer is 42, so then"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text.split()), "the characters take several byte tokens"
    stream = _TextStream(tokenizer, ["answer is 4", "so then!"])
    sent = []
    for token in ids:
        delta, stopped = stream.push(token)
        assert "\ufffd" not in delta
        sent.append(delta)
        if stopped:
            break
    assert stopped and "".join(sent) == "héllo wörld ✓ the "
    # Held, not sent: "so then" could still become "so then!", and only the end decides.
    stream = _TextStream(tokenizer, ["so then!"])
    sent = "".join(stream.push(token)[0] for token in ids)
    assert sent == "héllo wörld ✓ the answer is 42, "
    assert stream.flush() == ("so then", False)


def test_the_model_positions_bound_the_completion_and_refuse_a_prompt_that_fills_them(llama):
    _, tokenizer = llama
    assert engine_for(llama).max_positions == 1024  # read from the model's config
    ids = rendered(tokenizer, PROMPTS[3])
    engine = engine_for(llama, max_positions=len(ids) + 3)
    fits = engine.submit(ask(PROMPTS[3], max_tokens=10))
    full = engine.submit(ask(PROMPTS[3] + " one two three four five"))
    chat = engine.submit(ask(messages=[{"role": "user", "content": PROMPTS[3] * 3}]))
    engine.run_until_idle()
    _, final, _ = collected(fits)
    assert final == Finished("length", Usage(len(ids), 3))
    for handle, name in ((full, "prompt"), (chat, "messages")):
        (event,) = list(handle.events(timeout=0))
        assert isinstance(event, Failed) and isinstance(event.error, ValueError)
        assert str(event.error).startswith(f"{name}: ") and "positions" in str(event.error)


def test_usage_counts_the_rendered_prompt_and_every_sampled_token(llama):
    _, tokenizer = llama
    engine = engine_for(llama)
    chat = engine.submit(ask(messages=CHAT, max_tokens=5))
    plain = engine.submit(ask(PROMPTS[2], max_tokens=6))
    engine.run_until_idle()
    expected = ((chat, rendered(tokenizer, messages=CHAT), 5), (plain, rendered(tokenizer, PROMPTS[2]), 6))
    for handle, ids, n in expected:
        _, final, _ = collected(handle)
        assert final.usage == Usage(len(ids), n) and final.usage.total_tokens == len(ids) + n


SAMPLED = dict(temperature=0.9, top_p=0.95, max_tokens=16)


def test_seeded_sampling_is_the_same_whatever_shares_the_batch(llama):
    alone = engine_for(llama)
    first = alone.submit(ask(PROMPTS[1], seed=7, **SAMPLED))
    alone.run_until_idle()
    crowded = engine_for(llama)
    others = [crowded.submit(ask(PROMPTS[0], seed=1, **SAMPLED)),
              crowded.submit(ask(PROMPTS[3], temperature=0.7, max_tokens=20)),
              crowded.submit(ask(PROMPTS[2], max_tokens=20))]
    crowded.step()
    crowded.step()
    again = crowded.submit(ask(PROMPTS[1], seed=7, **SAMPLED))
    other_seed = crowded.submit(ask(PROMPTS[1], seed=8, **SAMPLED))
    crowded.run_until_idle()
    assert len(first.token_ids) == 16 and len(set(first.token_ids)) > 3
    assert again.token_ids == first.token_ids
    assert collected(again)[0] == collected(first)[0]
    assert other_seed.token_ids != first.token_ids
    assert all(handle.done for handle in others)


def test_cancel_removes_a_request_at_the_next_step(llama):
    engine = engine_for(llama, max_batch=2)
    gone = engine.submit(ask(PROMPTS[0], max_tokens=30))
    stays = engine.submit(ask(PROMPTS[1], max_tokens=12))
    never_ran = engine.submit(ask(PROMPTS[2]))
    for _ in range(3):
        engine.step()
    gone.cancel()
    never_ran.cancel()
    engine.step()
    assert engine.running == 1 and engine.waiting == 0
    events = list(gone.events(timeout=0))
    assert events[-1] == Cancelled(Usage(len(rendered(llama[1], PROMPTS[0])), 3))
    assert list(never_ran.events(timeout=0)) == [Cancelled(Usage(0, 0))]
    engine.run_until_idle()
    assert len(gone.token_ids) == 3
    assert_matches_generate(llama, stays, PROMPTS[1])


def test_callbacks_get_the_events_and_a_failing_one_cancels_only_its_request(llama):
    engine = engine_for(llama)
    seen = []
    good = engine.submit(ask(PROMPTS[0]), on_event=seen.append)

    def broken(event):
        raise RuntimeError("client gone")

    bad = engine.submit(ask(PROMPTS[1], max_tokens=20), on_event=broken)
    engine.run_until_idle()
    assert "".join(e.text for e in seen[:-1]) == decoded(llama[1], good.token_ids)
    assert isinstance(seen[-1], Finished) and good.done
    assert bad.cancelled and len(bad.token_ids) < 20
    with pytest.raises(RuntimeError, match="callback"):
        good.next_event(timeout=0)


def test_requests_submitted_from_other_threads_while_a_driver_steps(llama):
    engine = engine_for(llama)
    stop = threading.Event()

    def drive():
        while not stop.is_set():
            if engine.wait_for_work(timeout=0.05):
                engine.step()

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        handles = []
        submitters = [threading.Thread(target=lambda p=p: handles.append((p, engine.submit(ask(p)))))
                      for p in PROMPTS]
        for thread in submitters:
            thread.start()
        for thread in submitters:
            thread.join()
        for prompt, handle in handles:
            events = list(handle.events(timeout=30))
            assert isinstance(events[-1], Finished)
            assert handle.token_ids == generated(llama, rendered(llama[1], prompt), 12)
        assert not engine.wait_for_work(timeout=0.01)
    finally:
        stop.set()
        driver.join()


def test_a_request_the_model_cannot_take_fails_alone(llama):
    model, tokenizer = llama
    without_template = load_tokenizer(tokenizer.name_or_path)
    without_template.chat_template = None
    engine = ServingEngine(model, without_template, "cpu", 4, eos_token_ids=[tokenizer.eos_token_id])
    chat = engine.submit(ask(messages=CHAT))
    plain = engine.submit(ask(PROMPTS[0]))
    engine.run_until_idle()
    (event,) = list(chat.events(timeout=0))
    assert isinstance(event, Failed) and str(event.error).startswith("messages: ")
    assert_matches_generate(llama, plain, PROMPTS[0])


P = {"prompt": "hello"}
BAD_BODIES = [
    ({**P, "max_tokens": 0}, "max_tokens"),
    ({**P, "max_tokens": 257}, "max_tokens"),
    ({**P, "max_tokens": "5"}, "max_tokens"),
    ({**P, "max_tokens": True}, "max_tokens"),
    ({**P, "temperature": -0.1}, "temperature"),
    ({**P, "temperature": 2.5}, "temperature"),
    ({**P, "temperature": math.nan}, "temperature"),
    ({**P, "temperature": "hot"}, "temperature"),
    ({**P, "top_p": 1.5}, "top_p"),
    ({**P, "top_p": -1}, "top_p"),
    ({**P, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**P, "stop": 3}, "stop"),
    ({**P, "stop": ["a", ""]}, r"stop\[1\]"),
    ({**P, "seed": 1.5}, "seed"),
    ({**P, "seed": 2**64}, "seed"),
    ({**P, "max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, r"messages\[0\]\.role"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": None}]},
     r"messages\[1\]\.content"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, "messages"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a list"]}, "prompt"),
    ({}, "messages"),
]


@pytest.mark.parametrize(("body", "name"), BAD_BODIES, ids=[str(body) for body, _ in BAD_BODIES])
def test_bad_fields_are_value_errors_naming_the_field(body, name):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        parse_request(body, default_max_tokens=16, max_tokens_limit=256)


def test_a_good_body_gives_the_request_with_openai_defaults():
    chat = parse_request({"messages": CHAT, "max_completion_tokens": 5, "stop": "x", "seed": -3, "n": 1,
                          "model": "ignored"}, default_max_tokens=16, max_tokens_limit=256)
    assert chat.field == "messages" and chat.params.max_tokens == 5 and chat.params.stop == ("x",)
    assert chat.params.temperature == 1.0 and chat.params.top_p == 1.0 and chat.params.seed == -3
    assert chat.template_messages()[0]["role"] == "system"
    plain = parse_request({"prompt": "hi", "temperature": 0}, default_max_tokens=16, max_tokens_limit=256)
    assert plain.field == "prompt" and plain.params.max_tokens == 16 and plain.params.greedy
    with pytest.raises(ValueError, match="^default_max_tokens: "):
        sampling_params(default_max_tokens=300, max_tokens_limit=256)


def test_engine_settings_are_checked(llama):
    with pytest.raises(ValueError, match="^max_batch: "):
        engine_for(llama, max_batch=0)
    with pytest.raises(ValueError, match="^eos_token_ids: "):
        engine_for(llama, eos_token_ids=[])
    with pytest.raises(ValueError, match="^max_positions: "):
        engine_for(llama, max_positions=1)


def test_requests_are_checked_without_torch():
    """The process a request arrives in (the API's) checks it without loading torch."""
    code = "import sys, grpo_core.serving.requests; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
