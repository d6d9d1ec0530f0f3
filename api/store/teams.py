"""Teams, their GPU quotas per pool, and their API keys. Every job belongs to a team; the
operator token (and ``auth = "none"``) acts as an admin of the team ``default``, which the
migration seeds. The HTTP admin routes and the ``grpo admin`` CLI both go through here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, delete, select, update
from sqlalchemy.orm import Session

from api.domain.errors import Conflict, InvalidInput, NotFound
from api.schemas.admin import MAX_QUOTA_GPUS, KeyRead, TeamLimits, TeamRead
from api.store import api_keys
from api.store._checks import check_bytes, check_gpus, check_label, check_name, check_weight
from api.store._rows import dialect_insert
from api.store.pools import get_pool
from api.store.tables import ApiKey, Job, Team, TeamQuota, utcnow

DEFAULT_TEAM = "default"
_TEAMS = Team.__table__
_QUOTAS = TeamQuota.__table__


@dataclass(frozen=True)
class KeyGrant:
    """What a stored key grants, as auth needs it; a revoked key is reported, not hidden, so
    its holder is told it was revoked rather than that it never existed."""

    key_id: int
    team_id: int
    is_admin: bool
    prefix: str
    revoked: bool


def team_id_by_name(session: Session, name: str) -> int | None:
    return session.scalar(select(Team.id).where(Team.name == name))


def _team_id(session: Session, name: str) -> int:
    team_id = team_id_by_name(session, name)
    if team_id is None:
        raise NotFound(f"team '{name}' not found", param="team")
    return team_id


def _team_read(team: Team, quotas: dict[str, int]) -> TeamRead:
    return TeamRead(id=team.id, name=team.name, weight=team.weight, quotas=quotas,
                    artifact_quota_bytes=team.artifact_quota_bytes,
                    limits=TeamLimits.model_validate(team.limits or {}), created_at=team.created_at)


def quotas_by_team(session: Session, team_id: int | None = None) -> dict[int, dict[str, int]]:
    """team id -> {pool: GPUs}; a team without quotas is absent (no limit beyond capacity)."""
    query = select(TeamQuota.team_id, TeamQuota.pool, TeamQuota.gpus).order_by(TeamQuota.pool)
    if team_id is not None:
        query = query.where(TeamQuota.team_id == team_id)
    quotas: dict[int, dict[str, int]] = {}
    for owner, pool, gpus in session.execute(query):
        quotas.setdefault(owner, {})[pool] = gpus
    return quotas


def team_by_id(session: Session, team_id: int) -> TeamRead:
    # populate_existing: UPDATEs here bypass the identity map, which may hold the old row.
    team = session.get(Team, team_id, populate_existing=True)
    if team is None:
        raise NotFound(f"team {team_id} not found", param="team")
    return _team_read(team, quotas_by_team(session, team_id).get(team_id, {}))


def get_team(session: Session, name: str) -> TeamRead:
    return team_by_id(session, _team_id(session, name))


def list_teams(session: Session) -> list[TeamRead]:
    quotas = quotas_by_team(session)
    rows = session.scalars(select(Team).order_by(Team.name))
    return [_team_read(team, quotas.get(team.id, {})) for team in rows]


def create_team(session: Session, name: str, weight: float = 1.0) -> TeamRead:
    """ON CONFLICT DO NOTHING, so a concurrent create of the same name is a Conflict too, not
    an integrity error."""
    values = {"name": check_name(name, "name"), "weight": check_weight(weight), "created_at": utcnow()}
    stmt = dialect_insert(session.get_bind().dialect.name, _TEAMS).values(**values)
    row = session.execute(stmt.on_conflict_do_nothing(index_elements=["name"]).returning(_TEAMS.c.id)).first()
    if row is None:
        raise Conflict(f"team '{name}' already exists", param="name")
    return team_by_id(session, row.id)


def set_weight(session: Session, name: str, weight: float) -> TeamRead:
    team_id = _team_id(session, name)
    session.execute(update(Team).where(Team.id == team_id).values(weight=check_weight(weight))
                    .execution_options(synchronize_session=False))
    return team_by_id(session, team_id)


def _quota_target(session: Session, team: str, pool: str) -> int:
    team_id = _team_id(session, team)
    get_pool(session, pool)  # NotFound names the pool
    return team_id


def set_quota(session: Session, team: str, pool: str, gpus: int) -> TeamRead:
    team_id = _quota_target(session, team, pool)
    stmt = dialect_insert(session.get_bind().dialect.name, _QUOTAS).values(
        team_id=team_id, pool=pool, gpus=check_gpus(gpus))
    session.execute(stmt.on_conflict_do_update(index_elements=["team_id", "pool"],
                                               set_={"gpus": stmt.excluded.gpus}))
    return team_by_id(session, team_id)


def change_quota(session: Session, team: str, pool: str, delta: int) -> TeamRead:
    """Add ``delta`` to the quota in one statement (concurrent changes add up); no quota counts
    as 0. A result outside 0..MAX_QUOTA_GPUS changes nothing and is an error naming ``delta``."""
    team_id = _quota_target(session, team, pool)
    check_gpus(abs(delta), "delta")
    new = _QUOTAS.c.gpus + delta
    where = (_QUOTAS.c.team_id == team_id) & (_QUOTAS.c.pool == pool)
    if delta < 0:
        stmt: Any = update(_QUOTAS).where(where, new >= 0).values(gpus=new)
    elif delta > 0:
        stmt = dialect_insert(session.get_bind().dialect.name, _QUOTAS).values(
            team_id=team_id, pool=pool, gpus=delta)
        stmt = stmt.on_conflict_do_update(index_elements=["team_id", "pool"], set_={"gpus": new},
                                          where=new <= MAX_QUOTA_GPUS)
    else:  # +0 must not turn "no quota" (no limit) into a quota of 0
        return team_by_id(session, team_id)
    if session.execute(stmt.returning(_QUOTAS.c.gpus)).first() is None:
        current = session.scalar(select(_QUOTAS.c.gpus).where(where))
        shown = "no quota (0)" if current is None else f"{current} GPUs"
        raise InvalidInput(f"team '{team}' has {shown} in pool '{pool}'; {delta:+d} would make it "
                           f"{(current or 0) + delta}, outside 0..{MAX_QUOTA_GPUS}", param="delta")
    return team_by_id(session, team_id)


def clear_quota(session: Session, team: str, pool: str) -> TeamRead:
    """No quota: the team is limited by the pool's capacity only. Idempotent."""
    team_id = _quota_target(session, team, pool)
    session.execute(delete(TeamQuota).where(TeamQuota.team_id == team_id, TeamQuota.pool == pool)
                    .execution_options(synchronize_session=False))
    return team_by_id(session, team_id)


