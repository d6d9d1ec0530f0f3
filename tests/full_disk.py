"""A real full disk for the tests of the writers that must survive one: a small tmpfs mounted
where the writer writes, filled with a filler file until the kernel answers ENOSPC, and freed by
removing it. Every process sees the mount (the worker, the API, the test), and what fails is
the writer's own ``write`` or ``mkdir``, as on a volume that filled up.

Mounting needs CAP_SYS_ADMIN (root in the CI container). Where it is missing a test that needs
one skips with the reason, except under ``.ci/run`` (GRPO_CI=1), where that is a failure.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_CHUNK = 64 * 1024


class SmallDisk:
    """A mounted tmpfs at ``path``; its filler lives in ``path`` too, as a hidden file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / ".filler"

    @property
    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def fill(self, leave: int = 0) -> None:
        """Write the filler until the disk is full, then give back ``leave`` bytes of it
        (tmpfs counts whole pages, so a multiple of 4096 is what stays free)."""
        with self.filler.open("ab", buffering=0) as handle:  # unbuffered: nothing left to flush
            try:
                while True:
                    handle.write(b"\0" * _CHUNK)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        if leave:
            os.truncate(self.filler, max(0, self.filler.stat().st_size - leave))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@contextmanager
def small_disk(path: Path, size: int) -> Iterator[SmallDisk]:
    """A tmpfs of ``size`` bytes at ``path`` (made if missing) while the block runs."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        message = f"a test disk needs a tmpfs mount (CAP_SYS_ADMIN): {mounted.stderr.strip()}"
        if os.environ.get("GRPO_CI") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield SmallDisk(path)
    finally:
        # Lazy: a process of the test that still holds a file there must not keep it mounted.
        subprocess.run(["umount", "--lazy", str(path)], check=True)
