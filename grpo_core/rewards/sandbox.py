"""Run one untrusted Python program in a bubblewrap sandbox, with limits, and say how it ended.

What the program gets (see :func:`_bwrap_command`): new user, pid, network, ipc, uts and cgroup
namespaces (so no network at all, no other process to see or signal); a read-only view of
``/usr`` and the merged-/usr links (``/bin``, ``/lib``, ...) and nothing else of the host's
files, under a read-only root; a private, size-capped tmpfs at ``/tmp`` (the only writable
place, also the working directory); fresh ``/proc``, a minimal read-only ``/dev``; uid/gid 65534
inside; an empty environment; a Python under /usr (:func:`interpreter`) run with ``-I -S``
(no site-packages, no user paths). ``--die-with-parent`` and ``--new-session`` keep it from
outliving us or reaching our terminal.

Limits: a fixed launcher (trusted text, :data:`_LAUNCHER`) runs first inside the sandbox, sets
``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE`` (and no core
files), then execs the program, which inherits them with everything it starts. They are set there
rather than in a ``preexec_fn`` for two reasons: a ``preexec_fn`` runs Python between fork and
exec, which is unsafe in a process with threads (a job's process has torch's and the reward's),
and the kernel counts ``RLIMIT_NPROC`` per user namespace and uid, so a limit set inside cannot be
used up by another sandbox running at the same time or by the host user's own threads, as one set
before bwrap would be. At the wall-clock limit the sandbox's pid namespace is ended through its
init (:meth:`_Run.stop`), and the call returns only once no process of the run is left; the same
happens when the program exits and leaves a child behind. Output is read with a cap; a program
that writes more is killed and its output marked truncated (nothing is buffered unbounded).

When this process runs as root, bwrap itself is started as uid/gid 65534, so even outside
the namespaces the program holds no privilege. There is no fallback: where bwrap cannot create
its namespaces :func:`sandbox_problem` says why, and nothing is run unsandboxed.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache

from grpo_core.errors import GRPOError

__all__ = ["CAPABILITY", "Limits", "Outcome", "SandboxUnavailable", "probe_sandbox", "run_python",
           "sandbox_problem"]

CAPABILITY = "code_sandbox"  # what a worker advertises when sandbox_problem() finds none
# Only /usr is visible inside, so the interpreter must live there: this process's own when it
# does (a venv's base in the python images: /usr/local/bin), else the distribution's.
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
NOBODY = 65534
_READ_CHUNK = 65536

# Runs inside the sandbox (trusted, fixed text): the limits, then the program in a fresh interpreter.
_LAUNCHER = (
    "import os, resource, sys\n"
    "names = ('CPU', 'AS', 'NPROC', 'FSIZE', 'NOFILE', 'CORE')\n"
    "for name, value in zip(names, sys.argv[1:]):\n"
    "    resource.setrlimit(getattr(resource, 'RLIMIT_' + name), (int(value), int(value)))\n"
    "os.execv(sys.executable, [sys.executable, '-I', '-S', '/sandbox/main.py'])\n"
)


class SandboxUnavailable(GRPOError):
    """bwrap is missing or cannot create its namespaces here; the message says which."""

    code = "sandbox_unavailable"


@dataclass(frozen=True)
class Limits:
    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_bytes: int = 256 * 2**20  # address space of each process
    processes: int = 16  # processes and threads in the sandbox, its launcher included
    file_bytes: int = 4 * 2**20  # largest file it may write (in its /tmp)
    tmp_bytes: int = 16 * 2**20  # all of /tmp together
    open_files: int = 64
    output_bytes: int = 64 * 2**10  # stdout and stderr each


@dataclass(frozen=True)
class Outcome:
    returncode: int | None  # negative: killed by that signal; None: killed by us (timeout, output)
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # wrote more than Limits.output_bytes on stdout or stderr

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.truncated


@lru_cache(maxsize=1)
def interpreter() -> str | None:
    """The Python the sandbox runs programs with, by its real path under /usr; None if none."""
    own = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    for candidate in (own, *map(os.path.realpath, _SYSTEM_PYTHONS)):
        if candidate.startswith("/usr/") and os.access(candidate, os.X_OK):
            return candidate
    return None


def _host_view() -> list[str]:
    """Read-only binds of /usr and of the top-level system folders, as links where they are."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    return args


def _bwrap_command(program_fd: int, info_fd: int, limits: Limits) -> list[str]:
    return [
        "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--info-fd", str(info_fd),
        "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox", "--clearenv",
        *_host_view(),
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
        "--ro-bind-data", str(program_fd), "/sandbox/main.py",
        # bwrap's root and /dev are tmpfs: writable, and not size-capped like /tmp, a way round the
        # memory limit. Read-only, /dev's nodes still work (/dev/null takes writes).
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--chdir", "/tmp",
        interpreter(), "-I", "-S", "-c", _LAUNCHER,
        *map(str, (limits.cpu_seconds, limits.memory_bytes, limits.processes, limits.file_bytes,
                   limits.open_files, 0)),
    ]


