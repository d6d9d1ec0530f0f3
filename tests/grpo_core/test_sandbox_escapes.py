"""Escapes from the code sandbox (``grpo_core.rewards.sandbox``), one test per route that issue 24
names: each runs a real attacking program through ``run_python`` and checks that it was contained,
on the host wherever the host can see it (no connection reached a listener, no host process was
signalled, no process of the run is left). The attacks are real: run against the launcher the
sandbox had before (bwrap's own reaper as pid 1, no seccomp filter, all of /usr), the ptrace, the
/proc/1/mem, SysV and nested-namespace tests fail, i.e. those attacks got through.

The programs reach system calls through ctypes, which the sandbox's interpreter has (its
``lib-dynload`` and the libraries it links are mounted); each test's limits are small, so that the
whole file runs in well under a minute."""

from __future__ import annotations

import errno
import os
import platform
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from sandbox_guard import needs_sandbox
from sandbox_processes import PID_NAMESPACE, processes_in

from grpo_core.rewards.sandbox import Limits, run_python

pytestmark = needs_sandbox

REPO = Path(__file__).resolve().parents[2]
LIBC = "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
PTRACE_ATTACH = 16
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
CLONE_SYSCALL = {"x86_64": 56, "aarch64": 220}


def results(stdout: str) -> dict[str, tuple[int, int]]:
    """The programs' ``name result errno`` lines, by name."""
    found = {}
    for line in stdout.splitlines():
        name, result, error = line.split()
        found[name] = (int(result), int(error))
    return found


def test_ptrace_of_the_sandboxs_init_is_refused() -> None:
    outcome = run_python(LIBC + f"print('attach', libc.ptrace({PTRACE_ATTACH}, 1, 0, 0), "
                                "ctypes.get_errno())\n")
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout)["attach"] == (-1, errno.EPERM)


def test_ptrace_of_a_sibling_is_refused() -> None:
    outcome = run_python(LIBC + (
        "sleeper = os.fork()\n"
        "if sleeper == 0:\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        "attacker = os.fork()\n"
        "if attacker == 0:\n"
        f"    print('attach', libc.ptrace({PTRACE_ATTACH}, sleeper, 0, 0), ctypes.get_errno(), flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(attacker, 0)\n"
        "os.kill(sleeper, 9)\n"))
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout)["attach"] == (-1, errno.EPERM)


def test_the_memory_of_init_cannot_be_written_through_proc() -> None:
    # Writes back the bytes it read, so that against a sandbox that lets it, init is unharmed.
    outcome = run_python(
        "try:\n"
        "    with open('/proc/1/mem', 'r+b', buffering=0) as mem:\n"
        "        maps = open('/proc/1/maps').read().splitlines()\n"
        "        start = next(int(line.split('-')[0], 16) for line in maps if ' rw-p ' in line)\n"
        "        mem.seek(start)\n"
        "        data = mem.read(8)\n"
        "        mem.seek(start)\n"
        "        mem.write(data)\n"
        "        print('wrote', 0, 0)\n"
        "except OSError as exc:\n"
        "    print('open', -1, exc.errno)\n")
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout) == {"open": (-1, errno.EACCES)}


def test_sysv_shared_memory_cannot_hold_memory_past_the_limit() -> None:
    # Three 64 MiB segments, each filled through a mapping and detached: against a sandbox that
    # allows SysV shm they stay allocated, 192 MiB under a 128 MiB address-space limit.
    outcome = run_python(LIBC + (
        "libc.shmat.restype = ctypes.c_void_p\n"
        "held = 0\n"
        "for _ in range(3):\n"
        f"    segment = libc.shmget({IPC_PRIVATE}, 64 * 2**20, {IPC_CREAT} | 0o600)\n"
        "    if segment < 0:\n"
        "        print('shmget', segment, ctypes.get_errno())\n"
        "        break\n"
        "    address = libc.shmat(segment, None, 0)\n"
        "    ctypes.memset(address, 1, 64 * 2**20)\n"
        "    libc.shmdt(ctypes.c_void_p(address))\n"
        "    held += 64\n"
        "print('held', held, 0)\n"), limits=Limits(memory_bytes=128 * 2**20))
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout) == {"shmget": (-1, errno.EPERM), "held": (0, 0)}


