"""``/v1/admin``: teams, their quotas and API keys, pools and verifier services; admin keys
only (403 otherwise). ``GET /v1/me`` tells any caller who it is. Thin: parse, call
``api.store.teams`` / ``pools`` / ``verifiers`` (which ``grpo admin`` calls too), return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.artifacts.usage import ArtifactUsage, job_artifact_bytes
from api.http.deps import KeyCacheDep, PrincipalDep, SessionDep, SettingsDep, require_admin
from api.http.params import MAX_NAME_LENGTH, KeyId, PoolName, TeamName, VerifierName
from api.http.rate_limit import limits_cache
from api.schemas.admin import (
    ArtifactQuotaSet,
    KeyCreate,
    KeyCreated,
    KeyRead,
    Me,
    PoolCreate,
    PoolLimits,
    PoolRead,
    QuotaChange,
    QuotaSet,
    TeamCreate,
    TeamLimits,
    TeamRead,
    TeamUpdate,
)
from api.schemas.jobs import Page
from api.schemas.verifiers import VerifierRead, VerifierSet
from api.store import files, pools, teams, verifiers
from api.vocabulary import NAME_PATTERN

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)],
                   responses={403: {"description": "Not an admin key"}})
me = APIRouter(tags=["meta"])
_TEAM_404 = {404: {"description": "No such team (or pool)"}}
_POOL_404 = {404: {"description": "No such pool"}}
_VERIFIER_404 = {404: {"description": "No such verifier"}}
_BAD = {422: {"description": "Invalid value; `param` names the field. Nothing was changed"}}


@me.get("/me", response_model=Me)
def whoami(session: SessionDep, principal: PrincipalDep, settings: SettingsDep) -> Me:
    """The caller's key and team, with the team's artifact bytes, its jobs' and its files' apart,
    and its quota (what a member needs to see before a job or an upload fails
    ``artifact_quota_exceeded``, and after deleting jobs or files to free it)."""
    team = teams.team_by_id(session, principal.team_id)
    quota, job_ids = teams.artifact_quota(session, team.id, always=True)
    usage = ArtifactUsage(job_artifact_bytes(settings, job_ids), files.team_file_bytes(session, team.id),
                          quota)
    return Me(team=team.name, team_id=team.id, is_admin=principal.is_admin, key_prefix=principal.key_prefix,
              artifact_bytes=usage.total, job_artifact_bytes=usage.job_bytes, file_bytes=usage.file_bytes,
              artifact_quota_bytes=quota)


@router.post("/teams", status_code=status.HTTP_201_CREATED, response_model=TeamRead,
             responses={409: {"description": "A team of that name exists"}, **_BAD})
def create_team(body: TeamCreate, session: SessionDep) -> TeamRead:
    return teams.create_team(session, body.name, body.weight)


@router.get("/teams", response_model=Page[TeamRead])
def list_teams(session: SessionDep) -> Page[TeamRead]:
    return Page[TeamRead](items=teams.list_teams(session), next_after=None)


@router.patch("/teams/{team}", response_model=TeamRead, responses={**_TEAM_404, **_BAD})
def update_team(team: TeamName, body: TeamUpdate, session: SessionDep) -> TeamRead:
    return teams.set_weight(session, team, body.weight)


@router.put("/teams/{team}/quotas/{pool}", response_model=TeamRead, responses={**_TEAM_404, **_BAD})
def set_quota(team: TeamName, pool: PoolName, body: QuotaSet, session: SessionDep) -> TeamRead:
    """The most GPUs the team may hold in the pool at once."""
    return teams.set_quota(session, team, pool, body.gpus)


@router.patch("/teams/{team}/quotas/{pool}", response_model=TeamRead, responses={**_TEAM_404, **_BAD})
def change_quota(team: TeamName, pool: PoolName, body: QuotaChange, session: SessionDep) -> TeamRead:
    """Add ``delta`` to the quota (no quota counts as 0); a result below 0 is a 422."""
    return teams.change_quota(session, team, pool, body.delta)


@router.delete("/teams/{team}/quotas/{pool}", response_model=TeamRead, responses=_TEAM_404)
def clear_quota(team: TeamName, pool: PoolName, session: SessionDep) -> TeamRead:
    """No quota: the team is limited by the pool's capacity only."""
    return teams.clear_quota(session, team, pool)


@router.put("/teams/{team}/artifact-quota", response_model=TeamRead, responses={**_TEAM_404, **_BAD})
def set_artifact_quota(team: str, body: ArtifactQuotaSet, session: SessionDep) -> TeamRead:
    """The most bytes the team's jobs' artifacts and uploaded files may occupy; a job whose next
    checkpoint would pass it fails ``artifact_quota_exceeded`` before writing it, an upload that
    would is refused with that code."""
    return teams.set_artifact_quota(session, team, body.bytes)


@router.delete("/teams/{team}/artifact-quota", response_model=TeamRead, responses=_TEAM_404)
def clear_artifact_quota(team: str, session: SessionDep) -> TeamRead:
    """No artifact byte quota: the team is limited by the disk only."""
    return teams.set_artifact_quota(session, team, None)