def _unprivileged() -> dict[str, object]:
    """Popen's arguments that start bwrap as nobody when we are root (set in C between fork and
    exec, so safe with threads); nothing otherwise (then uid 65534 exists only inside)."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


class _Run:
    """One started sandbox: bwrap's process, its output so far, and how to stop it cleanly."""

    def __init__(self, process: subprocess.Popen, info: int, limits: Limits) -> None:
        self.process, self.limits = process, limits
        self.deadline = time.monotonic() + limits.wall_seconds
        self.buffers = {process.stdout: bytearray(), process.stderr: bytearray()}
        self.info_stream = os.fdopen(info, "rb", buffering=0)
        self.info = bytearray()
        self.timed_out = self.truncated = False

    def exchange(self, stdin: bytes) -> None:
        """Feed stdin and read both outputs (and bwrap's info) until they close, the deadline
        passes or an output goes over its cap."""
        selector = selectors.DefaultSelector()
        for stream in (*self.buffers, self.info_stream):
            selector.register(stream, selectors.EVENT_READ)
        pending = memoryview(stdin)
        if pending:
            os.set_blocking(self.process.stdin.fileno(), False)
            selector.register(self.process.stdin, selectors.EVENT_WRITE)
        else:
            self.process.stdin.close()
        while selector.get_map() and not self.truncated:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                break
            for key, _ in selector.select(remaining):
                stream = key.fileobj
                if stream is self.process.stdin:
                    pending = self._feed(pending)
                    done = not pending
                else:
                    done = not self._read(stream)
                if done:
                    selector.unregister(stream)
                    stream.close()
        selector.close()

    def _feed(self, pending: memoryview) -> memoryview:
        try:
            return pending[os.write(self.process.stdin.fileno(), pending[:_READ_CHUNK]):]
        except BrokenPipeError:  # the program stopped reading; what it took is its input
            return pending[:0]

    def _read(self, stream) -> bool:
        """Read what is there; False at the end of the stream."""
        chunk = os.read(stream.fileno(), _READ_CHUNK)
        if stream is self.info_stream:
            self.info += chunk[:_READ_CHUNK - len(self.info)]
            return bool(chunk)
        buffer = self.buffers[stream]
        room = self.limits.output_bytes - len(buffer)
        self.truncated = self.truncated or len(chunk) > room
        buffer += chunk[:room]
        return bool(chunk)

    def finish(self) -> int | None:
        """bwrap's exit status, once nothing of the run is left: a program that closed its
        outputs still has until the deadline; on a timeout or an overflow it is stopped."""
        if not (self.timed_out or self.truncated):
            try:
                return self.process.wait(max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.timed_out = True
        self.stop()
        return None

    def stop(self) -> None:
        """SIGKILL the sandbox's init (its pid namespace's pid 1, named by ``--info-fd``): the
        kernel kills every process of the namespace and waits for them before that init is
        gone, and bwrap, its parent, exits once it is. So when bwrap has been waited for, no
        process of the run is left. Killing bwrap first would leave that to happen after we
        return. bwrap's group is the fallback when it died before naming its init."""
        init_pid = _child_pid(bytes(self.info)) if self.process.poll() is None else None
        try:
            if init_pid is not None:
                os.kill(init_pid, signal.SIGKILL)
            else:
                os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr, self.info_stream):
            if not stream.closed:
                stream.close()


def _child_pid(info: bytes) -> int | None:
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def run_python(source: str, stdin: str = "", limits: Limits | None = None) -> Outcome:
    """Run ``source`` as ``/sandbox/main.py`` in a fresh sandbox with ``stdin``; wait at most
    ``limits.wall_seconds`` (plus the time to kill it). Raises :class:`SandboxUnavailable` only
    when bwrap or the interpreter is missing; a sandbox that fails to start is a failed run (the caller
    checks :func:`sandbox_problem` once, up front)."""
    limits = limits or Limits()
    if shutil.which("bwrap") is None or interpreter() is None:
        raise SandboxUnavailable("bwrap (bubblewrap) is not installed, or no Python under /usr")
    program_fd = os.memfd_create("program")  # close-on-exec: only bwrap gets it (pass_fds)
    info_read, info_write = os.pipe()
    try:
        os.write(program_fd, source.encode("utf-8", "replace"))
        os.lseek(program_fd, 0, os.SEEK_SET)
        process = subprocess.Popen(
            _bwrap_command(program_fd, info_write, limits), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={}, pass_fds=(program_fd, info_write), start_new_session=True,
            **_unprivileged(),
        )
    except BaseException:
        os.close(info_read)
        raise
    finally:
        os.close(program_fd)
        os.close(info_write)
    run = _Run(process, info_read, limits)
    try:
        run.exchange(stdin.encode("utf-8", "replace"))
        returncode = run.finish()
    except BaseException:
        run.stop()
        raise
    finally:
        run.close()
    stdout, stderr = (bytes(run.buffers[stream]).decode("utf-8", "replace")
                      for stream in (process.stdout, process.stderr))
    return Outcome(returncode, stdout, stderr, run.timed_out, run.truncated)


_PROBE = "import sys\nprint(sys.stdin.read()[::-1], end='')\n"


@lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """:func:`probe_sandbox`, once per process: what a job's rewards check up front."""
    return probe_sandbox()


def probe_sandbox() -> str | None:
    """None when a program runs in the sandbox here (a real run at each call: a worker checks
    again while it runs, since a sandbox can break after its start), else why not, for a
    worker's log and a refused ``grpo train``."""
    if shutil.which("bwrap") is None:
        return "bwrap (bubblewrap) is not installed (Debian: apt-get install bubblewrap)"
    if interpreter() is None:
        return f"no Python interpreter under /usr ({', '.join(_SYSTEM_PYTHONS)}) to run programs with"
    try:
        outcome = run_python(_PROBE, "ok", Limits(wall_seconds=20))
    except OSError as exc:
        return f"bwrap could not be started: {exc}"
    if outcome.ok and outcome.stdout == "ko":
        return None
    detail = outcome.stderr.strip().splitlines()[-1:] or [f"exit status {outcome.returncode}"]
    return f"bwrap cannot create its sandbox here: {detail[0]}"
