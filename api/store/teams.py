"""Teams. Every job belongs to one; the single-token auth acts as the team ``default``."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.models import Team

DEFAULT_TEAM = "default"


def team_id_by_name(session: Session, name: str) -> int | None:
    return session.scalar(select(Team.id).where(Team.name == name))