@router.put("/teams/{team}/limits", response_model=TeamRead, responses={**_TEAM_404, **_BAD})
async def set_team_limits(team: TeamName, body: TeamLimits, session: SessionDep,
                          request: Request) -> TeamRead:
    """Replace the team's limits (a null or missing field: the deployment's `GRPO_TEAM_*` default):
    its members' highest priority class, its queue cap, and its read and write rate limits.
    Takes effect at once in this process; other API processes apply it within
    ``GRPO_AUTH_CACHE_SECONDS``. Jobs already queued stay queued."""
    read = await run_in_threadpool(_set_limits_and_commit, session, team, body)
    limits_cache(request.app.state).evict(read.id)
    return read


def _set_limits_and_commit(session: Session, team: str, limits: TeamLimits) -> TeamRead:
    # Committed before the eviction: the next lookup must find the new limits in SQL.
    read = teams.set_limits(session, team, limits)
    session.commit()
    return read


@router.post("/teams/{team}/keys", status_code=status.HTTP_201_CREATED, response_model=KeyCreated,
             responses={**_TEAM_404, **_BAD})
def create_key(team: TeamName, body: KeyCreate, session: SessionDep) -> KeyCreated:
    """A new API key of the team. The key is in this answer only: the service keeps its hash."""
    record, key = teams.create_key(session, team, body.admin, body.label)
    return KeyCreated(**record.model_dump(), key=key)


@router.get("/keys", response_model=Page[KeyRead], responses=_TEAM_404)
def list_keys(session: SessionDep,
              team: Annotated[str | None, Query(max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)] = None,
              ) -> Page[KeyRead]:
    return Page[KeyRead](items=teams.list_keys(session, team), next_after=None)


@router.post("/keys/{key_id}/revoke", response_model=KeyRead, responses={404: {"description": "No such key"}})
async def revoke_key(key_id: KeyId, session: SessionDep, cache: KeyCacheDep) -> KeyRead:
    """Takes effect at once in this process; other API processes notice within
    ``GRPO_AUTH_CACHE_SECONDS``. Revoking a revoked key changes nothing."""
    key = await run_in_threadpool(_revoke_and_commit, session, key_id)
    cache.evict_key(key_id)
    return key


def _revoke_and_commit(session: Session, key_id: int) -> KeyRead:
    # Committed before the eviction: a lookup after it must find the key revoked in SQL.
    key = teams.revoke_key(session, key_id)
    session.commit()
    return key


@router.post("/pools", status_code=status.HTTP_201_CREATED, response_model=PoolRead,
             responses={409: {"description": "A pool of that name exists"}, **_BAD})
def create_pool(body: PoolCreate, session: SessionDep) -> PoolRead:
    return pools.create_pool(session, body.name)


@router.get("/pools", response_model=Page[PoolRead])
def list_pools(session: SessionDep) -> Page[PoolRead]:
    return Page[PoolRead](items=pools.list_pools(session), next_after=None)


@router.post("/pools/{pool}/hold", response_model=PoolRead, responses=_POOL_404)
def hold_pool(pool: PoolName, session: SessionDep) -> PoolRead:
    """Stop dispatching into the pool; running jobs go on."""
    return pools.set_held(session, pool, True)


@router.post("/pools/{pool}/resume", response_model=PoolRead, responses=_POOL_404)
def resume_pool(pool: PoolName, session: SessionDep) -> PoolRead:
    return pools.set_held(session, pool, False)


@router.put("/pools/{pool}/limits", response_model=PoolRead, responses={**_POOL_404, **_BAD})
def set_pool_limits(pool: PoolName, body: PoolLimits, session: SessionDep) -> PoolRead:
    """Replace the pool's limits (a null or missing field: the deployment's default). Checked at
    each submission; jobs already accepted keep running."""
    return pools.set_limits(session, pool, body)


@router.put("/verifiers/{verifier}", response_model=VerifierRead,
            responses={404: {"description": "No such team or pool"}, **_BAD})
def set_verifier(verifier: VerifierName, body: VerifierSet, session: SessionDep) -> VerifierRead:
    """Register a verifier service for one team's or one pool's ``http_verifier`` rewards, or
    replace its registration. The auth secret is stored and sent, never returned."""
    return verifiers.set_verifier(session, verifier, body)


@router.get("/verifiers", response_model=Page[VerifierRead])
def list_verifiers(session: SessionDep) -> Page[VerifierRead]:
    return Page[VerifierRead](items=verifiers.list_verifiers(session), next_after=None)


@router.get("/verifiers/{verifier}", response_model=VerifierRead, responses=_VERIFIER_404)
def get_verifier(verifier: VerifierName, session: SessionDep) -> VerifierRead:
    return verifiers.get_verifier(session, verifier)


@router.delete("/verifiers/{verifier}", status_code=status.HTTP_204_NO_CONTENT, responses=_VERIFIER_404)
def delete_verifier(verifier: VerifierName, session: SessionDep) -> None:
    """Jobs queued with it fail ``invalid_spec`` when they start; new submissions naming it are 422s."""
    verifiers.delete_verifier(session, verifier)
