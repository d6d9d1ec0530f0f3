"""How a webhook delivery is signed, so that its receiver can tell it came from us, unchanged
and recently (the scheme of Stripe's and Standard Webhooks' signatures).

Each request carries ``Webhook-Id`` (the delivery's id: the same on every retry, so a receiver
can drop a repeat), ``Webhook-Timestamp`` (Unix seconds when this attempt was signed) and
``Webhook-Signature: v1=<hex>``, the HMAC-SHA256, keyed with the webhook's secret, of
``f"{timestamp}.{body}"`` over the exact body bytes. The timestamp is signed so a captured request
cannot be replayed later: receivers should refuse one older than a few minutes. ``v1`` names the
scheme, so a later one can be sent beside it. Standard library only; docs/user_guide.md (Notifications)
shows a receiver's check in five lines.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SCHEME = "v1"
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A webhook's signing secret: 32 random bytes, hex, with a prefix that tells what it is."""
    return SECRET_PREFIX + secrets.token_hex(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Webhook-Signature`` value of ``body`` signed at ``timestamp``."""
    signed = f"{timestamp}.".encode() + body
    return f"{SCHEME}=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signed_headers(delivery_id: int, secret: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header of a delivery's request, the signature's included."""
    return {"Content-Type": "application/json", "User-Agent": "grpo-webhooks/1",
            "Webhook-Id": str(delivery_id), "Webhook-Timestamp": str(timestamp),
            "Webhook-Signature": signature(secret, timestamp, body)}

