"""``grpo submit | list | show | watch | cancel | events | alerts | metrics | cluster | queue``: the service
seen through its HTTP API only (``api.cli.client``), so they work against ``grpo dev`` and a remote
deployment alike. Each takes ``--api-url`` (``GRPO_API_URL``, default http://127.0.0.1:8000) and
``--api-key`` (``GRPO_API_KEY``); ``--json`` prints the API's JSON, one document, instead of
text (``api.cli.term_view`` draws the text).

Exit codes: 0 ok (``watch`` and ``submit --watch``: the job succeeded); 1 the job failed or was
cancelled, or the API could not be reached; 2 bad input (the API answered 400/404/409/413/422,
or an argument is wrong); 130 ``watch`` was interrupted (the job goes on). An error is one line
on stderr (one for each invalid field the API lists): the API's ``error.message`` and ``param``,
and what to do when no API answers or the key is refused; with ``--json`` the error body too
(``api.cli.calling``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

from api.cli.calling import BadArgument, Result, call_api
from api.cli.field_setting import FieldSettingError, parse_setting, with_settings
from api.cli.printable import printable
from api.domain.lifecycle import TERMINAL_STATUSES, Action, JobStatus

MONITOR_COMMANDS = ("submit", "list", "show", "watch", "cancel", "pause", "resume", "retry", "clone",
                    "rm", "delete", "events", "alerts", "metrics", "download", "cluster", "queue")
DEFAULT_API_URL = "http://127.0.0.1:8000"
INTERRUPTED = 130


def _handler(command: Callable[[Any, argparse.Namespace], Result]) -> Callable[[argparse.Namespace], int]:
    return lambda args: call_api(args.api_url, args.api_key, args.json, lambda client: command(client, args))


def _width() -> int | None:
    """Tables fit a terminal; piped output is never cut."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def _lines(lines: list[str], empty: str) -> str:
    return "\n".join(lines) if lines else empty


def read_spec(path: Path, settings: list[str] | None = None) -> Any:
    """The spec file's data, changed by ``--set PATH=VALUE`` (``settings``), checked against the
    service's own ``JobSpec`` (what the API checks a body against first, so ``file:`` sources,
    ``tags`` and ``description`` pass) for every bad field at once, before any API is called
    (``grpo dev --submit`` before its stack starts). The data itself is sent, so the server
    applies its own defaults and its submit-time checks. Plain JSON data, as the API makes of a
    YAML body (a date becomes its text), so both judge the same thing."""
    import json

    from api.domain.job_spec import JobSpec
    from grpo_core.errors import SpecError
    from grpo_core.spec.spec_file import parse_spec, read_spec_data

    data = read_spec_data(path)  # raises InvalidSpec: exit 2, naming the file
    if settings and isinstance(data, dict):  # anything else is refused by parse_spec
        try:
            data = with_settings(data, settings)
        except FieldSettingError as exc:
            raise SpecError("--set", str(exc)) from None
    data = json.loads(json.dumps(data, default=str))
    parse_spec(data, JobSpec)  # raises InvalidSpec: exit 2 with one line per field
    return data


def submit_spec(url: str, api_key: str | None, spec: dict, watch: bool = True,
                idempotency_key: str | None = None, as_json: bool = False) -> int:
    """Submit ``spec``; with ``watch`` follow it to its end (``grpo dev --submit`` too)."""

    def command(client: Any) -> Result:
        job = client.submit(spec, idempotency_key=idempotency_key)
        if not as_json:  # --json prints the answer, which holds them
            print_spec_warnings(job)
        submitted = f"submitted job {job['id']} ({job['name']}): {job['status']}"
        if not watch:
            return Result(job, submitted)
        if not as_json:
            print(printable(submitted), flush=True)
        return follow(client, job, as_json)

    return call_api(url, api_key, as_json, command)


def print_spec_warnings(job: dict[str, Any]) -> None:
    """What the service took from the spec but ignores (a TRL field left at its "off" value), on
    stderr as ``grpo train`` prints it: the answer to the submit is the one place it is told."""
    for warning in job.get("warnings") or ():
        print(printable(f"warning: {warning['param']}: {warning['message']}"), file=sys.stderr)


