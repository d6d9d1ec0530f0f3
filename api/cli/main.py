"""``grpo``: the console entry. It reuses ``grpo_core.cli``'s parser (``train``, ``tiny-model``)
and adds the service's commands: ``api``, ``scheduler``, ``worker``, ``dev``, ``admin`` (teams,
API keys, quotas and pools, straight on the database: ``api.cli.admin``) and the HTTP client
commands ``submit``, ``list``, ``show``, ``watch``, ``cancel``, ``rm``, ``events``, ``metrics``,
``cluster``, ``queue`` (``api.cli.monitor``), ``usage``, ``me`` and ``set-budget``
(``api.cli.usage_command``), ``compare`` (``api.cli.compare_command``), ``rewards list|run``
(``api.cli.reward_commands``), ``env run`` (``api.cli.environment_commands``), ``samples``
(``api.cli.samples_command``), ``files upload|list|show|rm`` (``api.cli.files_command``), ``chat``
(``api.cli.chat_command``).

Exit codes as ``grpo_core.cli``: 0 ok, 1 failed (``watch``, ``submit --watch``: the job failed or
was cancelled), 2 bad input. Nothing heavy is imported until a command runs (never torch here).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from api.cli.admin import add_admin_commands
from api.cli.chat_command import CHAT_COMMAND, add_chat_command
from api.cli.compare_command import COMPARE_COMMAND, add_compare_command
from api.cli.environment_commands import add_environment_commands
from api.cli.files_command import FILES_COMMAND, add_files_command
from api.cli.health import add_health_command
from api.cli.monitor import MONITOR_COMMANDS, add_monitor_commands
from api.cli.reward_commands import add_reward_commands
from api.cli.samples_command import SAMPLES_COMMAND, add_samples_command
from api.cli.schema_check import schema_ready, webhook_secrets_sealed
from api.cli.usage_command import BUDGET_COMMAND, ME_COMMAND, USAGE_COMMAND, add_usage_commands
from grpo_core import cli as core_cli
from grpo_core.errors import SpecWarning
from grpo_core.spec.run_spec import RunSpec

SERVICE_COMMANDS = ("api", "scheduler", "worker", "dev", "admin", "health", "rewards", "env", SAMPLES_COMMAND,
                    USAGE_COMMAND, ME_COMMAND, BUDGET_COMMAND, COMPARE_COMMAND, FILES_COMMAND, CHAT_COMMAND,
                    *MONITOR_COMMANDS)
LOG_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"


def _api(args: argparse.Namespace) -> int:
    import uvicorn

    from api.settings import get_settings

    settings = get_settings()
    schema_ready(settings)
    uvicorn.run("api.main:create_app", factory=True, host=args.host or settings.api_host,
                port=args.port or settings.api_port, log_level="info")
    return 0


def _scheduler(args: argparse.Namespace) -> int:
    from api.scheduling import storage_sweeper, webhook_sender
    from api.scheduling.scheduler import Scheduler
    from api.settings import get_settings

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    schema_ready(get_settings())
    webhook_secrets_sealed(get_settings())  # before the sender signs anything
    # In this process, off the API's request path, beside the scheduling loop.
    sender = webhook_sender.start(get_settings(), stop)
    # Beside them, what a failed storage call left behind is removed (api.scheduling.storage_sweeper).
    sweeper = storage_sweeper.start(get_settings(), stop)
    Scheduler(get_settings()).run(stop)
    sender.join(timeout=get_settings().webhook_timeout_seconds + 5)
    sweeper.join(timeout=5)
    return 0


def _worker(args: argparse.Namespace) -> int:
    # Before the settings are first read: the Celery app is built from them at import.
    if args.pool:
        os.environ["GRPO_POOL"] = args.pool
    if args.gpus:
        os.environ["GRPO_WORKER_GPUS"] = str(args.gpus)
    from api.settings import get_settings
    from worker.celery_app import app

    pool = get_settings().pool
    # No -c: the app's concurrency is the worker's device count (worker.celery_app).
    app.worker_main(["worker", "--pool", "prefork", "--without-gossip",
                     "--without-mingle", "-n", f"grpo-{pool}-{os.getpid()}@%h", "--loglevel", args.loglevel])
    return 0


def _dev(args: argparse.Namespace) -> int:
    from api.cli.dev import run_dev
    from api.cli.monitor import read_spec, submit_spec

    watch = None
    if args.submit is not None:
        spec = read_spec(args.submit)
        watch = lambda url: submit_spec(url, args.api_key, spec)  # noqa: E731
    return run_dev(args.port, args.submit, args.models_root, args.data_root, watch)


def _job_spec_to_run_here(path: Path) -> tuple[RunSpec, list[SpecWarning]]:
    """``grpo train``'s reader here: a spec written for the service runs on this machine too, the
    service's fields it sets (priority, pool, stall limit) told as ignored; a ``job:`` model
    exists only in the service and is refused."""
    from api.domain.job_spec import JobSpec, ignored_by_local_run
    from api.domain.spec_sources import refuse_job_source
    from grpo_core.spec.spec_file import load_spec_file

    spec = load_spec_file(path, JobSpec)
    refuse_job_source(spec)
    return spec, [*spec.warnings(), *ignored_by_local_run(spec)]


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def build_parser() -> argparse.ArgumentParser:
    parser = core_cli.build_parser(_job_spec_to_run_here)
    commands = _subcommands(parser)
    api = commands.add_parser("api", help="serve the HTTP API (uvicorn)")
    api.add_argument("--host", default=None, help="default: GRPO_API_HOST (127.0.0.1)")
    api.add_argument("--port", type=int, default=None, help="default: GRPO_API_PORT (8000)")
    api.set_defaults(handler=_api)
    commands.add_parser("scheduler", help="dispatch queued jobs into free worker capacity").set_defaults(
        handler=_scheduler)
    worker = commands.add_parser("worker", help="a Celery worker for one GPU pool")
    worker.add_argument("--pool", default=None, help="default: GRPO_POOL (default)")
    worker.add_argument("--gpus", type=int, default=None, help="GPUs to advertise (GRPO_WORKER_GPUS)")
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(handler=_worker)
    add_health_command(commands)
    dev = commands.add_parser("dev", help="API, scheduler and one worker on this machine")
    dev.add_argument("--port", type=int, default=None)
    dev.add_argument("--submit", type=Path, default=None, metavar="SPEC",
                     help="submit SPEC once up, stream it, then stop (exit code as submit --watch)")
    dev.add_argument("--models-root", type=Path, default=None, help="default: GRPO_MODELS_ROOT, the "
                     "--submit spec's folder, else ./models")
    dev.add_argument("--data-root", type=Path, default=None, help="likewise, else ./data")
    dev.add_argument("--api-key", default=os.environ.get("GRPO_API_KEY"))
    dev.set_defaults(handler=_dev)
    add_monitor_commands(commands)
    add_usage_commands(commands)
    add_compare_command(commands)
    add_files_command(commands)
    add_reward_commands(commands)
    add_environment_commands(commands)
    add_samples_command(commands)
    add_chat_command(commands)
    add_admin_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command not in SERVICE_COMMANDS:
            return core_cli.main(argv, _job_spec_to_run_here)
        return core_cli.run_handler(args)
    except BrokenPipeError:
        # The reader went away (`grpo metrics 1 | head`): what is left to print has nowhere to
        # go. Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a process a pipe ended


if __name__ == "__main__":
    sys.exit(main())
