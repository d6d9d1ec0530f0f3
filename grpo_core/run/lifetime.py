"""A child process that must not outlive the process that started it. Torch-free, so a child
can ask for this first thing, before its imports take seconds."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies. Whatever kills the parent (a
    SIGKILL, the OOM killer) gives it no chance to take its children down, and a child in a
    session of its own would live on holding its GPU. The kernel signals when the *thread* that
    started the child exits, so the parent must start it from a thread that outlives it.
    ``parent_pid`` closes the race with a parent that died before the request took effect."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)
