"""The database schema checked before a command that uses it runs: ``grpo api``, ``grpo
scheduler`` (``api.cli.main``) and every ``grpo admin`` command (``api.cli.admin``) call it, so it
lives below both."""

from __future__ import annotations

from typing import Any

__all__ = ["schema_ready", "webhook_secrets_sealed"]


def schema_ready(settings: Any) -> None:
    """Migrate a database behind the code (or refuse, with the command): a fresh deployment's
    first command works, and an old schema never meets new code."""
    from api.store.migrate import SchemaBehind, ensure_schema

    try:
        ensure_schema(settings.database_url, settings.auto_migrate)
    except SchemaBehind as exc:
        raise SystemExit(f"error: {exc} (GRPO_AUTO_MIGRATE=false)") from None


def webhook_secrets_sealed(settings: Any) -> None:
    """Every stored webhook secret sealed under the first key of ``GRPO_SECRET_KEY`` (plain ones
    from before encryption, an older key's after a rotation), or exit saying what is wrong."""
    from api.security.secret_box import SecretBox, SecretKeyError
    from api.store import webhooks
    from api.store.db import session_scope

    try:
        with session_scope(settings.database_url) as session:
            webhooks.secrets_readable(session, SecretBox.from_key(settings.secret_key), reseal=True)
    except SecretKeyError as exc:
        raise SystemExit(f"error: {exc}") from None
