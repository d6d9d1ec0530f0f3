"""The rank launcher: every rank's value comes back in rank order; a rank's error reaches the
caller with its rank, code and traceback; a rank process that dies without raising is told apart
(the machine's fault); and no rank outlives the process that launched it, however that ends.

The entries are module-level so the ranks can import them (they get the launcher's import path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import process_gone, wait_until

from grpo_core.errors import GRPOError
from grpo_core.parallel.distributed import Ranks
from grpo_core.run.launch import RankDied, RankFailed, launch_ranks

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def world(ranks: Ranks, scale: int) -> tuple[int, int, float]:
    return ranks.rank * scale, ranks.world_size, ranks.sum([ranks.rank + 1])[0]


def fail_on(ranks: Ranks, rank: int) -> None:
    if ranks.rank == rank:
        raise GRPOError("the reward raised at scoring", code="reward_error")
    ranks.sum([1.0])  # the other rank waits in a collective, which breaks when its peer goes


def kill_self_on(ranks: Ranks, rank: int) -> None:
    if ranks.rank == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    ranks.sum([1.0])


def wait_forever(ranks: Ranks, folder: str) -> None:
    (Path(folder) / f"rank-{ranks.rank}.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(1)


def test_each_ranks_value_comes_back_in_rank_order():
    assert launch_ranks(world, (10,), 2, device="cpu") == [(0, 2, 3.0), (10, 2, 3.0)]


def test_a_ranks_error_reaches_the_caller_with_its_rank_and_code():
    with pytest.raises(RankFailed) as failed:
        launch_ranks(fail_on, (1,), 2, device="cpu")
    # Rank 0 fails too (its collective broke), but later: the cause is rank 1's error.
    assert (failed.value.rank, failed.value.code) == (1, "reward_error")
    assert failed.value.exception_type == "grpo_core.errors.GRPOError"
    assert failed.value.message == "rank 1 failed: the reward raised at scoring"
    assert "in fail_on" in failed.value.traceback and "reward raised" in failed.value.traceback


def test_a_rank_killed_by_a_signal_is_a_death_not_an_error():
    with pytest.raises(RankDied) as died:
        launch_ranks(kill_self_on, (1,), 2, device="cpu")
    assert (died.value.rank, died.value.signal_name, died.value.exitcode) == (1, "SIGKILL", -9)
    assert died.value.code == "rank_died" and "rank 1" in died.value.message


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_no_rank_outlives_its_launcher(tmp_path, how):
    script = ("import sys; from grpo_core.run.launch import launch_ranks; "
              "from test_launch import wait_forever; "
              "launch_ranks(wait_forever, (sys.argv[1],), 2, device='cpu')")
    # This module imports the test helpers' folder too.
    path = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
    # TMPDIR: a SIGKILLed launcher cannot remove its launch folder; it stays in the test's.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TMPDIR": str(tmp_path)}
    launcher = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env, cwd=REPO)
    try:
        pid_files = [tmp_path / f"rank-{rank}.pid" for rank in (0, 1)]
        wait_until(lambda: all(p.exists() for p in pid_files) or launcher.poll() is not None, 120,
                   "both ranks to start")
        assert launcher.poll() is None, "the launcher ended before its ranks started"
        pids = [int(p.read_text()) for p in pid_files]
        launcher.send_signal(how)
        # SIGKILL: the kernel kills the ranks (PR_SET_PDEATHSIG). SIGTERM: the launcher takes them
        # down, then dies of the signal as it would have without ranks.
        assert launcher.wait(timeout=60) == -how
        wait_until(lambda: all(process_gone(pid) for pid in pids), 30, f"ranks {pids} to end")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
