"""Secrets the service keeps and proves: how a webhook delivery is signed
(:mod:`~api.security.webhook_signing`) and secrets sealed at rest under the operator's key
(:mod:`~api.security.secret_box`)."""
