"""``grpo chat JOB``: talk to a job's model from the terminal. Each line read from stdin is the
next user message of one conversation; the answer streams back as the model writes it
(``POST /v1/chat/completions`` with ``stream: true``), then waits for the next line. ``--model
job:ID@STEP`` talks to a checkpoint instead, ``--system TEXT`` opens the conversation with a
system message, ``--max-tokens N`` bounds each answer. End with an empty stdin (Ctrl-D) or
``/exit``. With ``--json`` each answer is printed as the API's ``chat.completion`` object, one a
line.

The first line may wait while the team's serving job starts (a device, the model loading: up to
the service's ``GRPO_SERVE_WAIT_SECONDS``); a serving job that is busy or preempted answers 503,
which is printed and the line can be sent again. A request the API refuses (no such job, no model
yet, a bad option) ends the command with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from api.cli.calling import BAD_INPUT_STATUSES, Result, call_api
from api.cli.printable import printable

CHAT_COMMAND = "chat"
EXIT_WORDS = ("/exit", "/quit")
# The API answers only once the serving job took the request; it may wait for a device first.
READ_TIMEOUT_SECONDS = 600.0


def _body(args: argparse.Namespace, messages: list[dict[str, str]], stream: bool) -> dict[str, Any]:
    model = args.model or f"job:{args.job_id}"
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        body["temperature"] = args.temperature
    return body


def _streamed_answer(client: Any, body: dict[str, Any]) -> str:
    """Print the answer's text as it streams; return it whole. ApiError for a refusal."""
    import httpx

    from api.cli.client import ApiError

    parts: list[str] = []
    timeout = httpx.Timeout(30.0, read=READ_TIMEOUT_SECONDS)
    with client.http.stream("POST", "/v1/chat/completions", json=body, timeout=timeout) as response:
        if response.status_code >= 400:
            response.read()
            client._json(response)  # raises ApiError with the API's error body
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue  # a comment while the model is quiet, or the blank line between events
            data = line.removeprefix("data: ").strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if isinstance(chunk.get("error"), dict):  # the serving job stopped under the answer
                raise ApiError(int(chunk["error"].get("status") or 503), chunk)
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    parts.append(text)
                    print(printable(text), end="", flush=True)
    print(flush=True)
    return "".join(parts)


def _whole_answer(client: Any, body: dict[str, Any]) -> str:
    import httpx

    timeout = httpx.Timeout(30.0, read=READ_TIMEOUT_SECONDS)
    answer = client._json(client.http.post("/v1/chat/completions", json=body, timeout=timeout))
    print(json.dumps(answer), flush=True)
    return answer["choices"][0]["message"]["content"]


def converse(client: Any, args: argparse.Namespace, lines: Any) -> Result:
    """The conversation over ``lines`` (stdin's). A refusal no retry changes (404, 409, 422) is
    raised (exit 2); a retryable one (503) is told, and the line may be sent again."""
    from api.cli.client import ApiError

    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    prompt = sys.stdin.isatty()
    while True:
        if prompt:
            print("> ", end="", file=sys.stderr, flush=True)
        line = lines.readline()
        if not line or line.strip() in EXIT_WORDS:
            return Result({"messages": messages}, "")
        if not line.strip():
            continue
        asked = [*messages, {"role": "user", "content": line.rstrip("\n")}]
        try:
            body = _body(args, asked, stream=not args.json)
            answer = _whole_answer(client, body) if args.json else _streamed_answer(client, body)
        except ApiError as exc:
            if exc.status in BAD_INPUT_STATUSES:
                raise
            print(f"error: {printable(str(exc))} (send the line again)", file=sys.stderr, flush=True)
            continue
        messages = [*asked, {"role": "assistant", "content": answer}]


def _chat(args: argparse.Namespace) -> int:
    if (args.job_id is None) == (args.model is None):
        print("error: name the job (grpo chat JOB) or the model (--model job:ID@STEP), one of the two",
              file=sys.stderr)
        return 2
    # --json prints each answer as it comes: the whole conversation is not printed again at the end.
    return call_api(args.api_url, args.api_key, False, lambda client: converse(client, args, sys.stdin))


def add_chat_command(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    chat = commands.add_parser(CHAT_COMMAND, parents=[common_options()],
                               help="chat with a job's model: each stdin line a message, the answer streamed")
    chat.add_argument("job_id", type=int, nargs="?", metavar="JOB", help="the job whose model answers")
    chat.add_argument("--model", default=None, metavar="job:ID@STEP",
                      help="a checkpoint of a job (or job:ID), instead of JOB")
    chat.add_argument("--system", default=None, metavar="TEXT",
                      help="a system message opening the conversation")
    chat.add_argument("--max-tokens", type=int, default=None, metavar="N",
                      help="the most tokens of each answer")
    chat.add_argument("--temperature", type=float, default=None, help="0: greedy (default 1)")
    chat.set_defaults(handler=_chat)