def follow(client: Any, job: dict[str, Any], as_json: bool) -> Result:
    """Stream the job until it ends: a frame redrawn in place on a terminal, one line per step
    otherwise, nothing with ``--json`` (which prints the final job record)."""
    from api.cli.term_view import WatchView, final_line, repaint, step_line

    out, view = sys.stdout, WatchView.of(job)
    live = not as_json and out.isatty()
    drawn = 0

    def draw() -> None:
        nonlocal drawn
        frame = [printable(line) for line in view.lines(shutil.get_terminal_size().columns)]
        out.write(repaint(drawn, frame))
        out.flush()
        drawn = len(frame)

    def show(message: dict[str, Any]) -> None:
        view.update(message)
        if live:
            draw()
        elif not as_json and (line := step_line(message, view.max_steps)):
            print(printable(line), file=out, flush=True)

    if live:
        draw()
    try:
        client.watch(job["id"], show)
    except KeyboardInterrupt:
        print(f"\nstopped watching job {job['id']}; it goes on (`grpo cancel {job['id']}` stops it)",
              file=sys.stderr)
        return Result(job, "", INTERRUPTED)
    job = client.job(job["id"])
    return Result(job, final_line(job), 0 if job["status"] == JobStatus.SUCCEEDED else 1)


def _submit(args: argparse.Namespace) -> int:
    spec = read_spec(args.spec, args.set)
    if args.estimate:
        from api.cli.estimate_command import estimate_spec

        return estimate_spec(args.api_url, args.api_key, spec, args.json)
    return submit_spec(args.api_url, args.api_key, spec, args.watch, args.idempotency_key, args.json)


def _list(client: Any, args: argparse.Namespace) -> Result:
    from api.cli.term_view import jobs_table

    statuses = [status for value in args.status or [] for status in value]
    tags = [tag for value in args.tag or [] for tag in value]
    page = client.list_jobs(statuses, None if args.all else args.limit, newest_first=not args.oldest_first,
                            tags=tags, search=args.search)
    text = _lines(jobs_table(page["items"], _width()), "no jobs")
    if page["next_after"] is not None:
        which = "oldest" if args.oldest_first else "newest"
        text += f"\n(showing the {which} {len(page['items'])}: --limit N or --all for more)"
    return Result(page, text)


def _show(client: Any, args: argparse.Namespace) -> Result:
    from api.cli.term_view import job_details

    job = client.job(args.job_id)
    if args.spec:  # asked for the spec alone, to read or reuse: the job's status is not the answer
        import yaml

        text = yaml.safe_dump(job["spec"], sort_keys=False, allow_unicode=True)
        return Result(job["spec"], text.rstrip("\n"))
    # exit 1, as `grpo watch` does for a job that ended without succeeding
    failed = job["status"] in TERMINAL_STATUSES and job["status"] != JobStatus.SUCCEEDED
    return Result(job, "\n".join(job_details(job, _width(), client.team_name(job["team_id"]))), int(failed))


def _watch(client: Any, args: argparse.Namespace) -> Result:
    return follow(client, client.job(args.job_id), args.json)


def _cancel(client: Any, args: argparse.Namespace) -> Result:
    job = client.cancel(args.job_id)
    stopping = job["status"] == JobStatus.CANCELLING
    later = " (it stops after its current step, with a checkpoint)" if stopping else ""
    return Result(job, f"job {job['id']} {job['status']}{later}")


def _delete(client: Any, args: argparse.Namespace) -> Result:
    client.delete(args.job_id)
    return Result({"id": args.job_id, "deleted": True}, f"job {args.job_id} deleted, with its artifacts")


def _action_note(job: dict[str, Any]) -> str:
    """What a pause, resume or retry sets going: a job back in the queue continues from its
    newest checkpoint, and without one it starts over."""
    if job["status"] == JobStatus.PAUSING:
        return " (it checkpoints at its next step, then frees its GPUs)"
    if job["status"] != JobStatus.QUEUED:
        return ""
    if job.get("latest_checkpoint"):
        return f" (it continues from its checkpoint {PurePath(job['latest_checkpoint']).name})"
    if job.get("last_step"):
        return f" (it has no checkpoint: it starts over from step 0; steps 1-{job['last_step']} run again)"
    return " (it has no checkpoint: it starts from step 0)"


def _action(action: str) -> Callable[[Any, argparse.Namespace], Result]:
    def command(client: Any, args: argparse.Namespace) -> Result:
        job = client.act(args.job_id, action)
        return Result(job, f"job {job['id']} {job['status']}{_action_note(job)}")

    return command


def _clone(client: Any, args: argparse.Namespace) -> Result:
    from grpo_core.spec.spec_file import merged_fields, read_spec_data

    changes = None
    if args.changes is not None:
        changes = read_spec_data(args.changes)  # the server validates the changed spec
    if args.set:
        if not isinstance(changes, dict | None):
            raise BadArgument(f"--changes: {args.changes} is not a mapping of fields")
        # A list item (rewards.0.weight) is set within the job's list: the whole changed spec is sent.
        spec = merged_fields(client.job(args.job_id)["spec"], changes or {})
        try:
            changes = with_settings(spec, args.set)
        except FieldSettingError as exc:
            raise BadArgument(f"--set {exc}") from None
    job = client.clone(args.job_id, changes)
    if not args.json:
        print_spec_warnings(job)
    text = f"submitted job {job['id']} ({job['name']}), a clone of job {args.job_id}: {job['status']}"
    return Result(job, text)


