"""The sandbox that runs completions' code (``grpo_core.rewards.sandbox``), attacked from inside: each
program below tries an escape with real bubblewrap, and the test checks on the host that it
failed (no connection reached a listener, no file appeared, no process survived)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from sandbox_guard import needs_sandbox

from grpo_core.rewards.sandbox import Limits, run_python, sandbox_problem

pytestmark = needs_sandbox

REPO = Path(__file__).resolve().parents[2]
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


def test_the_sandbox_works_here_at_all() -> None:
    assert sandbox_problem() is None
    outcome = run_python("import sys\nprint(sys.stdin.read().upper())", "hello")
    assert outcome.ok and outcome.stdout == "HELLO\n"


def test_it_runs_as_nobody_with_no_capabilities_no_environment_and_only_its_own_processes() -> None:
    os.environ["GRPO_TEST_SECRET_TOKEN"] = "s3cr3t-in-the-environment"
    try:
        outcome = run_python(
            "import os\n"
            "print(os.getuid(), os.getgid())\n"
            "print([line for line in open('/proc/self/status') if line.startswith('CapEff')][0].split()[1])\n"
            "print(' '.join(p for p in os.listdir('/proc') if p.isdigit()))\n"
            "print(dict(os.environ))\n")
    finally:
        del os.environ["GRPO_TEST_SECRET_TOKEN"]
    uid, caps, pids, environment = outcome.stdout.splitlines()
    assert uid == "65534 65534"
    assert int(caps, 16) == 0
    assert max(map(int, pids.split())) < 10  # its own namespace's few pids, none of the host's
    assert "s3cr3t" not in environment and "s3cr3t" not in outcome.stderr


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
    assert lines[0].startswith("127.0.0.1 ConnectionRefusedError")  # its own loopback, empty
    assert all(line.split()[1].endswith(("Error", "error")) for line in lines), lines  # no route out


def test_writes_outside_its_tmp_fail_and_nothing_appears_on_the_host(tmp_path: Path) -> None:
    targets = [tmp_path / "escaped.txt", Path("/etc/grpo-escaped"), REPO / "grpo-escaped.txt",
               Path("/usr/grpo-escaped"), Path("/grpo-escaped"), Path("/dev/grpo-escaped"),
               Path("/dev/shm/grpo-escaped")]
    program = (
        "for path in %r:\n"
        "    try:\n"
        "        open(path, 'w').write('pwned')\n"
        "        print(path, 'WROTE')\n"
        "    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\n"
        "open('/dev/null', 'w').write('discarded')\n"
        "open('/tmp/scratch', 'w').write('fine')\n"
        "print(open('/tmp/scratch').read())\n"
    ) % [str(path) for path in targets]
    outcome = run_python(program)
    assert outcome.ok, outcome.stderr
    assert outcome.stdout.splitlines()[-1] == "fine"  # its private /tmp is writable
    for path in targets:
        assert not path.exists(), f"{path} was written from inside the sandbox"
    wrote = [line for line in outcome.stdout.splitlines() if line.endswith("WROTE")]
    # Only a path that lies under /tmp could be written, and then in its private tmpfs.
    assert all(line.startswith("/tmp/") for line in wrote), wrote


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


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    started = time.monotonic()
    outcome = run_python(PID_NAMESPACE + "while True:\n    pass\n", limits=Limits(wall_seconds=1.0))
    elapsed = time.monotonic() - started
    assert outcome.timed_out and not outcome.ok and outcome.returncode is None
    assert elapsed < 4, elapsed
    assert processes_in(outcome.stdout.strip()) == []


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


def test_huge_stderr_is_capped_too_and_big_stdin_is_delivered() -> None:
    text = "line\n" * 100_000  # 500 kB: more than a pipe holds
    program = ("import sys, time\nprint(len(sys.stdin.read()), flush=True)\ntime.sleep(0.3)\n"
               "sys.stderr.write('e' * 10**6)\n")
    outcome = run_python(program, text, limits=Limits(output_bytes=1000))
    assert outcome.stdout == f"{len(text)}\n"
    assert outcome.truncated and len(outcome.stderr) == 1000


def test_a_file_bigger_than_the_file_size_limit_cannot_be_written() -> None:
    program = "open('/tmp/big', 'wb').write(b'x' * (8 * 2**20))\n"
    outcome = run_python(program, limits=Limits(file_bytes=2**20))
    assert outcome.returncode != 0
    assert "File too large" in outcome.stderr or outcome.returncode == -signal.SIGXFSZ


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
