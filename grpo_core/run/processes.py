"""Small facts about processes and files that the launcher (:mod:`grpo_core.run.launch`), the
checkpoint sweep and the service's worker all need, kept in one copy so they cannot drift:
whether a pid still runs (a zombie does not), a signal's name, and a file written whole.

Standard library only: the worker's supervisor imports it and never loads torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

__all__ = ["name_process", "parent_pid", "process_alive", "signal_name", "write_whole"]

_PR_SET_NAME = 15  # <linux/prctl.h>


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie does not: it only awaits its parent's reaping)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: ask the kernel, which cannot tell a zombie apart
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: alive
            return True
        return True
    return _after_name(stat)[0] not in ("Z", "X")


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid``, from procfs; None when it is gone (or there is no procfs)."""
    try:
        return int(_after_name(Path(f"/proc/{pid}/stat").read_text())[1])
    except OSError:
        return None


def _after_name(stat: str) -> list[str]:
    """The fields of a ``/proc/PID/stat`` line after the command name (state, parent, ...): the
    name comes in parentheses and may itself hold spaces."""
    return stat.rpartition(")")[2].split()


def name_process(name: str) -> None:
    """Name this process as ``ps -o comm``, ``top`` and psutil show it (its first 15 bytes): a
    process forked from a server is otherwise named by the server's command line."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; a number no signal has is named as such."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def write_whole(path: Path, data: bytes) -> None:
    """Written under another name, then renamed: a reader, in this process or another, never
    reads half a file. The temporary name holds the pid, so two writers never share one."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(data)
    partial.replace(path)
