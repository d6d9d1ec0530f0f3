"""Wire schemas of per-team webhooks (``/v1/webhooks``) and their deliveries.

A webhook's URL follows the verifiers' rules (http or https, a host, no credentials in it); where
it may point (public addresses, ``GRPO_WEBHOOK_ALLOWED_NETWORKS``, ``GRPO_WEBHOOK_ALLOWED_HOSTS``)
is checked by the route, which has the settings, through :mod:`grpo_core.egress`.
The secret is shown once, in :class:`WebhookCreated`; reads never carry it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.schemas.jobs import UtcDatetime
from api.vocabulary import NAME_PATTERN
from grpo_core.rewards.verifier_endpoint import MAX_URL_LENGTH, check_verifier_url

# A job reaching each final status, ``job.eval``: an eval point's metrics recorded,
# ``job.alert``: a health rule tripped (grpo_core.spec.alerts), and ``job.budget``: a GPU-hour
# budget paused it (api.store.budgets).
WEBHOOK_EVENTS = ("job.succeeded", "job.failed", "job.cancelled", "job.eval", "job.alert", "job.budget")
WebhookEvent = Literal["job.succeeded", "job.failed", "job.cancelled", "job.eval", "job.alert", "job.budget"]
DeliveryStatus = Literal["pending", "delivered", "failed"]
DeliveryError = Literal["timeout", "connect_failed", "tls", "http_status", "destination_not_allowed"]


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=MAX_URL_LENGTH, description="http(s) URL events are POSTed to; no "
                                                            "credentials in it (verify the signature)")
    events: list[WebhookEvent] = Field(min_length=1, max_length=len(WEBHOOK_EVENTS),
                                       description="The events to send: " + ", ".join(WEBHOOK_EVENTS))
    team: str | None = Field(None, max_length=64, pattern=NAME_PATTERN,
                             description="Admins only: the team whose jobs it follows (default: the "
                                         "caller's own)")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_verifier_url(url)

    @field_validator("events")
    @classmethod
    def _each_once(cls, events: list[str]) -> list[str]:
        return sorted(set(events), key=WEBHOOK_EVENTS.index)


class WebhookRead(BaseModel):
    id: int
    team_id: int
    url: str
    events: list[str]
    created_at: UtcDatetime


class WebhookCreated(WebhookRead):
    secret: str = Field(description="Signs every delivery (`Webhook-Signature`); shown only now")


class DeliveryRead(BaseModel):
    id: int
    webhook_id: int
    job_id: int
    event: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: UtcDatetime | None = Field(description="When it is tried again (pending only)")
    last_status_code: int | None
    last_error: DeliveryError | None = Field(description="Why the last attempt failed, as a class "
                                             "only: never the receiver's answer or our exception text")
    last_duration_ms: int | None = Field(description="How long the last attempt took")
    created_at: UtcDatetime
    delivered_at: UtcDatetime | None
