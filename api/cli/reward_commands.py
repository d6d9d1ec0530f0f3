"""``grpo rewards list`` (the catalog) and ``grpo rewards run SPEC --samples FILE``: a spec's
rewards score a few samples on the service (``POST /v1/rewards/run``) without a job, so a grader
is tried before training; it exits 1 when a reward could not score some sample (a grader's
exception), with the reason under that sample.

A samples file is JSON Lines, a JSON array or a YAML list of ``{prompt, completion, columns}``;
a sample without ``columns`` takes its other keys as its columns (``{prompt, completion, answer}``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from api.cli.calling import BadArgument, Result, call_api

SAMPLE_KEYS = ("prompt", "completion", "columns")


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The samples of ``path`` in the request's shape; :class:`BadArgument` naming what is wrong."""
    from grpo_core.spec.spec_file import load_yaml

    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadArgument(f"--samples: cannot read {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".jsonl":
            data = [json.loads(line) for line in raw.splitlines() if line.strip()]
        else:
            data = json.loads(raw) if path.suffix == ".json" else load_yaml(raw.encode())
    except ValueError as exc:
        raise BadArgument(f"--samples: {path} is not valid JSON/YAML: {exc}") from None
    if not isinstance(data, list) or not data:
        raise BadArgument(f"--samples: {path} must hold a list of samples")
    return [_sample(item, index) for index, item in enumerate(data)]


def _sample(item: Any, index: int) -> dict[str, Any]:
    if not isinstance(item, dict) or "prompt" not in item or "completion" not in item:
        raise BadArgument(f"--samples: sample {index} must be an object with 'prompt' and 'completion'")
    if "columns" in item:
        return {key: item[key] for key in SAMPLE_KEYS if key in item}
    columns = {key: value for key, value in item.items() if key not in SAMPLE_KEYS}
    return {"prompt": item["prompt"], "completion": item["completion"], "columns": columns}


def trial_request(spec_path: Path, samples_path: Path) -> dict[str, Any]:
    """The request body: the spec's ``rewards`` (and its ``reward_timeout_seconds``, capped to a
    dry run's 30 s) with the samples; the service checks the rewards as a submit would."""
    from grpo_core.spec.spec_file import read_spec_data

    spec = read_spec_data(spec_path)
    if not isinstance(spec, dict) or not isinstance(spec.get("rewards"), list):
        raise BadArgument(f"{spec_path} has no 'rewards:' list to try")
    body: dict[str, Any] = {"rewards": spec["rewards"], "samples": read_samples(samples_path)}
    timeout = spec.get("reward_timeout_seconds")
    if isinstance(timeout, int | float) and timeout > 0:
        body["reward_timeout_seconds"] = min(float(timeout), 30.0)
    pool = (spec.get("resources") or {}).get("pool") if isinstance(spec.get("resources"), dict) else None
    if pool:
        body["pool"] = pool
    return body


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def scores_text(body: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    """One line per sample (its total and each reward), then the reasons for unscored rewards."""
    lines = []
    for index, (item, sample) in enumerate(zip(body["items"], samples, strict=True)):
        completion = " ".join(str(sample["completion"]).split())
        shown = completion if len(completion) <= 40 else completion[:39] + "…"
        parts = "  ".join(f"{name}={_number(value)}" for name, value in item["rewards"].items())
        lines.append(f"{index:>3}  reward={_number(item['reward'])}  {parts}  {shown!r}")
        lines += [f"       {name}: {why}" for name, why in item.get("problems", {}).items()]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    """Exit 1 when a reward failed on any sample (its reason printed under it), as a test run
    fails: a script or CI step that tries a grader must not pass over a grader that raises."""
    def command(client: Any) -> Result:
        body = trial_request(args.spec, args.samples)
        answer = client.run_rewards(body)
        failed = sum(1 for item in answer["items"] if item.get("problems"))
        text = scores_text(answer, body["samples"])
        if failed:
            text += f"\n{failed} of {len(answer['items'])} sample(s) had a reward that could not score them"
        return Result(answer, text, 1 if failed else 0)

    return call_api(args.api_url, args.api_key, args.json, command)


def _list(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        catalog = client.reward_catalog()
        lines = [f"{item['name']:<22} {item['description']}" for item in catalog["items"]]
        return Result(catalog, "\n".join(lines))

    return call_api(args.api_url, args.api_key, args.json, command)


def add_reward_commands(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    common = common_options()
    rewards = commands.add_parser("rewards", help="the rewards a spec may name; try a spec's rewards")
    actions = rewards.add_subparsers(dest="rewards_command", required=True, metavar="{list,run}")
    actions.add_parser("list", help="every reward with its description", parents=[common]).set_defaults(
        handler=_list)
    run = actions.add_parser("run", parents=[common],
                             help="score samples with a spec's rewards on the service, without a job")
    run.add_argument("spec", type=Path, help="a spec file (only its rewards: are used)")
    run.add_argument("--samples", type=Path, required=True, metavar="FILE",
                     help="JSON Lines, JSON or YAML list of {prompt, completion, columns}")
    run.set_defaults(handler=_run)
