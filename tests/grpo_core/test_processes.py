"""The one copy of the process facts the launcher, the checkpoint sweep and the worker share
(:mod:`grpo_core.run.processes`), on real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from grpo_core.run.processes import process_alive, signal_name, write_whole


def test_a_running_child_is_alive_and_a_reaped_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)


def test_a_zombie_child_counts_as_dead() -> None:
    """A child that exited but was not reaped yet still has its pid (``kill(pid, 0)`` succeeds),
    yet runs nothing: a heartbeat must not keep its job's mark alive for it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Wait for the exit without reaping it: the child stays a zombie until child.wait().
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        os.kill(child.pid, 0)  # the pid still exists ...
        assert not process_alive(child.pid)  # ... but the process is dead
    finally:
        child.wait()


def test_signals_are_named_and_unknown_numbers_said_so() -> None:
    assert signal_name(signal.SIGKILL) == "SIGKILL"
    assert signal_name(1199) == "signal 1199"


def test_a_file_written_whole_replaces_the_old_and_leaves_no_partial(tmp_path: Path) -> None:
    target = tmp_path / "outcome.pkl"
    target.write_bytes(b"old")
    write_whole(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outcome.pkl"]
