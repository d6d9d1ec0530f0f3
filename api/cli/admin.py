"""``grpo admin ...``: teams, quotas, API keys, pools and verifier services, straight on the database
(``GRPO_DATABASE_URL``) through the same store functions as ``/v1/admin``. It needs no key,
which is how the first admin key is made.

Exit codes as the rest of ``grpo``: 0 ok, 2 bad input (invalid value, name taken, no such
team/pool/key), 1 anything else (the database does not answer, is not migrated, ...).
Output is one line per record, or JSON with ``--json``. ``create-key`` prints the key alone on
stdout (so ``KEY=$(grpo admin create-key alpha)`` works) and a note on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from typing import Any

from api.cli.printable import printable

BAD_INPUT_CODES = ("invalid_input", "conflict", "not_found")
_AMOUNT = re.compile(r"([+-]?)(\d+)")

Command = Callable[[Any, argparse.Namespace], Any]  # (session, args) -> what to print


def _amount(text: str) -> tuple[str, int]:
    """``N`` sets the quota; ``+N`` / ``-N`` change it: ``(sign or "", N)``."""
    match = _AMOUNT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"'{text}' is not N, +N or -N (a whole number of GPUs)")
    return match.group(1), int(match.group(2))


def _teams() -> Any:
    # Imported when a command runs: building the ``grpo`` parser must not import SQLAlchemy
    # (``grpo train`` never needs it).
    from api.store import teams

    return teams


def _pools() -> Any:
    from api.store import pools

    return pools


def _set_quota(session: Any, args: argparse.Namespace) -> Any:
    sign, gpus = args.gpus
    if not sign:
        return _teams().set_quota(session, args.team, args.pool, gpus)
    return _teams().change_quota(session, args.team, args.pool, gpus if sign == "+" else -gpus)


LIMIT_FLAGS = ("max_tokens_per_step", "max_steps", "max_checkpoints_per_job", "max_inline_dataset_bytes",
               "max_sandbox_memory_bytes", "job_memory_bytes")


def _limit(text: str) -> int | None:
    """A whole number, or ``default`` (None: the deployment's default again)."""
    if text.strip().lower() == "default":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number or 'default'") from None


def _changed(current: Any, args: argparse.Namespace, flags: tuple[str, ...]) -> Any:
    """``current`` (a limits schema) with the flags given changed (``default``: None); the others
    keep their value. Checked by the schema, the HTTP route's own."""
    from pydantic import ValidationError

    from api.domain.errors import InvalidInput

    given = {name: getattr(args, name) for name in flags if hasattr(args, name)}  # SUPPRESS: not given
    try:
        return type(current).model_validate({**current.model_dump(), **given})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise InvalidInput(f"--{field.replace('_', '-')}: {error['msg']}", param=field) from None


def _set_pool_limits(session: Any, args: argparse.Namespace) -> Any:
    limits = _changed(_pools().get_pool(session, args.pool).limits, args, LIMIT_FLAGS)
    return _pools().set_limits(session, args.pool, limits)


TEAM_LIMIT_FLAGS = ("max_priority", "max_queued_jobs", "reads_per_second", "read_burst", "writes_per_second",
                    "write_burst", "serve_idle_seconds", "gpu_hours_budget", "budget_period")
_TEAM_LIMIT_METAVARS = {"max_priority": "CLASS", "gpu_hours_budget": "HOURS",
                        "budget_period": "day|week|month"}


def _setting(text: str) -> str | None:
    """A value as typed (the schema converts and checks it), or ``default`` (None)."""
    return None if text.strip().lower() == "default" else text


def _set_team_limits(session: Any, args: argparse.Namespace) -> Any:
    limits = _changed(_teams().get_team(session, args.team).limits, args, TEAM_LIMIT_FLAGS)
    return _teams().set_limits(session, args.team, limits)


def _verifiers() -> Any:
    from api.store import verifiers

    return verifiers


def _set_verifier(session: Any, args: argparse.Namespace) -> Any:
    """The whole registration from the flags; the secret from an environment variable, so it is
    in no shell history or process listing."""
    import os

    from pydantic import ValidationError

    from api.domain.errors import InvalidInput
    from api.schemas.verifiers import VerifierSet

    secret = None
    if args.auth_secret_env is not None:
        secret = os.environ.get(args.auth_secret_env)
        if secret is None:
            raise InvalidInput(f"--auth-secret-env: ${args.auth_secret_env} is not set", param="auth_secret")
    fields = {"team": args.team, "pool": args.pool, "url": args.url, "auth_header": args.auth_header,
              "auth_secret": secret, "timeout_seconds": args.timeout_seconds,
              "max_concurrency": args.max_concurrency, "max_batch_size": args.max_batch_size}
    try:
        body = VerifierSet.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "verifier"
        # Never the input: it may be the secret.
        raise InvalidInput(f"--{field.replace('_', '-')}: {error['msg']}", param=field) from None
    return _verifiers().set_verifier(session, args.name, body)


def _create_key(session: Any, args: argparse.Namespace) -> Any:
    from api.schemas.admin import KeyCreated

    record, key = _teams().create_key(session, args.team, args.admin, args.label)
    return KeyCreated(**record.model_dump(), key=key)


def _line(record: Any) -> str:
    from api.schemas.admin import KeyRead, PoolRead, TeamRead
    from api.schemas.verifiers import VerifierRead

    if isinstance(record, TeamRead):
        quotas = ", ".join(f"{pool}={gpus}" for pool, gpus in record.quotas.items()) or "none"
        artifacts = "none" if record.artifact_quota_bytes is None else record.artifact_quota_bytes
        limits = ", ".join(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
                           for name, value in record.limits.model_dump(exclude_none=True).items())
        return (f"{record.name}\tid={record.id}\tweight={record.weight:g}\tquotas: {quotas}"
                f"\tartifact_quota_bytes={artifacts}\tlimits: {limits or 'defaults'}")
    if isinstance(record, KeyRead):
        state = f"revoked {record.revoked_at:%Y-%m-%d %H:%M}" if record.revoked_at else "active"
        role = "admin" if record.is_admin else "member"
        return f"{record.id}\t{record.prefix}…\t{record.team}\t{role}\t{state}\t{record.label or ''}"
    if isinstance(record, PoolRead):
        gpus = "-" if record.max_worker_gpus is None else record.max_worker_gpus
        total = "-" if record.total_gpus is None else record.total_gpus  # the most a job may ask
        overrides = record.limits.model_dump(exclude_none=True)
        limits = ", ".join(f"{name}={value}" for name, value in overrides.items())
        return (f"{record.name}\t{'held' if record.held else 'open'}\tmax_worker_gpus={gpus}\t"
                f"total_gpus={total}\tlimits: {limits or 'defaults'}")
    if isinstance(record, VerifierRead):
        scope = f"team={record.team}" if record.team is not None else f"pool={record.pool}"
        auth = f"{record.auth_header}: (secret set)" if record.auth_secret_set else "no auth"
        return (f"{record.name}\t{scope}\t{record.url}\t{auth}\ttimeout={record.timeout_seconds:g}s\t"
                f"concurrency={record.max_concurrency}\tbatch={record.max_batch_size}")
    raise TypeError(f"nothing prints a {type(record).__name__}")


def _print(result: Any, as_json: bool) -> None:
    from api.schemas.admin import KeyCreated

    if as_json:
        dump = [r.model_dump(mode="json") for r in result] if isinstance(result, list) else \
            result.model_dump(mode="json")
        print(json.dumps(dump, indent=2))
    elif isinstance(result, KeyCreated):
        print(result.key)
        role = "an admin key" if result.is_admin else "a key"
        print(f"created {role} of team '{printable(result.team)}' (id {result.id}, {result.prefix}…); "
              "it is shown only this once: store it now", file=sys.stderr)
    else:
        for record in result if isinstance(result, list) else [result]:
            print(printable(_line(record)))


def _handler(command: Command) -> Callable[[argparse.Namespace], int]:
    """One transaction per command; output only after it committed (a key is printed only once
    it is stored)."""

    def handler(args: argparse.Namespace) -> int:
        from sqlalchemy.exc import SQLAlchemyError

        from api.cli.schema_check import schema_ready
        from api.domain.errors import ServiceError
        from api.settings import get_settings
        from api.store.db import session_scope

        settings = get_settings()
        url = settings.database_url
        try:
            schema_ready(settings)  # a fresh deployment's first `grpo admin create-team` works
            with session_scope(url) as session:
                result = command(session, args)
        except ServiceError as exc:
            print(f"error: {printable(exc.message)}", file=sys.stderr)
            return 2 if exc.code in BAD_INPUT_CODES else 1
        except SQLAlchemyError as exc:
            print(f"error: database: {exc.__class__.__name__}: {str(exc).splitlines()[0]} "
                  "(is GRPO_DATABASE_URL right and migrated? `python -m api.store.migrate`)", file=sys.stderr)
            return 1
        _print(result, args.json)
        return 0

    return handler


def add_admin_commands(commands: argparse._SubParsersAction) -> None:
    """``grpo admin COMMAND``; ``commands`` is the ``grpo`` parser's subcommands."""
    admin = commands.add_parser("admin", help="teams, quotas, API keys, pools, verifiers (on the database)")
    sub = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    def add(name: str, help_: str, command: Command, *arguments: tuple[str, dict[str, Any]]) -> None:
        parser = sub.add_parser(name, help=help_)
        for flag, options in arguments:
            parser.add_argument(flag, **options)
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(handler=_handler(command))

    team = ("team", {"help": "team name"})
    pool = ("pool", {"help": "pool name"})
    add("create-team", "create a team", lambda s, a: _teams().create_team(s, a.name, a.weight),
        ("name", {}), ("--weight", {"type": float, "default": 1.0, "help": "fair-share weight (> 0)"}))
    add("list-teams", "teams with their weights and quotas", lambda s, a: _teams().list_teams(s))
    add("set-weight", "set a team's fair-share weight", lambda s, a: _teams().set_weight(s, a.team, a.weight),
        team, ("weight", {"type": float}))
    add("set-quota", "set (N) or change (+N, -N) a team's GPU quota in a pool", _set_quota,
        team, pool, ("gpus", {"type": _amount, "metavar": "N|+N|-N"}))
    add("clear-quota", "remove a team's quota in a pool (no limit but capacity)",
        lambda s, a: _teams().clear_quota(s, a.team, a.pool), team, pool)
    add("set-artifact-quota", "set the most bytes a team's jobs' checkpoints may occupy",
        lambda s, a: _teams().set_artifact_quota(s, a.team, a.bytes), team,
        ("bytes", {"type": int, "metavar": "BYTES"}))
    add("clear-artifact-quota", "remove a team's artifact byte quota (no limit but the disk)",
        lambda s, a: _teams().set_artifact_quota(s, a.team, None), team)
    add("set-team-limits", "change a team's limits (each flag: a value, or 'default')", _set_team_limits,
        team, *((f"--{name.replace('_', '-')}", {"type": _setting, "default": argparse.SUPPRESS,
                                                  "metavar": _TEAM_LIMIT_METAVARS.get(name, "N")})
                for name in TEAM_LIMIT_FLAGS))
    add("create-key", "create an API key; prints the key (once) on stdout", _create_key, team,
        ("--admin", {"action": "store_true", "help": "an admin key: every team, /v1/admin"}),
        ("--label", {"default": None, "help": "a note for listings (<= 128 characters)"}))
    add("list-keys", "API keys (prefixes only)", lambda s, a: _teams().list_keys(s, a.team),
        ("--team", {"default": None, "help": "only this team's"}))
    add("revoke-key", "revoke an API key (idempotent)", lambda s, a: _teams().revoke_key(s, a.key_id),
        ("key_id", {"type": int, "metavar": "ID"}))
    add("create-pool", "create a GPU pool", lambda s, a: _pools().create_pool(s, a.name), ("name", {}))
    add("list-pools", "GPU pools", lambda s, a: _pools().list_pools(s))
    add("set-pool-limits", "change a pool's limits (each flag: a number, or 'default')", _set_pool_limits,
        pool, *((f"--{name.replace('_', '-')}", {"type": _limit, "default": argparse.SUPPRESS,
                                                  "metavar": "N"}) for name in LIMIT_FLAGS))
    add("set-verifier", "register (or replace) a verifier service for a team's or a pool's http_verifier "
        "rewards", _set_verifier, ("name", {}), ("--url", {"required": True, "help": "http(s) URL"}),
        ("--team", {"default": None, "help": "the team whose jobs may use it"}),
        ("--pool", {"default": None, "help": "the pool whose jobs may use it"}),
        ("--auth-header", {"default": None, "metavar": "NAME", "help": "header carrying the secret"}),
        ("--auth-secret-env", {"default": None, "metavar": "VAR",
                               "help": "environment variable holding the header's value"}),
        ("--timeout-seconds", {"type": float, "default": 10.0, "help": "one request's limit"}),
        ("--max-concurrency", {"type": int, "default": 4, "help": "requests in flight per job"}),
        ("--max-batch-size", {"type": int, "default": 64, "help": "rows per request"}))
    add("list-verifiers", "registered verifier services (secrets never shown)",
        lambda s, a: _verifiers().list_verifiers(s))
    add("delete-verifier", "remove a verifier service's registration",
        lambda s, a: _verifiers().delete_verifier(s, a.name), ("name", {}))
    add("hold", "stop dispatching into a pool", lambda s, a: _pools().set_held(s, a.pool, held=True), pool)
    add("resume", "dispatch into a held pool again", lambda s, a: _pools().set_held(s, a.pool, held=False),
        pool)
