"""A sandboxed interpreter that lives across several exchanges: the program gets lines on stdin,
answers with lines on stdout, and keeps its state for the next ones. An environment's episodes
run in such sandboxes (:mod:`grpo_core.agents.environment_runner`): their state lasts the whole
episode.

The sandbox is :mod:`grpo_core.rewards.sandbox`'s own (same namespaces, mounts, seccomp filter,
limits on its init, cgroup where the host delegates one); only the conversation differs. There is
no wall-clock limit on the session as a whole, since it waits while the model decodes its next
turn: each exchange has its own deadline, and ``Limits.cpu_seconds`` bounds the CPU time of the
whole session. Its answer is read with a cap (``Limits.output_bytes`` a line); the program's
stderr is not read (a program that fills it blocks only itself). :meth:`SandboxSession.close`
returns once no process of the session is left, and ``--die-with-parent`` ends it with us.
"""

from __future__ import annotations

import os
import selectors
import shutil
import time

from grpo_core.rewards.sandbox import Limits, SandboxUnavailable, interpreter, run_cgroup, start_sandbox
from grpo_core.rewards.sandbox_process import SandboxRun

__all__ = ["SandboxSession", "SessionFailed"]

_READ_CHUNK = 65536


class SessionFailed(Exception):
    """An exchange got no answer: the program ran out of time, wrote too much or ended."""


class SandboxSession:
    """One started sandbox running ``source``; use as a context manager (closing ends it)."""

    def __init__(self, source: str, limits: Limits) -> None:
        if shutil.which("bwrap") is None or interpreter() is None:
            raise SandboxUnavailable("bwrap (bubblewrap) is not installed, or no Python under /usr")
        self.limits = limits
        self._cgroup = run_cgroup(limits)
        try:
            process, info = start_sandbox(source, limits, self._cgroup)
        except BaseException:
            self._drop_cgroup()
            raise
        self._run = SandboxRun(process, info, limits.wall_seconds, limits.output_bytes)
        self._process, self._pending = process, bytearray()
        self._info_read = False

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ask(self, line: str, timeout: float) -> str:
        """Send ``line`` (one line of text) and return the program's next line, or raise
        :class:`SessionFailed` saying why none came within ``timeout`` seconds."""
        self.send(line)
        return self.receive(time.monotonic() + timeout)

    def send(self, line: str) -> None:
        """Write one line to the program (its newlines made spaces); :class:`SessionFailed` when
        it no longer reads."""
        self._read_info()
        try:
            self._process.stdin.write(line.replace("\n", " ").encode("utf-8", "replace") + b"\n")
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise SessionFailed(self._ended()) from None

    def receive(self, deadline: float) -> str:
        """The program's next line, waited for until ``deadline`` (``time.monotonic()``), or
        :class:`SessionFailed` saying why none came."""
        return self._read_line(deadline)

    def _read_line(self, deadline: float) -> str:
        stdout = self._process.stdout
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                if len(self._pending) > self.limits.output_bytes:
                    raise SessionFailed("its answer went over its output limit")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    raise SessionFailed("it ran out of time")
                chunk = os.read(stdout.fileno(), _READ_CHUNK)
                if not chunk:
                    raise SessionFailed(self._ended())
                self._pending += chunk
        line, _, rest = bytes(self._pending).partition(b"\n")
        self._pending = bytearray(rest)
        if len(line) > self.limits.output_bytes:
            raise SessionFailed("its answer went over its output limit")
        return line.decode("utf-8", "replace")

    def _read_info(self) -> None:
        """bwrap's info (its init's pid, what :meth:`close` kills): written before the program
        runs, so it is there by the first exchange."""
        if self._info_read:
            return
        self._info_read = True
        stream = self._run.info_stream
        with selectors.DefaultSelector() as selector:
            selector.register(stream, selectors.EVENT_READ)
            deadline = time.monotonic() + 10
            while (remaining := deadline - time.monotonic()) > 0 and selector.select(remaining):
                chunk = os.read(stream.fileno(), _READ_CHUNK)
                if not chunk:
                    break
                self._run.info += chunk
                if self._run.info.rstrip().endswith(b"}"):
                    break

    def _ended(self) -> str:
        try:
            status = self._process.wait(timeout=1)
        except Exception:  # still running: it closed its output yet lives on
            return "it closed its output"
        return f"its process ended (exit status {status})"

    def close(self) -> None:
        """End the session: every process of it is gone when this returns."""
        self._read_info()  # so the stop kills the sandbox's init, not only bwrap
        try:
            self._run.stop()
        finally:
            self._run.close()
            self._drop_cgroup()

    def _drop_cgroup(self) -> None:
        if self._cgroup:
            self._cgroup.close_gate()
            self._cgroup.remove()
            self._cgroup = None