def test_sysv_message_queues_are_refused() -> None:
    outcome = run_python(LIBC + f"print('msgget', libc.msgget({IPC_PRIVATE}, {IPC_CREAT} | 0o600), "
                                "ctypes.get_errno())\n")
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout)["msgget"] == (-1, errno.EPERM)


def test_posix_shared_memory_in_dev_shm_cannot_be_made() -> None:
    outcome = run_python(
        "from multiprocessing import shared_memory\n"
        "try:\n"
        "    shared_memory.SharedMemory(create=True, size=2**20)\n"
        "    print('created', 0, 0)\n"
        "except OSError as exc:\n"
        "    print('shm_open', -1, exc.errno)\n")
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout)["shm_open"][0] == -1


def test_no_nested_user_and_mount_namespace_for_a_tmpfs_past_the_tmp_cap() -> None:
    # Against a sandbox that allows it: a private tmpfs mounted over /tmp takes 32 MiB past
    # the 16 MiB cap of the real one.
    outcome = run_python(LIBC + (
        f"result = libc.unshare({CLONE_NEWUSER | CLONE_NEWNS})\n"
        "print('unshare', result, ctypes.get_errno(), flush=True)\n"
        "if result == 0:  # be root in it, as the files on the new tmpfs need an owner\n"
        "    open('/proc/self/setgroups', 'w').write('deny')\n"
        "    open('/proc/self/uid_map', 'w').write('0 65534 1')\n"
        "    open('/proc/self/gid_map', 'w').write('0 65534 1')\n"
        "if result == 0 and libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0:\n"
        "    for index in range(8):\n"
        "        open(f'/tmp/{index}', 'wb').write(b'x' * (4 * 2**20 - 1))\n"
        "    print('held', 8 * (4 * 2**20 - 1), 0)\n"), limits=Limits(tmp_bytes=16 * 2**20))
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout) == {"unshare": (-1, errno.EPERM)}


@pytest.mark.skipif(platform.machine() not in CLONE_SYSCALL, reason="clone's number is known for these only")
def test_clone_with_namespace_flags_is_refused() -> None:
    clone = CLONE_SYSCALL[platform.machine()]
    outcome = run_python(LIBC + (
        f"child = libc.syscall({clone}, {CLONE_NEWUSER} | {signal.SIGCHLD}, 0, 0, 0, 0)\n"
        "if child == 0:\n"
        "    os._exit(0)\n"
        "print('clone', min(child, 0), ctypes.get_errno() if child < 0 else 0)\n"))
    assert outcome.ok, outcome.stderr
    assert results(outcome.stdout)["clone"] == (-1, errno.EPERM)


