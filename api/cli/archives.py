"""Unpacking what ``grpo download`` fetched: the service's tar of a model folder, whose members
all sit under one top folder (``job-7-model/``), into the folder the user named, so that
``from_pretrained(DIR)`` finds the files at its top. Tar members are untrusted input: the
``data`` filter refuses absolute names, ``..``, links out of the folder and device files."""

from __future__ import annotations

import tarfile
from pathlib import Path


def unpack_into(archive: Path, out: Path) -> list[str]:
    """Extract ``archive`` into ``out`` without its top folder; the names extracted, sorted."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if not inner:  # the top folder itself
                continue
            member.name = inner
            members.append(member)
        tar.extractall(out, members=members, filter="data")
    return sorted(member.name for member in members if member.isfile())
