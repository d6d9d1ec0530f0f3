"""Webhook delivery records keep a class of error and a duration, nothing a receiver said.

``last_duration_ms`` is new (empty for attempts made before). ``last_error`` held our exception's
text ("ConnectError: [Errno 111] Connection refused", a proxy's words, …), which let a team read
what answered on an internal address; each stored one becomes the class it names (``timeout``,
``tls``, ``http_status``, else ``connect_failed``), so no old text stays readable.

Webhook secrets are encrypted under ``GRPO_SECRET_KEY`` by the scheduler at its start
(:func:`api.store.webhooks.secrets_readable`): a migration does not hold the operator's key, and
the plain secrets of older rows stay readable to the code until then.

Revision ID: 0015_webhook_egress
Revises: 0014_gangs
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_webhook_egress"
down_revision: str | Sequence[str] | None = "0014_gangs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CLASSES = (("%Timeout%", "timeout"), ("%SSL%", "tls"), ("%CERTIFICATE%", "tls"), ("HTTP %", "http_status"))


def upgrade() -> None:
    op.add_column("webhook_deliveries", sa.Column("last_duration_ms", sa.Integer(), nullable=True))
    deliveries = sa.table("webhook_deliveries", sa.column("last_error", sa.Text()))
    known = ("timeout", "connect_failed", "tls", "http_status", "destination_not_allowed")
    for pattern, error_class in _CLASSES:
        op.execute(deliveries.update().where(deliveries.c.last_error.like(pattern),
                                             deliveries.c.last_error.notin_(known))
                   .values(last_error=error_class))
    op.execute(deliveries.update().where(deliveries.c.last_error.isnot(None),
                                         deliveries.c.last_error.notin_(known))
               .values(last_error="connect_failed"))


def downgrade() -> None:
    op.drop_column("webhook_deliveries", "last_duration_ms")
