"""``/v1/webhooks``: a team's notification endpoints and what was sent to them. A member
registers and sees its own team's; an admin sees every team's and may register one for any team
(``team`` in the body). Another team's webhook is a 404, as if it did not exist. Sending is not
done here: the scheduler process's sender does it (``api.scheduling.webhook_sender``)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, status

from api.domain_errors import Forbidden, InvalidInput, NotFound
from api.http.deps import PrincipalDep, SessionDep, SettingsDep
from api.http.params import WebhookId
from api.schemas.jobs import Page
from api.schemas.webhooks import DeliveryRead, WebhookCreate, WebhookCreated, WebhookRead
from api.store import webhooks
from api.store.teams import team_id_by_name

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
_404 = {404: {"description": "No such webhook (or another team's)"}}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=WebhookCreated,
             responses={403: {"description": "`team` given by a member key"},
                        404: {"description": "No such team"},
                        422: {"description": "A bad URL, event or host; `param` names the field"}})
def create_webhook(body: WebhookCreate, session: SessionDep, principal: PrincipalDep,
                   settings: SettingsDep) -> WebhookCreated:
    """Deliveries of ``events`` for the team's jobs are POSTed to ``url``, signed with the
    returned ``secret`` (shown only in this answer; see docs/user_guide.md, Notifications)."""
    allowed = settings.webhook_hosts
    if allowed and (urlsplit(body.url).hostname or "").lower() not in allowed:
        raise InvalidInput(f"webhooks may only call these hosts: {', '.join(sorted(allowed))}", param="url")
    team_id = principal.team_id
    if body.team is not None:
        if not principal.is_admin:
            raise Forbidden("only admins may register a webhook for a named team", param="team")
        found = team_id_by_name(session, body.team)
        if found is None:
            raise NotFound(f"team '{body.team}' not found", param="team")
        team_id = found
    return webhooks.create_webhook(session, team_id, body.url, list(body.events))


@router.get("", response_model=Page[WebhookRead])
def list_webhooks(session: SessionDep, principal: PrincipalDep) -> Page[WebhookRead]:
    return Page[WebhookRead](items=webhooks.list_webhooks(session, principal.scope), next_after=None)


@router.get("/{webhook_id}", response_model=WebhookRead, responses=_404)
def get_webhook(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep) -> WebhookRead:
    return webhooks.get_webhook(session, webhook_id, principal.scope)


@router.delete("/{webhook_id}", response_model=WebhookRead, responses=_404)
def delete_webhook(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep) -> WebhookRead:
    """Stop sending to it; its deliveries, pending ones too, go with it."""
    return webhooks.delete_webhook(session, webhook_id, principal.scope)


@router.get("/{webhook_id}/deliveries", response_model=Page[DeliveryRead], responses=_404)
def list_deliveries(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep,
                    after: Annotated[int, Query(ge=0, description="The last id seen (0: newest)")] = 0,
                    limit: Annotated[int, Query(ge=1, le=200)] = 50) -> Page[DeliveryRead]:
    """Newest first: each delivery's status, attempts, last answer and times."""
    items = webhooks.list_deliveries(session, webhook_id, principal.scope, after, limit)
    return Page[DeliveryRead](items=items, next_after=items[-1].id if len(items) == limit else None)