def test_the_worker_environment_and_files_are_out_of_reach(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the-host-secret")
    secret.chmod(0o644)
    os.environ["GRPO_TEST_PLANTED_SECRET"] = "planted-in-the-worker"
    try:
        outcome = run_python(
            "import os\n"
            "print(dict(os.environ))\n"
            "for path in ('/proc/self/environ', '/proc/1/environ', '/proc/1/cmdline', "
            f"{str(secret)!r}, {str(REPO / 'pyproject.toml')!r}):\n"
            "    try:\n"
            "        print(path, open(path, 'rb').read())\n"
            "    except OSError as exc:\n"
            "        print(path, type(exc).__name__)\n")
    finally:
        del os.environ["GRPO_TEST_PLANTED_SECRET"]
    assert outcome.ok, outcome.stderr
    for leaked in ("planted-in-the-worker", "the-host-secret", "[build-system]"):
        assert leaked not in outcome.stdout + outcome.stderr


def test_a_cpu_loop_is_stopped_by_the_cpu_limit() -> None:
    started = time.monotonic()
    outcome = run_python("while True:\n    pass\n", limits=Limits(cpu_seconds=1, wall_seconds=10))
    assert not outcome.timed_out and outcome.returncode not in (0, None), outcome
    assert time.monotonic() - started < 5


def test_a_daemonised_grandchild_does_not_outlive_the_timeout() -> None:
    outcome = run_python(PID_NAMESPACE + (
        "import sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.close(1)\n"
        "        os.close(2)\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"), limits=Limits(wall_seconds=1))
    assert outcome.timed_out
    assert processes_in(outcome.stdout.splitlines()[0]) == []


def test_no_network_a_connection_to_a_listening_host_port_is_refused() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        outcome = run_python(
            "import socket\n"
            "for host in ('127.0.0.1', 'localhost', '10.0.0.1'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=1)\n"
            "        print(host, 'connected')\n"
            "    except OSError as exc:\n"
            "        print(host, type(exc).__name__, exc.errno)\n")
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached it
    assert outcome.ok, outcome.stderr
    assert "connected" not in outcome.stdout
    lines = outcome.stdout.splitlines()
    assert lines[0] == f"127.0.0.1 OSError {errno.EAFNOSUPPORT}"  # not even a socket of its own loopback
    assert all(line.split()[1].endswith(("Error", "error")) for line in lines), lines  # no route out


SOCKET_SYSCALL = {"x86_64": 41, "aarch64": 198}
AF_VSOCK = 40


def test_sockets_of_every_family_but_unix_are_refused() -> None:
    # A network namespace does not isolate vsock: from a VM's guest it reaches the host's services.
    # The raw call passes the family with high bits set: the kernel reads an int, so must the filter.
    raw_socket = SOCKET_SYSCALL.get(platform.machine(), 41)
    outcome = run_python(LIBC + (
        "import socket\n"
        "families = {'vsock': 40, 'inet': socket.AF_INET, 'inet6': socket.AF_INET6, 'netlink': 16,\n"
        "            'packet': 17, 'bluetooth': 31, 'alg': 38, 'unspec': 0}\n"
        "for name, family in families.items():\n"
        "    for kind, make in (('socket', socket.socket), ('socketpair', socket.socketpair)):\n"
        "        try:\n"
        "            make(family, socket.SOCK_STREAM if family != 16 else socket.SOCK_RAW)\n"
        "            print(kind + '-' + name, 0, 0)\n"
        "        except OSError as exc:\n"
        "            print(kind + '-' + name, -1, exc.errno)\n"
        f"print('raw-vsock', libc.syscall({raw_socket}, ctypes.c_long((1 << 32) | {AF_VSOCK}), 1, 0),\n"
        "      ctypes.get_errno())\n"
        "a, b = socket.socketpair(socket.AF_UNIX)\n"
        "a.sendall(b'hi')\n"
        "print('unix-pair', len(b.recv(2)), 0)\n"
        "print('unix-socket', min(socket.socket(socket.AF_UNIX).fileno(), 0), 0)\n"))
    assert outcome.ok, outcome.stderr
    found = results(outcome.stdout)
    assert found.pop("unix-pair") == (2, 0) and found.pop("unix-socket") == (0, 0)
    assert len(found) == 17 and set(found.values()) == {(-1, errno.EAFNOSUPPORT)}, found


def test_multiprocessing_still_talks_over_unix_sockets_and_pipes() -> None:
    # A duplex Pipe is an AF_UNIX socketpair, a one-way one an os.pipe. (A Pool or Lock needs
    # POSIX semaphores in /dev/shm, which the read-only /dev refuses anyway.)
    outcome = run_python(
        "import multiprocessing as mp\n"
        "ctx = mp.get_context('fork')\n"
        "for duplex in (True, False):\n"
        "    here, there = ctx.Pipe(duplex=duplex)\n"
        "    child = ctx.Process(target=there.send, args=(sum(n * n for n in range(10)),))\n"
        "    child.start()\n"
        "    print(here.recv())\n"
        "    child.join()\n", limits=Limits(processes=16))
    assert outcome.ok, outcome.stderr
    assert outcome.stdout.split() == ["285", "285"]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="modify_ldt exists on x86 only")
