"""Resolving ``path:`` locations safely.

With a root (the service), a location must stay inside it after resolving ``..`` and symlinks:
a spec can never name a file elsewhere on the host. Without one (the local CLI), any path is
allowed and a relative one is taken relative to the spec file's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_core.errors import SpecError


def resolve_under_root(location: str, root: Path | None, base_dir: Path | None, field: str) -> Path:
    path = Path(location).expanduser()
    if root is None:
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return path.resolve()
    real_root = Path(root).resolve()
    candidate = (path if path.is_absolute() else real_root / path).resolve()
    if not candidate.is_relative_to(real_root):
        raise SpecError(field, f"'{location}' is outside the allowed root '{real_root}'")
    return candidate


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist), symlinks not followed;
    a file removed while walking (retention, a failed write) counts as nothing."""
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total
