"""``grpo samples JOB [--step N] [--limit K]``: the sample completions a job kept (every
``log_completions_every`` steps), newest step first: each row's split, reward and advantage, its
prompt and its completion, or a multi-turn episode's conversation (each assistant turn with its
tool calls and the reward its environment step gave, each tool result or observation) with its
turns. ``--json`` prints the API's pages as they are."""

from __future__ import annotations

import argparse
import json
from typing import Any

from api.cli.calling import Result, call_api

SAMPLES_COMMAND = "samples"
_SHOWN_CHARS = 400  # of a prompt, a completion or a message (the API has them whole)


def _short(text: Any) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= _SHOWN_CHARS else flat[: _SHOWN_CHARS - 1] + "…"


def _number(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.4g}"


def message_lines(messages: list[dict[str, Any]]) -> list[str]:
    """A conversation's lines: who spoke (with a turn's reward, a tool's name), then what."""
    lines = []
    for message in messages:
        role = str(message.get("role", "?"))
        if role == "tool":
            role = f"tool {message.get('name', '')}".strip()
        if isinstance(message.get("reward"), int | float):
            role += f" (reward {_number(message['reward'])})"
        functions = [c.get("function") or {} for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        calls = [f"→ {f.get('name', '?')}({json.dumps(f.get('arguments', {}))})" for f in functions]
        lines.append(f"    {role}: {_short(' '.join([str(message.get('content') or ''), *calls]).strip())}")
    return lines


def samples_text(pages: list[dict[str, Any]]) -> str:
    """Each kept step's rows, newest step first."""
    lines: list[str] = []
    for page in pages:
        for index, row in enumerate(page["rows"]):
            split = row.get("split", "training")
            turns = f"  turns={row['turns']}" if "turns" in row else ""
            lines.append(f"step {page['step']} #{index} {split}  reward={_number(row.get('reward'))}  "
                         f"advantage={_number(row.get('advantage'))}{turns}")
            lines.append(f"  prompt: {_short(row.get('prompt', ''))}")
            if isinstance(row.get("messages"), list):
                lines.append("  conversation:")
                lines += message_lines(row["messages"])
            else:
                lines.append(f"  completion: {_short(row.get('completion', ''))}")
    return "\n".join(lines) if lines else "no samples yet"


def _samples(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        page = client.samples(args.job_id, args.step, args.limit)
        return Result(page, samples_text(page["items"]))

    return call_api(args.api_url, args.api_key, args.json, command)


def add_samples_command(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    samples = commands.add_parser(SAMPLES_COMMAND, parents=[common_options()],
                                  help="a job's kept samples (multi-turn episodes as conversations)")
    samples.add_argument("job_id", type=int)
    samples.add_argument("--step", type=int, default=None, help="only this step's (0: the evaluation before "
                         "training)")
    samples.add_argument("--limit", type=int, default=5, help="the newest K kept steps (default 5)")
    samples.set_defaults(handler=_samples)
