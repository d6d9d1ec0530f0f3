"""How the sandbox tests see, from the host, what is left of a run (imported by name: tests/grpo_core
is on sys.path): a program that starts with :data:`PID_NAMESPACE` prints its pid namespace, and
:func:`processes_in` lists the host's processes still in it."""

from __future__ import annotations

import os
from pathlib import Path

# Prints the sandbox's pid namespace first, so the host can look for its processes afterwards.
PID_NAMESPACE = "import os\nprint(os.readlink('/proc/self/ns/pid'), flush=True)\n"


def processes_in(namespace: str) -> list[int]:
    """Host pids of the processes still in that pid namespace."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == namespace:
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return found