def _events(client: Any, args: argparse.Namespace) -> Result:
    from api.cli.term_view import events_table

    page = client.events(args.job_id)
    return Result(page, _lines(events_table(page["items"], _width()) if page["items"] else [], "no events"))


def _alerts(client: Any, args: argparse.Namespace) -> Result:
    from api.cli.term_view import alerts_table
    from grpo_core.run.callbacks import ALERT_EVENT

    items = [event for event in client.events(args.job_id)["items"] if event["type"] == ALERT_EVENT]
    return Result({"items": items}, _lines(alerts_table(items, _width()) if items else [],
                                           f"no alerts: no health rule of job {args.job_id} has tripped"))


def _metrics(client: Any, args: argparse.Namespace) -> Result:
    from api.cli.term_view import EVAL_MARK, eval_metric_names, eval_points, metric_names, metrics_table

    names = [name for value in args.names or [] for name in value]
    # --eval --names: the mark that tells an eval point is read along with the names.
    page = client.metrics(args.job_id, [*names, EVAL_MARK] if args.eval and names else names)
    if args.eval:  # the eval points only, with the eval columns unless --names chose others
        page = {**page, "items": eval_points(page["items"])}
        names = names or eval_metric_names(page["items"])
        if not page["items"]:
            return Result(page, f"no eval steps yet (job {args.job_id} evaluates only with an eval_dataset "
                                "and grpo.eval_strategy: steps)")
    recorded = {name for record in page["items"] for name in record["values"]}
    if names and page["items"] and (unknown := [name for name in names if name not in recorded]):
        known = ", ".join(sorted(client.metrics(args.job_id)["items"][-1]["values"]))
        raise BadArgument(f"--names: no step of job {args.job_id} has {', '.join(unknown)}; it has {known}")
    if not args.csv:
        return Result(page, _lines(metrics_table(page["items"], names, _width()) if page["items"] else [],
                                   "no steps yet"))
    import csv
    import io

    columns = names or metric_names(page["items"])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", *columns])
    writer.writerows([record["step"], *(record["values"].get(name) for name in columns)]
                     for record in page["items"])
    return Result(page, buffer.getvalue().rstrip("\n"))


def _download(client: Any, args: argparse.Namespace) -> Result:
    """The job's final model (or a kept checkpoint's, with ``--step``) unpacked into ``-o DIR``,
    ready for ``from_pretrained(DIR)``. The archive is fetched beside DIR first, so a second run
    after a broken connection continues it."""
    from api.cli.archives import unpack_into

    out: Path = args.output
    what = "model" if args.step is None else f"checkpoints/{args.step}/archive"
    archive = out.with_name(f".{out.name}.tar.partial")
    size = client.download(f"/v1/jobs/{args.job_id}/{what}", archive)
    files = unpack_into(archive, out)
    archive.unlink()
    which = "final model" if args.step is None else f"checkpoint of step {args.step}"
    document = {"job_id": args.job_id, "step": args.step, "path": str(out), "bytes": size, "files": files}
    return Result(document, f"job {args.job_id}'s {which}: {len(files)} files ({size:,} bytes) in {out}")


def _cluster(client: Any, args: argparse.Namespace) -> Result:
    from datetime import UTC, datetime

    from api.cli.cluster_view import cluster_lines

    cluster, queue = client.cluster(), client.queue()
    text = "\n".join(cluster_lines(cluster, queue, datetime.now(UTC), _width()))
    return Result({"cluster": cluster, "queue": queue}, text)


def _queue(client: Any, args: argparse.Namespace) -> Result:
    from datetime import UTC, datetime

    from api.cli.cluster_view import queue_lines

    queue = client.queue(args.pool)
    if args.pool is not None and args.pool not in {pool["name"] for pool in client.cluster()["pools"]}:
        raise BadArgument(f"--pool: no pool '{args.pool}'")
    return Result(queue, "\n".join(queue_lines(queue, datetime.now(UTC), _width())))


def _empty_folder(text: str) -> Path:
    path = Path(text)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise argparse.ArgumentTypeError(f"'{text}' exists and is not an empty folder")
    return path


def _setting(text: str) -> str:
    """``--set PATH=VALUE``, its form checked at once; applied once the spec is read."""
    try:
        parse_setting(text)
    except FieldSettingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _names(text: str) -> list[str]:
    """``a,b`` → ``["a", "b"]`` (for options that may be repeated too)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number >= 1")
    return int(text)


def common_options() -> argparse.ArgumentParser:
    """--api-url, --api-key and --json: every client command takes them."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api-url", default=os.environ.get("GRPO_API_URL", DEFAULT_API_URL),
                        help=f"default: GRPO_API_URL, else {DEFAULT_API_URL}")
    common.add_argument("--api-key", default=os.environ.get("GRPO_API_KEY"), help="default: GRPO_API_KEY")
    common.add_argument("--json", action="store_true", help="print the API's JSON (one document)")
    return common


