"""``/v1/webhooks``: a team's notification endpoints and what was sent to them. A member
registers and sees its own team's; an admin sees every team's and may register one for any team
(``team`` in the body). Another team's webhook is a 404, as if it did not exist. Sending is not
done here: the scheduler process's sender does it (``api.scheduling.webhook_sender``)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, status

from api.domain.errors import Forbidden, InvalidInput, NotFound, Unavailable
from api.http.deps import PrincipalDep, SessionDep, SettingsDep
from api.http.params import WebhookId, id_cursor
from api.schemas.jobs import Page
from api.schemas.webhooks import DeliveryRead, WebhookCreate, WebhookCreated, WebhookRead
from api.security.secret_box import SecretBox
from api.settings import Settings
from api.store import webhooks
from api.store.teams import team_id_by_name
from grpo_core import egress

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
_404 = {404: {"description": "No such webhook (or another team's)"}}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=WebhookCreated,
             responses={403: {"description": "`team` given by a member key"},
                        404: {"description": "No such team"},
                        409: {"description": "The team is at its limit, `GRPO_WEBHOOK_MAX_PER_TEAM`"},
                        422: {"description": "A bad URL, event or host, or a destination not allowed; "
                                             "`param` names the field"},
                        503: {"description": "The operator has not set `GRPO_SECRET_KEY`"}})
def create_webhook(body: WebhookCreate, session: SessionDep, principal: PrincipalDep,
                   settings: SettingsDep) -> WebhookCreated:
    """Deliveries of ``events`` for the team's jobs are POSTed to ``url``, signed with the
    returned ``secret`` (shown only in this answer; see docs/user_guide.md, Notifications)."""
    check_destination(body.url, settings)
    box = SecretBox.from_key(settings.secret_key)
    if box is None:
        raise Unavailable("webhooks are off: the operator has not set GRPO_SECRET_KEY, which their "
                          "secrets are stored under", retry_after=3600)
    team_id = principal.team_id
    if body.team is not None:
        if not principal.is_admin:
            raise Forbidden("only admins may register a webhook for a named team", param="team")
        found = team_id_by_name(session, body.team)
        if found is None:
            raise NotFound(f"team '{body.team}' not found", param="team")
        team_id = found
    return webhooks.create_webhook(session, team_id, body.url, list(body.events), box,
                                   settings.webhook_max_per_team)


def check_destination(url: str, settings: Settings) -> None:
    """Refuse (422 on ``url``) a host outside ``GRPO_WEBHOOK_ALLOWED_HOSTS`` and one whose
    address the egress guard refuses: an address literal in any spelling, or a name that
    resolves to a refused address now. A name that does not resolve at all is accepted: it
    reaches nothing, and every delivery checks the address it connects to (a DNS record added
    later, or changed after this check, is refused there)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    allowed = settings.webhook_hosts
    if allowed and host not in allowed:
        raise InvalidInput(f"webhooks may only call these hosts: {', '.join(sorted(allowed))}", param="url")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        egress.resolve_checked(host, port, egress.EgressPolicy.from_cidrs(settings.webhook_networks))
    except egress.DestinationRefused as exc:
        raise InvalidInput(f"destination not allowed: {host} is {exc.rule}; webhooks reach public "
                           "addresses only, and the networks the operator allows "
                           "(GRPO_WEBHOOK_ALLOWED_NETWORKS)", param="url") from None
    except egress.Unresolved:
        pass


@router.get("", response_model=Page[WebhookRead])
def list_webhooks(session: SessionDep, principal: PrincipalDep,
                  after: Annotated[int, id_cursor("Cursor: `next_after` of the previous page")] = 0,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50) -> Page[WebhookRead]:
    """Oldest first, a page at a time (``next_after``: pass it as ``after`` for the next)."""
    items = webhooks.list_webhooks(session, principal.scope, after, limit)
    return Page[WebhookRead](items=items, next_after=items[-1].id if len(items) == limit else None)


@router.get("/{webhook_id}", response_model=WebhookRead, responses=_404)
def get_webhook(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep) -> WebhookRead:
    return webhooks.get_webhook(session, webhook_id, principal.scope)


@router.delete("/{webhook_id}", response_model=WebhookRead, responses=_404)
def delete_webhook(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep) -> WebhookRead:
    """Stop sending to it; its deliveries, pending ones too, go with it."""
    return webhooks.delete_webhook(session, webhook_id, principal.scope)


@router.get("/{webhook_id}/deliveries", response_model=Page[DeliveryRead], responses=_404)
def list_deliveries(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep,
                    after: Annotated[int, id_cursor("The last id seen (0: newest)")] = 0,
                    limit: Annotated[int, Query(ge=1, le=200)] = 50) -> Page[DeliveryRead]:
    """Newest first: each delivery's status, attempts, last answer and times."""
    items = webhooks.list_deliveries(session, webhook_id, principal.scope, after, limit)
    return Page[DeliveryRead](items=items, next_after=items[-1].id if len(items) == limit else None)
