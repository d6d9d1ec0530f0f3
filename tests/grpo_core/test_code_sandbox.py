"""The sandbox that runs completions' code (``grpo_core.rewards.sandbox``): what a program sees
and may do in it, with real bubblewrap, and the check that says which protections hold. The
attacks on it, one per escape route, are in ``test_sandbox_escapes.py``."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from sandbox_guard import needs_sandbox
from sandbox_processes import PID_NAMESPACE, processes_in

from grpo_core.rewards.sandbox import Limits, run_python, sandbox_problem

pytestmark = needs_sandbox

REPO = Path(__file__).resolve().parents[2]


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


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    started = time.monotonic()
    outcome = run_python(PID_NAMESPACE + "while True:\n    pass\n", limits=Limits(wall_seconds=1.0))
    elapsed = time.monotonic() - started
    assert outcome.timed_out and not outcome.ok and outcome.returncode is None
    assert elapsed < 4, elapsed
    assert processes_in(outcome.stdout.strip()) == []


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


