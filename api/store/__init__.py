"""Persistence: the SQL system of record (``tables``, ``db``, ``migrate`` and one repository
module per aggregate: ``jobs``, ``attempts``, ``dispatching``, ``telemetry``, ``teams``, ``pools``,
``verifiers``, ``webhooks``, ``files`` (a team's uploads); the sender's side of webhook
deliveries: ``webhook_deliveries``),
API-key hashing (``api_keys``), the Redis layout of live state (``bus``; its key
names are ``api.redis_keys``'s) and the outbox that publishes what a transaction wrote once it commits
(``outbox``); docs/architecture.md §7 names the rest.

Repository functions take a ``Session`` and return wire schemas (``api.schemas``) or plain
values; callers own the transaction (``api.store.db.session_scope``). May import:
``api.schemas``, ``api.vocabulary``, ``api.domain.lifecycle``, ``api.settings``, ``api.domain.errors``,
``grpo_core.spec.run_spec``. Never ``api.http``, ``api.scheduling`` (beyond its pure ``policy`` types),
``api.streaming``, ``api.cli`` or ``worker``.
"""
