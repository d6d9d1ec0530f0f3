"""``grpo env run SPEC --item JSON --action TEXT ...``: a spec's environment plays one episode on
the service (``POST /v1/environments/run``) on scripted actions, without a model or a job, so an
environment is tried before training. Prints reset's first observation, then each step's action,
reward, done and observation; ``--json`` prints the answer as the API gave it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from api.cli.calling import BadArgument, Result, call_api


def trial_request(spec_path: Path, item: str, actions: list[str]) -> dict[str, Any]:
    """The request body: the spec's ``environment`` (the service checks it as a submit would),
    the dataset row and the actions."""
    from grpo_core.spec.spec_file import read_spec_data

    spec = read_spec_data(spec_path)
    if not isinstance(spec, dict) or not isinstance(spec.get("environment"), dict):
        raise BadArgument(f"{spec_path} has no 'environment:' to try")
    try:
        row = json.loads(item)
    except ValueError as exc:
        raise BadArgument(f"--item: not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise BadArgument("--item: must be a JSON object (the dataset row reset(item) gets)")
    body: dict[str, Any] = {"environment": spec["environment"], "item": row, "actions": actions}
    resources = spec.get("resources")
    if isinstance(resources, dict) and resources.get("pool"):
        body["pool"] = resources["pool"]
    return body


def episode_text(answer: dict[str, Any]) -> str:
    """reset's observation, then a line per step, then the total."""
    lines = [f"reset      {answer['first_observation']!r}"]
    for index, step in enumerate(answer["steps"], start=1):
        reward = "-" if step["reward"] is None else f"{step['reward']:.4g}"
        lines.append(f"step {index:<3}  action={step['action']!r}  reward={reward}  done={step['done']}  "
                     f"observation={step['observation']!r}")
    ended = "done" if answer["done"] else "not done"
    unused = f", {answer['unused_actions']} action(s) unused" if answer["unused_actions"] else ""
    lines.append(f"total reward {answer['total_reward']:.4g} ({ended}{unused})")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    def command(client: Any) -> Result:
        answer = client.run_environment(trial_request(args.spec, args.item, args.action))
        return Result(answer, episode_text(answer))

    return call_api(args.api_url, args.api_key, args.json, command)


def add_environment_commands(commands: argparse._SubParsersAction) -> None:
    from api.cli.monitor import common_options

    environment = commands.add_parser("env", help="try a spec's environment")
    actions = environment.add_subparsers(dest="env_command", required=True, metavar="{run}")
    run = actions.add_parser("run", parents=[common_options()],
                             help="play one episode of a spec's environment on scripted actions, no job")
    run.add_argument("spec", type=Path, help="a spec file (only its environment: is used)")
    run.add_argument("--item", default="{}", metavar="JSON",
                     help="the dataset row reset(item) gets, as a JSON object (default: {})")
    run.add_argument("--action", action="append", required=True, metavar="TEXT",
                     help="a model turn given to step(action); repeat for each turn, in order")
    run.set_defaults(handler=_run)