def set_artifact_quota(session: Session, team: str, count: int | None) -> TeamRead:
    """The most bytes the team's jobs' artifacts may occupy (None: no limit); each job checks it
    before writing a checkpoint. Idempotent."""
    team_id = _team_id(session, team)
    value = None if count is None else check_bytes(count)
    session.execute(update(Team).where(Team.id == team_id).values(artifact_quota_bytes=value)
                    .execution_options(synchronize_session=False))
    return team_by_id(session, team_id)


def set_limits(session: Session, team: str, limits: TeamLimits) -> TeamRead:
    """Replace the team's overrides (a null field: the default). Jobs already queued stay queued;
    API processes apply new rate limits within ``GRPO_AUTH_CACHE_SECONDS``."""
    team_id = _team_id(session, team)
    session.execute(update(Team).where(Team.id == team_id)
                    .values(limits=limits.model_dump(exclude_none=True) or None)
                    .execution_options(synchronize_session=False))
    return team_by_id(session, team_id)


def artifact_quota(session: Session, team_id: int, *, always: bool = False) -> tuple[int | None, list[int]]:
    """The team's artifact byte quota (None: no limit) and, when there is one (or ``always``), the
    ids of its jobs, whose artifact folders count against it: deleted ones too, since a deletion
    whose storage step failed leaves their files (``api.store.job_deletion``)."""
    quota = session.scalar(select(Team.artifact_quota_bytes).where(Team.id == team_id))
    if quota is None and not always:
        return None, []
    return quota, list(session.scalars(select(Job.id).where(Job.team_id == team_id)))


# ---- API keys ----

_KEY_COLUMNS = (ApiKey.id, Team.name.label("team"), ApiKey.prefix, ApiKey.is_admin, ApiKey.label,
                ApiKey.created_at, ApiKey.revoked_at)


def _key_read(row: Row[Any]) -> KeyRead:
    return KeyRead(id=row.id, team=row.team, prefix=row.prefix, is_admin=row.is_admin, label=row.label,
                   created_at=row.created_at, revoked_at=row.revoked_at)


def _keys_query() -> Any:
    return select(*_KEY_COLUMNS).join(Team, Team.id == ApiKey.team_id).order_by(ApiKey.id)


def create_key(session: Session, team: str, is_admin: bool = False,
               label: str | None = None) -> tuple[KeyRead, str]:
    """A new key of ``team``: ``(its record, the key itself)``. Only the hash is stored, so the
    returned plaintext is the one chance to hand it over."""
    team_id = _team_id(session, team)
    new = api_keys.generate_key()
    key = ApiKey(team_id=team_id, prefix=new.prefix, key_hash=new.key_hash, is_admin=is_admin,
                 label=check_label(label), created_at=utcnow())
    session.add(key)
    session.flush()
    return _key_read(session.execute(_keys_query().where(ApiKey.id == key.id)).one()), new.plaintext


def list_keys(session: Session, team: str | None = None) -> list[KeyRead]:
    query = _keys_query()
    if team is not None:
        query = query.where(ApiKey.team_id == _team_id(session, team))
    return [_key_read(row) for row in session.execute(query)]


def revoke_key(session: Session, key_id: int) -> KeyRead:
    """Idempotent: revoking a revoked key keeps its first ``revoked_at``."""
    session.execute(update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                    .values(revoked_at=utcnow()).execution_options(synchronize_session=False))
    row = session.execute(_keys_query().where(ApiKey.id == key_id)).first()
    if row is None:
        raise NotFound(f"API key {key_id} not found", param="key_id")
    return _key_read(row)


def principal_for_key_hash(session: Session, key_hash: str) -> KeyGrant | None:
    """The key stored under ``key_hash`` (``api.store.api_keys.hash_key``), or None if there is none."""
    row = session.execute(select(ApiKey.id, ApiKey.team_id, ApiKey.is_admin, ApiKey.prefix, ApiKey.revoked_at)
                          .where(ApiKey.key_hash == key_hash)).first()
    if row is None:
        return None
    return KeyGrant(row.id, row.team_id, row.is_admin, row.prefix, row.revoked_at is not None)
