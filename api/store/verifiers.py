"""Verifier services admins registered for ``http_verifier`` rewards: the registry behind
``/v1/admin/verifiers`` and ``grpo admin set-verifier``, and the lookups of the submit check and
the job's process (which registrations a job of team T in pool P may use)."""

from __future__ import annotations

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from api.domain.errors import NotFound
from api.schemas.verifiers import VerifierRead, VerifierSet
from api.store._checks import check_name
from api.store.tables import Pool, Team, Verifier, utcnow
from api.store.teams import team_id_by_name
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint


def _read(row: Verifier, team: str | None) -> VerifierRead:
    return VerifierRead(name=row.name, team=team, pool=row.pool, url=row.url, auth_header=row.auth_header,
                        auth_secret_set=row.auth_secret is not None, timeout_seconds=row.timeout_seconds,
                        max_concurrency=row.max_concurrency, max_batch_size=row.max_batch_size,
                        created_at=row.created_at, updated_at=row.updated_at)


_LISTING = select(Verifier, Team.name).outerjoin(Team, Team.id == Verifier.team_id)


def set_verifier(session: Session, name: str, body: VerifierSet) -> VerifierRead:
    """Register ``name`` or replace its registration whole (a PUT)."""
    check_name(name, "name")
    team_id = None
    if body.team is not None:
        team_id = team_id_by_name(session, body.team)
        if team_id is None:
            raise NotFound(f"team '{body.team}' not found", param="team")
    if body.pool is not None and session.get(Pool, body.pool) is None:
        raise NotFound(f"pool '{body.pool}' not found", param="pool")
    row = session.get(Verifier, name, populate_existing=True)
    if row is None:
        row = Verifier(name=name, created_at=utcnow())
        session.add(row)
    row.team_id, row.pool, row.url = team_id, body.pool, body.url
    row.auth_header, row.auth_secret = body.auth_header, body.auth_secret
    row.timeout_seconds, row.max_concurrency = body.timeout_seconds, body.max_concurrency
    row.max_batch_size, row.updated_at = body.max_batch_size, utcnow()
    session.flush()
    return get_verifier(session, name)


def get_verifier(session: Session, name: str) -> VerifierRead:
    found = session.execute(_LISTING.where(Verifier.name == name)).first()
    if found is None:
        raise NotFound(f"verifier '{name}' not found", param="verifier")
    return _read(*found)


def list_verifiers(session: Session) -> list[VerifierRead]:
    return [_read(*found) for found in session.execute(_LISTING.order_by(Verifier.name))]


def delete_verifier(session: Session, name: str) -> VerifierRead:
    """Remove it and say what it was. Jobs already accepted that name it fail ``invalid_spec``
    when they next start."""
    removed = get_verifier(session, name)
    session.execute(delete(Verifier).where(Verifier.name == name))
    return removed


def endpoints_for(session: Session, names: set[str], team_id: int, pool: str) -> dict[str, VerifierEndpoint]:
    """Of ``names``, those registered for team ``team_id`` or pool ``pool``, with where and how to
    call them (the secret included: for the job's process only)."""
    if not names:
        return {}
    rows = session.scalars(select(Verifier).where(
        Verifier.name.in_(names), or_(Verifier.team_id == team_id, Verifier.pool == pool)))
    return {row.name: VerifierEndpoint(
        url=row.url, auth_header=row.auth_header, auth_secret=row.auth_secret,
        timeout_seconds=row.timeout_seconds, max_concurrency=row.max_concurrency,
        max_batch_size=row.max_batch_size) for row in rows}