def test_modify_ldt_is_refused() -> None:
    # func 1 writes an LDT entry; 0 reads the table. Either is refused before the kernel looks.
    outcome = run_python(LIBC + (
        "table = ctypes.create_string_buffer(16)\n"
        "for func in (0, 1, 0x11):\n"
        "    print(f'modify_ldt-{func}', libc.syscall(154, func, table, 16), ctypes.get_errno())\n"))
    assert outcome.ok, outcome.stderr
    assert set(results(outcome.stdout).values()) == {(-1, errno.EPERM)}, outcome.stdout


def test_files_outside_the_system_folders_are_invisible(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the-host-secret")
    secret.chmod(0o644)
    outcome = run_python(
        "import os\n"
        f"for path in [{str(secret)!r}, '/etc/shadow', '/etc/passwd', '/root', {str(REPO)!r}, '/home']:\n"
        "    print(path, os.path.exists(path))\n")
    assert outcome.ok, outcome.stderr
    assert "True" not in outcome.stdout
    assert "the-host-secret" not in outcome.stdout + outcome.stderr


def test_a_fork_bomb_is_bounded_finishes_in_time_and_leaves_no_process() -> None:
    bomb = PID_NAMESPACE + (
        "import os, time\n"
        "made = failed = 0\n"
        "while time.monotonic() < 10**9:\n"
        "    try:\n"
        "        os.fork()\n"
        "        made += 1\n"
        "    except OSError:\n"
        "        failed += 1\n")
    started = time.monotonic()
    outcome = run_python(bomb, limits=Limits(wall_seconds=2.0, processes=16))
    elapsed = time.monotonic() - started
    assert outcome.timed_out and elapsed < 6, elapsed
    assert processes_in(outcome.stdout.splitlines()[0]) == []
    # The host can still start processes at once.
    assert subprocess.run(["true"], timeout=5).returncode == 0


def test_a_memory_bomb_fails_inside_its_limit() -> None:
    outcome = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))\n",
                         limits=Limits(memory_bytes=128 * 2**20, wall_seconds=10))
    assert not outcome.timed_out and outcome.returncode == 1
    assert "MemoryError" in outcome.stderr


def test_huge_output_is_capped_and_the_writer_stopped() -> None:
    started = time.monotonic()
    outcome = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
                         limits=Limits(output_bytes=10_000, wall_seconds=10))
    assert outcome.truncated and not outcome.ok and not outcome.timed_out
    assert len(outcome.stdout) == 10_000
    assert time.monotonic() - started < 5


def test_signals_cannot_reach_the_host_and_killing_its_parent_changes_nothing() -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        outcome = run_python(
            "import os, signal\n"
            f"for pid in ({bystander.pid}, {os.getpid()}, os.getppid(), -1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "        print(pid, 'sent')\n"
            "    except OSError as exc:\n"
            "        print(pid, type(exc).__name__)\n"
            "print('still here')\n")
        assert bystander.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        bystander.kill()
        bystander.wait()
    lines = outcome.stdout.splitlines()
    # The host's pids do not exist in its namespace (or name its own few processes).
    assert f"{bystander.pid} ProcessLookupError" in lines or bystander.pid < 10
    assert f"{os.getpid()} ProcessLookupError" in lines or os.getpid() < 10


def test_a_daemonized_child_does_not_outlive_the_run() -> None:
    outcome = run_python(PID_NAMESPACE + (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.close(1); os.close(2)\n"
        "    time.sleep(60)\n"
        "print('parent done')\n"))
    assert outcome.ok, outcome.stderr
    namespace = outcome.stdout.splitlines()[0]
    deadline = time.monotonic() + 5
    while processes_in(namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_in(namespace) == []
