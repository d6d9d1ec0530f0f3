"""The database schema checked before a command that uses it runs: ``grpo api``, ``grpo
scheduler`` (``api.cli.main``) and every ``grpo admin`` command (``api.cli.admin``) call it, so it
lives below both."""

from __future__ import annotations

from typing import Any

__all__ = ["schema_ready"]


def schema_ready(settings: Any) -> None:
    """Migrate a database behind the code (or refuse, with the command): a fresh deployment's
    first command works, and an old schema never meets new code."""
    from api.store.migrate import SchemaBehind, ensure_schema

    try:
        ensure_schema(settings.database_url, settings.auto_migrate)
    except SchemaBehind as exc:
        raise SystemExit(f"error: {exc} (GRPO_AUTO_MIGRATE=false)") from None