def add_monitor_commands(commands: argparse._SubParsersAction) -> None:
    """The HTTP client commands; ``commands`` is the ``grpo`` parser's subcommands."""
    common = common_options()

    def add(name: str, help_: str, command: Callable[[Any, argparse.Namespace], Result] | None = None,
            job_id: bool = True, aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_, parents=[common], aliases=list(aliases))
        if job_id:
            parser.add_argument("job_id", type=int, metavar="ID")
        if command is not None:
            parser.set_defaults(handler=_handler(command))
        return parser

    submit = add("submit", "submit a spec over HTTP (--watch follows it)", job_id=False)
    submit.add_argument("spec", type=Path)
    submit.add_argument("--watch", action="store_true",
                        help="follow the job until it ends (exit 0: succeeded)")
    submit.add_argument("--idempotency-key", default=None)
    submit.add_argument("--estimate", action="store_true",
                        help="submit nothing: check it as a submit would and print its GPU-hours estimated")
    _add_set_option(submit)
    submit.set_defaults(handler=_submit)
    jobs = add("list", "jobs, newest first", _list, job_id=False)
    jobs.add_argument("--oldest-first", action="store_true", help="in submission order instead")
    jobs.add_argument("--status", type=_names, action="extend", nargs="+", metavar="S",
                      help="only jobs in these statuses (several, repeated or comma-separated)")
    jobs.add_argument("--tag", type=_names, action="extend", nargs="+", metavar="T",
                      help="only jobs with all these tags (several, repeated or comma-separated)")
    jobs.add_argument("--search", default=None, metavar="TEXT",
                      help="only jobs whose name or description holds TEXT (ignoring case)")
    jobs.add_argument("--limit", type=_positive, default=50, metavar="N", help="at most N jobs (default 50)")
    jobs.add_argument("--all", action="store_true", help="every job, however many")
    show = add("show", "one job: status, progress, placement, times, error", _show)
    show.add_argument("--spec", action="store_true", help="only the job's spec, as YAML (exit 0)")
    add("watch", "follow a job live until it ends (exit 0: succeeded)", _watch)
    add("cancel", "cancel a job (a running one stops at its next step, with a checkpoint)", _cancel)
    add("pause", "pause a job: it checkpoints, frees its GPUs and waits to be resumed", _action(Action.PAUSE))
    add("resume", "put a paused job back in the queue, to continue from its checkpoint (if it has one)",
        _action(Action.RESUME))
    add("retry", "put a failed or cancelled job back in the queue, to continue from its last checkpoint "
        "(from step 0 without one)", _action(Action.RETRY))
    clone = add("clone", "submit a copy of a job's spec, changed by a file of fields if given", _clone)
    clone.add_argument("--changes", type=Path, default=None, metavar="FILE",
                       help="fields to change, nested as in a spec (grpo: {max_steps: 10})")
    _add_set_option(clone)
    add("rm", "delete a finished job: its records, checkpoints and final model (frees the team's artifact "
        "quota; not undone)", _delete, aliases=("delete",))
    add("events", "a job's lifecycle events", _events)
    add("alerts", "a job's health alerts: each trip of a rule (grpo_core.spec.alerts), with what it watches",
        _alerts)
    metrics = add("metrics", "a job's metrics, every step", _metrics)
    metrics.add_argument("--csv", action="store_true", help="CSV: a header step,<names...>, one row per step")
    metrics.add_argument("--names", type=_names, action="append", metavar="A,B",
                         help="only these metrics, in this order (default: all, sorted, for --csv)")
    metrics.add_argument("--eval", action="store_true",
                         help="only the steps that evaluated (step 0: before training), with their eval "
                         "metrics")
    download = add("download", "a job's final model (or a checkpoint) as a folder from_pretrained loads",
                   _download)
    download.add_argument("-o", "--output", type=_empty_folder, required=True, metavar="DIR",
                          help="an empty or new folder")
    download.add_argument("--step", type=_positive, default=None, metavar="N",
                          help="a kept checkpoint instead")
    add("cluster", "pools, workers, GPU use, every team's use against its quota, and the queue", _cluster,
        job_id=False)
    queue = add("queue", "waiting jobs in the scheduler's order, with why each waits", _queue, job_id=False)
    queue.add_argument("--pool", default=None, help="only this pool")


def _add_set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", type=_setting, action="append", default=[], metavar="PATH=VALUE",
                        help="change one field (grpo.learning_rate=2e-6, rewards.0.weight=2), after "
                        "any --changes; repeatable. VALUE is YAML; 2e-6 is a number")
