"""A cgroup v2 per sandbox run, where the host delegates one: what the code sandbox
(:mod:`grpo_core.rewards.sandbox`) adds on top of its rlimits when it can.

The rlimits count per process (``RLIMIT_AS``) or per user (``RLIMIT_NPROC``); a cgroup counts the
whole run: all of its memory, page cache and tmpfs pages included (``memory.max``, no swap), and
all of its tasks (``pids.max``). It is optional: a worker has it only where an operator delegated a
cgroup v2 folder to it and named it in ``GRPO_SANDBOX_CGROUP`` (a folder under ``/sys/fs/cgroup``,
writable by the worker, whose ``cgroup.subtree_control`` enables ``memory`` and ``pids``, e.g. a
systemd unit's with ``Delegate=yes``). Without one the sandbox still runs, and the worker's
capability check says this protection is not active, and why.

Getting bwrap into the cgroup without a race: bwrap is started through a gate (a few lines run by
the sandbox's system Python, :data:`_GATE`) that waits on a pipe (:meth:`RunCgroup.gated`)
before it execs bwrap; meanwhile this process writes the gate's pid into the cgroup's
``cgroup.procs`` and only then opens the gate. So nothing of bwrap runs outside the cgroup, and
everything it starts is born inside. (Writing bwrap's pid after it started would leave it a moment
to fork unlimited, and its children would stay behind; Python's ``subprocess`` cannot clone
straight into a cgroup.) This process does the move, not the gate: when the worker runs as root,
bwrap is started as nobody, who may not write the delegated folder. The cgroup is removed after
the run, once bwrap has been waited for (so it is empty); ``cgroup.kill`` first, in case.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

__all__ = ["CGROUP_VARIABLE", "RunCgroup", "delegated_cgroup", "delegation_problem", "filesystem_type"]

CGROUP_VARIABLE = "GRPO_SANDBOX_CGROUP"
_NEEDED_CONTROLLERS = ("memory", "pids")
# Runs between Popen and bwrap: wait for the gate's byte, then become the command.
_GATE = ("import os, sys\n"
         "if os.read(int(sys.argv[1]), 1):\n"
         "    os.execvp(sys.argv[2], sys.argv[2:])\n"
         "sys.exit(1)\n")


def filesystem_type(mountinfo: str, path: str) -> str | None:
    """The type of the file system ``path`` lies on, from ``/proc/self/mountinfo``'s text: the
    deepest mount point that contains it (the last one mounted there, as the kernel shows it)."""
    best, found = "", None
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        mount_point = parts[4]
        inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, found = mount_point, rest.split()[0]
    return found


def delegation_problem(base: Path, fs_type: str | None) -> str | None:
    """None when ``base`` can hold a cgroup per run with the controllers the sandbox sets,
    else why not."""
    if fs_type != "cgroup2":
        return f"{base} is not in a cgroup v2 hierarchy (it is {fs_type or 'not mounted'})"
    try:
        enabled = (base / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return f"{base} is not a cgroup folder we can read: {exc.strerror}"
    missing = [name for name in _NEEDED_CONTROLLERS if name not in enabled]
    if missing:
        return f"{base}'s cgroup.subtree_control does not enable {', '.join(missing)}"
    if not os.access(base, os.W_OK):
        return f"{base} is not writable by this process"
    return None


def delegated_cgroup() -> tuple[Path | None, str | None]:
    """The delegated folder named by ``GRPO_SANDBOX_CGROUP`` and None, or None and why there is none."""
    named = os.environ.get(CGROUP_VARIABLE, "").strip()
    if not named:
        return None, f"no delegated cgroup v2 folder is named in {CGROUP_VARIABLE}"
    base = Path(os.path.realpath(named))
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError as exc:
        return None, f"cannot read the mount table: {exc.strerror}"
    problem = delegation_problem(base, filesystem_type(mountinfo, str(base)))
    return (None, problem) if problem else (base, None)


class RunCgroup:
    """One run's cgroup under ``base``: made with its limits, bwrap moved in before it starts,
    removed after the run."""

    def __init__(self, base: Path, memory_bytes: int, tasks: int) -> None:
        self.path = base / f"grpo-sandbox-{uuid.uuid4().hex[:12]}"
        self.path.mkdir()
        try:
            self._write("memory.max", memory_bytes)
            if (self.path / "memory.swap.max").exists():  # absent when the host has no swap accounting
                self._write("memory.swap.max", 0)
            self._write("pids.max", tasks)
        except BaseException:
            self.remove()
            raise
        self.gate_read, self.gate_write = os.pipe()

    def _write(self, name: str, value: int | str) -> None:
        (self.path / name).write_text(f"{value}\n")

    def gated(self, command: list[str], python: str) -> list[str]:
        """``command`` behind the gate, run by ``python`` (a system one: the gate runs as nobody
        when we are root, who may not reach a virtualenv under /root): it execs the command once
        :meth:`admit` opened the gate, and never when this process dies first (the pipe then ends
        empty). Not a shell: dash cannot redirect from a descriptor above 9."""
        return [python, "-I", "-S", "-c", _GATE, str(self.gate_read), *command]

    def admit(self, pid: int) -> None:
        """Move the waiting gate (``pid``) into the cgroup, then let it exec bwrap."""
        try:
            self._write("cgroup.procs", pid)
            os.write(self.gate_write, b"go\n")
        finally:
            self.close_gate()

    def close_gate(self) -> None:
        for fd in (self.gate_read, self.gate_write):
            try:
                os.close(fd)
            except OSError:
                pass  # already closed
        self.gate_read = self.gate_write = -1

    def remove(self) -> None:
        """Kill what may be left (nothing, once bwrap was waited for) and remove the folder."""
        kill = self.path / "cgroup.kill"
        if kill.exists():
            try:
                self._write("cgroup.kill", 1)
            except OSError:
                pass  # the folder is going anyway; rmdir below says whether it could
        for _ in range(50):  # the kernel frees a killed cgroup's tasks asynchronously
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)
