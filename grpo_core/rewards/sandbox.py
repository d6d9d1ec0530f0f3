"""Run one untrusted Python program in a bubblewrap sandbox, with limits, and say how it ended.

What the program gets (see :func:`_bwrap_command`): new user, pid, network, ipc, uts and cgroup
namespaces (so no network at all, no other process to see or signal), and no way to make more
user namespaces (``--disable-userns``); a read-only view of only its interpreter's files (the
binary, its standard library, the libraries they link: :mod:`grpo_core.rewards.sandbox_mounts`)
under a read-only root; a private, size-capped tmpfs at ``/tmp`` (the only writable place, also
the working directory); fresh ``/proc``, a minimal read-only ``/dev`` (so no POSIX shared memory
in ``/dev/shm``); uid/gid 65534 inside; an empty environment; a Python under /usr
(:func:`interpreter`) run with ``-I -S`` (no site-packages, no user paths); a seccomp filter
(:mod:`grpo_core.rewards.seccomp_filter`: no ptrace, SysV IPC, namespaces, mounts, keyring, bpf,
``modify_ldt``, sockets of any family but ``AF_UNIX``,
...). ``--die-with-parent`` and ``--new-session`` keep it from outliving us or reaching our terminal.

Limits: a fixed launcher (trusted text, :data:`_LAUNCHER`) is the sandbox's init (pid 1,
``--as-pid-1``, so bwrap leaves no reaper of its own in there: the attack on the old sandbox took
over that reaper, which had none of the limits, through ``/proc/1/mem``). It sets ``RLIMIT_CPU``,
``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE`` (and no core files) on
itself, makes itself non-dumpable (so its memory cannot be opened even by the same uid), forks the
program, which inherits the limits and the filter, reaps whatever is reparented to it, and exits
with the program's status once the program's process exits; when the init of a pid namespace
exits the kernel kills the rest of it, so no daemonised grandchild outlives the program. The limits
are set there rather than in a ``preexec_fn`` for two reasons: a ``preexec_fn`` runs Python
between fork and exec, which is unsafe in a process with threads (a job's process has torch's and
the reward's), and the kernel counts ``RLIMIT_NPROC`` per user namespace and uid, so a limit set
inside cannot be used up by another sandbox running at the same time or by the host user's own
threads, as one set before bwrap would be. Where the host delegates a cgroup v2 folder, each run
also gets a cgroup capping all of its memory and tasks (:mod:`grpo_core.rewards.sandbox_cgroup`).

At the wall-clock limit the sandbox's pid namespace is ended through its init
(:class:`~grpo_core.rewards.sandbox_process.SandboxRun`), and the call returns only once no
process of the run is left. Output is read with a cap; a program that writes more is killed and
its output marked truncated (nothing is buffered unbounded).

When this process runs as root, bwrap itself is started as uid/gid 65534, so even outside
the namespaces the program holds no privilege. There is no fallback: where bwrap cannot create
its namespaces or a mandatory protection (the filter, no user namespaces, the limits on init, the
minimal mounts) fails, :func:`sandbox_problem` says why, and nothing is run unsandboxed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

from grpo_core.errors import GRPOError
from grpo_core.rewards.sandbox_cgroup import RunCgroup, delegated_cgroup
from grpo_core.rewards.sandbox_mounts import MountsUnavailable, interpreter_mounts
from grpo_core.rewards.sandbox_process import SandboxRun
from grpo_core.rewards.seccomp_filter import SeccompUnsupported, seccomp_program

__all__ = ["CAPABILITY", "Limits", "Outcome", "SandboxCheck", "SandboxUnavailable", "check_sandbox",
           "probe_sandbox", "run_python", "sandbox_problem"]

CAPABILITY = "code_sandbox"  # what a worker advertises when sandbox_problem() finds none
# A system interpreter (trusted files, not the worker's own virtualenv): this process's own when it
# lives under /usr (a venv's base in the python images: /usr/local/bin), else the distribution's.
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
NOBODY = 65534

# The sandbox's init (trusted, fixed text), run with the limits as its arguments; see the module's
# docstring. prctl(PR_SET_DUMPABLE, 0) goes through ctypes, the one way to it from the standard
# library; a failure ends the run rather than leave init open. Its exit status is the program's,
# as bwrap's own init gave it (128 + the signal for a program killed by one).
_LAUNCHER = (
    "import ctypes, os, resource, sys\n"
    "names = ('CPU', 'AS', 'NPROC', 'FSIZE', 'NOFILE', 'CORE')\n"
    "for name, value in zip(names, sys.argv[1:]):\n"
    "    resource.setrlimit(getattr(resource, 'RLIMIT_' + name), (int(value), int(value)))\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:\n"
    "    sys.exit('sandbox init: prctl(PR_SET_DUMPABLE) failed')\n"
    "program = os.fork()\n"
    "if program == 0:\n"
    "    try:\n"
    "        os.execv(sys.executable, [sys.executable, '-I', '-S', '/sandbox/main.py'])\n"
    "    finally:\n"
    "        os._exit(127)\n"
    "while True:\n"
    "    pid, status = os.wait()\n"
    "    if pid == program:\n"
    "        break\n"
    "code = os.waitstatus_to_exitcode(status)\n"
    "os._exit(code if code >= 0 else 128 - code)\n"
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
    # All of the run's memory together, where a cgroup counts it (sandbox_cgroup); None: the most
    # the rlimits allow (each process's address space, and /tmp), so the cgroup catches only what
    # they cannot see (kernel memory, page cache, tmpfs pages outside /tmp).
    run_memory_bytes: int | None = None

    @property
    def cgroup_memory_bytes(self) -> int:
        return self.run_memory_bytes or self.memory_bytes * self.processes + self.tmp_bytes


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


def _bwrap_command(fds: dict[str, int], limits: Limits) -> list[str]:
    """bwrap's command line; ``fds``: the program's text, the seccomp filter and bwrap's info."""
    return [
        # --unshare-user is implied by --unshare-all, but --disable-userns wants it said.
        "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--info-fd", str(fds["info"]),
        "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox", "--clearenv",
        *interpreter_mounts(interpreter()),
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
        "--ro-bind-data", str(fds["program"]), "/sandbox/main.py",
        # bwrap's root and /dev are tmpfs: writable, and not size-capped like /tmp, a way round the
        # memory limit (/dev/shm among them). Read-only, /dev's nodes still work (/dev/null takes writes).
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--chdir", "/tmp",
        "--seccomp", str(fds["seccomp"]),
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


def _data_fd(name: str, data: bytes) -> int:
    """A close-on-exec memfd holding ``data`` from its start: only bwrap gets it (pass_fds)."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def start_sandbox(source: str, limits: Limits, cgroup: RunCgroup | None) -> tuple[subprocess.Popen, int]:
    """bwrap started (in ``cgroup`` when there is one) and the read end of its info pipe."""
    try:
        seccomp = seccomp_program()
        interpreter_mounts(interpreter())  # found once; here, so that its failure says why
    except (SeccompUnsupported, MountsUnavailable) as exc:
        raise SandboxUnavailable(str(exc)) from exc
    fds = {"program": _data_fd("program", source.encode("utf-8", "replace")),
           "seccomp": _data_fd("seccomp", seccomp)}
    info_read, fds["info"] = os.pipe()
    command = _bwrap_command(fds, limits)
    passed = (*fds.values(), *((cgroup.gate_read,) if cgroup else ()))
    if cgroup:
        command = cgroup.gated(command, interpreter())
    try:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={},
            pass_fds=passed, start_new_session=True, **_unprivileged())
        if cgroup:
            cgroup.admit(process.pid)
    except BaseException:
        os.close(info_read)
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    return process, info_read


def run_cgroup(limits: Limits) -> RunCgroup | None:
    """The run's cgroup where the host delegates one; one task more than the sandbox's own
    processes: bwrap's, outside the namespace."""
    base, _ = delegated_cgroup()
    if base is None:
        return None
    try:
        return RunCgroup(base, limits.cgroup_memory_bytes, limits.processes + 1)
    except OSError as exc:  # delegated, yet refused: run nothing rather than run without it
        raise SandboxUnavailable(f"cannot make the run's cgroup under {base}: {exc}") from exc


def run_python(source: str, stdin: str = "", limits: Limits | None = None) -> Outcome:
    """Run ``source`` as ``/sandbox/main.py`` in a fresh sandbox with ``stdin``; wait at most
    ``limits.wall_seconds`` (plus the time to kill it). Raises :class:`SandboxUnavailable` only
    when bwrap or the interpreter (or its files, or a seccomp filter for this machine) is missing;
    a sandbox that fails to start is a failed run (the caller checks :func:`sandbox_problem` once,
    up front)."""
    limits = limits or Limits()
    if shutil.which("bwrap") is None or interpreter() is None:
        raise SandboxUnavailable("bwrap (bubblewrap) is not installed, or no Python under /usr")
    cgroup = run_cgroup(limits)
    try:
        process, info = start_sandbox(source, limits, cgroup)
        run = SandboxRun(process, info, limits.wall_seconds, limits.output_bytes)
        try:
            run.exchange(stdin.encode("utf-8", "replace"))
            returncode = run.finish()
        except BaseException:
            run.stop()
            raise
        finally:
            run.close()
    finally:
        if cgroup:
            cgroup.close_gate()
            cgroup.remove()
    stdout, stderr = (bytes(run.buffers[stream]).decode("utf-8", "replace")
                      for stream in (process.stdout, process.stderr))
    return Outcome(returncode, stdout, stderr, run.timed_out, run.truncated)


# What the probe's program reports from inside: its input reversed (it runs at all), the seccomp
# mode of itself and of init, init's limits, its parent (init, when the launcher is pid 1), and
# which programs it can see.
_PROBE = (
    "import json, os, sys\n"
    "def seccomp(pid):\n"
    "    return [line.split()[1] for line in open(f'/proc/{pid}/status') if line.startswith('Seccomp:')]\n"
    "def listing(folder):\n"
    "    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []\n"
    "print(json.dumps({'echo': sys.stdin.read()[::-1], 'ppid': os.getppid(), 'seccomp': seccomp('self'),\n"
    "                  'init_seccomp': seccomp(1), 'init_limits': open('/proc/1/limits').read(),\n"
    "                  'programs': listing('/usr/bin') + listing('/bin')}))\n"
)
_PROBE_LIMITS = Limits(wall_seconds=20)
# Without these the sandbox is not offered; the cgroup is a further layer where the host has one.
MANDATORY = ("seccomp", "no_userns", "limits_on_init", "minimal_mounts")


@dataclass(frozen=True)
class SandboxCheck:
    """A probe's answer: why the sandbox cannot be offered (None: it can), and each protection
    with None when it is active, else why not."""

    problem: str | None
    protections: dict[str, str | None]

    def describe(self) -> str:
        active = [name for name, why in self.protections.items() if why is None]
        inactive = [f"{name} ({why})" for name, why in self.protections.items() if why is not None]
        return f"active: {', '.join(active) or 'none'}; not active: {', '.join(inactive) or 'none'}"


def _init_limit(limits_text: str, name: str) -> str | None:
    """The soft limit called ``name`` in a /proc/PID/limits text."""
    for line in limits_text.splitlines():
        if line.startswith(name):
            return line[len(name):].split()[0]
    return None


def protections_seen(report: dict) -> dict[str, str | None]:
    """Each protection, None when the probe's report from inside shows it active, else why not."""
    limits = _PROBE_LIMITS
    init_limits = (_init_limit(report["init_limits"], "Max address space"),
                   _init_limit(report["init_limits"], "Max processes"))
    others = sorted(set(report["programs"]) - {os.path.basename(interpreter())})
    return {
        "seccomp": None if report["seccomp"] == report["init_seccomp"] == ["2"]
        else f"seccomp mode {report['seccomp']}, init's {report['init_seccomp']} (2: a filter)",
        # bwrap refuses to start with --disable-userns where it cannot apply it; the run started.
        "no_userns": None,
        "limits_on_init": None if init_limits == (str(limits.memory_bytes), str(limits.processes))
        and report["ppid"] == 1 else f"init's limits {init_limits}, the program's parent {report['ppid']}",
        "minimal_mounts": None if not others else f"{len(others)} other programs visible, e.g. {others[0]}",
        "cgroup": delegated_cgroup()[1],
    }


def check_sandbox() -> SandboxCheck:
    """A real run in the sandbox (at each call: a worker checks again while it runs, since a
    sandbox can break after its start) that reports from inside which protections hold."""
    if shutil.which("bwrap") is None:
        return SandboxCheck("bwrap (bubblewrap) is not installed (Debian: apt-get install bubblewrap)", {})
    if interpreter() is None:
        return SandboxCheck(f"no Python interpreter under /usr ({', '.join(_SYSTEM_PYTHONS)}) to run "
                            "programs with", {})
    try:
        outcome = run_python(_PROBE, "ok", _PROBE_LIMITS)
    except (OSError, SandboxUnavailable) as exc:
        return SandboxCheck(f"bwrap could not be started: {exc}", {})
    try:
        report = json.loads(outcome.stdout) if outcome.ok else {}
    except ValueError:
        report = {}
    if report.get("echo") != "ko":
        detail = outcome.stderr.strip().splitlines()[-1:] or [f"exit status {outcome.returncode}"]
        return SandboxCheck(f"bwrap cannot create its sandbox here: {detail[0]}", {})
    protections = protections_seen(report)
    return SandboxCheck(mandatory_problem(protections), protections)


def mandatory_problem(protections: dict[str, str | None]) -> str | None:
    """Why the sandbox must not be offered with these protections (None: it may be)."""
    failed = [f"{name} ({protections.get(name, 'not checked')})" for name in MANDATORY
              if protections.get(name, "not checked") is not None]
    return f"mandatory sandbox protections are not active: {', '.join(failed)}" if failed else None


@lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """:func:`probe_sandbox`, once per process: what a job's rewards check up front."""
    return probe_sandbox()


def probe_sandbox() -> str | None:
    """None when a program runs in the sandbox here with its mandatory protections, else why
    not, for a worker's log and a refused ``grpo train``."""
    return check_sandbox().problem
