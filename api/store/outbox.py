"""What a transaction tells live readers, published only once it has committed.

Store functions that write something a job's stream carries (an event row, a status change)
*stage* the message on the session in the same call that writes the row. The caller's
:func:`api.store.db.session_scope` hands the staged messages to its ``publish`` callable after
the commit, so whoever writes a row also announces it (API, scheduler and worker alike), a
reader that sees a message always finds its row in SQL, and a rolled-back write announces
nothing. A session with no publisher drops them: the stream's readers re-check SQL anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

_KEY = "grpo_outbox"


@dataclass(frozen=True)
class Message:
    """One stream message (``api.store.bus`` shapes): ``kind`` is metrics|event|samples|status."""

    job_id: int
    kind: str
    data: dict[str, Any]


Publish = Callable[[list[Message]], None]


def stage(session: Session, job_id: int, kind: str, data: dict[str, Any]) -> None:
    session.info.setdefault(_KEY, []).append(Message(job_id, kind, data))


def take(session: Session) -> list[Message]:
    """The staged messages, removed from the session (once per commit)."""
    return session.info.pop(_KEY, [])
