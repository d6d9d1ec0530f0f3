"""What a job's object store holds, read the way no service code does: by listing every key
(the service reads only the keys SQL names, api.artifacts.paths.Published), so that a test sees
what a stale attempt left beside the owner's objects too."""

from __future__ import annotations

import re

from api.artifacts.paths import CHECKPOINTS_DIR, COMPLETE_MARK
from api.storage import ObjectStore

_CHECKPOINT = re.compile(r"^step-(\d+)(?:\.attempt-(\d+))?$")


def stored_checkpoints(store: ObjectStore, job_id: int) -> dict[int, list[int | None]]:
    """Each step with a whole checkpoint (its mark, stored last) in the store -> the attempts
    that stored one (None: the plain, pre-attempt key)."""
    base = f"jobs/{job_id}/{CHECKPOINTS_DIR}/"
    found: dict[int, list[int | None]] = {}
    for info in store.list(base):
        folder, _, name = info.key.removeprefix(base).partition("/")
        match = _CHECKPOINT.match(folder)
        if name == COMPLETE_MARK and match:
            attempt = int(match.group(2)) if match.group(2) else None
            found.setdefault(int(match.group(1)), []).append(attempt)
    return dict(sorted(found.items()))


def stored_steps(store: ObjectStore, job_id: int) -> list[int]:
    """The steps with a whole stored checkpoint, whichever attempt stored it, oldest first."""
    return list(stored_checkpoints(store, job_id))
