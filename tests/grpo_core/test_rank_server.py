"""Ranks forked from the rank server (grpo_core.run.rank_server): they come from one server kept
for the thread's launches, past its imports, yet run as their launcher's process would (its
environment, directory, streams) and safely after the launcher computed; a stand-in killed takes
its rank; a server ends with its thread, is replaced when the environment its imports read
changed, and forks only for its own process's children. ``warm=False`` keeps fresh interpreters.

The entries are module-level so the ranks can import them (they get the launcher's import path).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import torch
from waiting import process_gone, wait_until

from grpo_core.parallel.distributed import Ranks
from grpo_core.run import rank_server
from grpo_core.run.launch import RankDied, launch_ranks

pytestmark = pytest.mark.slow


def describe(ranks: Ranks) -> dict:
    """Who this rank is, and whether a parallel matmul finishes: in a child forked from a process
    that ran OpenMP's parallel regions, the first one never does (a thread bounds the wait)."""
    done = threading.Event()

    def multiply() -> None:
        x = torch.randn(1024, 1024)
        (x @ x).sum()
        done.set()

    threading.Thread(target=multiply, daemon=True).start()
    return {"pid": os.getpid(), "parent": os.getppid(), "name": psutil.Process().name(),
            "mark": os.environ.get("GRPO_TEST_MARK"), "cwd": os.getcwd(), "rank": ranks.rank,
            "threads": torch.get_num_threads(), "computed": done.wait(60)}


def wait_forever(ranks: Ranks, folder: str) -> None:
    (Path(folder) / f"rank-{ranks.rank}.pid").write_text(str(os.getpid()))
    threading.Event().wait()


def test_ranks_come_from_one_kept_server_and_run_as_their_launcher(tmp_path, monkeypatch):
    x = torch.randn(1024, 1024)
    (x @ x).sum()  # this process ran parallel regions: a rank forked from it would hang in its own
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRPO_TEST_MARK", "first")
    first = launch_ranks(describe, (), 2, device="cpu")
    server = rank_server.server_pid()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # read by CUDA only, never by the server: kept
    monkeypatch.setenv("GRPO_TEST_MARK", "second")  # a change its imports might have read: replaced
    second = launch_ranks(describe, (), 2, device="cpu")
    for ranks, mark in ((first, "first"), (second, "second")):
        assert [(r["rank"], r["name"]) for r in ranks] == [(0, "grpo-rank-0"), (1, "grpo-rank-1")]
        assert all(r["mark"] == mark and r["cwd"] == str(tmp_path) and r["computed"] for r in ranks), ranks
        assert all(r["parent"] != os.getpid() for r in ranks)
    assert {r["parent"] for r in first} == {server} and process_gone(server)
    assert {r["parent"] for r in second} == {rank_server.server_pid()} != {server}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    third = launch_ranks(describe, (), 2, device="cpu")
    assert {r["parent"] for r in third} == {r["parent"] for r in second}  # kept for the next launch


def test_fresh_interpreters_when_not_warm():
    ranks = launch_ranks(describe, (), 2, device="cpu", warm=False)
    assert all(r["parent"] == os.getpid() and r["computed"] for r in ranks)


def test_a_killed_stand_in_takes_its_rank_and_is_a_death(tmp_path):
    failure: list[BaseException] = []

    def launch() -> None:
        try:
            launch_ranks(wait_forever, (str(tmp_path),), 2, device="cpu")
        except BaseException as exc:
            failure.append(exc)

    launcher = threading.Thread(target=launch)
    launcher.start()
    pid_files = [tmp_path / f"rank-{rank}.pid" for rank in (0, 1)]
    wait_until(lambda: all(p.exists() for p in pid_files), 120, "both ranks to start")
    ranks = [int(p.read_text()) for p in pid_files]
    stand_ins = [p for p in psutil.Process().children() if "rank_client" in " ".join(p.cmdline())]
    assert len(stand_ins) == 2
    [stand_in] = [p for p in stand_ins if p.environ().get("LOCAL_RANK") == "1"]
    stand_in.kill()
    launcher.join(120)
    assert not launcher.is_alive()
    [died] = failure
    assert isinstance(died, RankDied) and (died.rank, died.signal_name) == (1, "SIGKILL")
    wait_until(lambda: all(process_gone(pid) for pid in ranks), 30, f"ranks {ranks} to end")


def test_a_server_ends_with_the_thread_that_started_it():
    started: list[int | None] = []

    def start() -> None:  # a launch: once it served, the server is past asking to die with the thread
        launch_ranks(describe, (), 1, device="cpu")
        started.append(rank_server.server_pid())

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    [pid] = started
    assert pid is not None and pid != rank_server.server_pid()  # each thread has its own
    wait_until(lambda: process_gone(pid), 30, "the thread's server to end")


_ASK = """
import json, os, socket, sys
def ask(folder):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.connect("\\0" + sys.argv[1])
    request = {"target": "os:mkdir", "args": [folder], "environment": dict(os.environ),
               "cwd": os.getcwd(), "path": sys.path}
    try:  # a refused peer's connection is closed before its request is read
        socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
        pid = connection.recv(64).decode()
    except (BrokenPipeError, ConnectionResetError):
        return ""
    return pid and [pid, connection.recv(64).decode()]  # the forked pid, then its exit status
child = os.fork()
if child == 0:  # the launcher's grandchild
    print(json.dumps({"grandchild": ask(sys.argv[3])}), flush=True)
    os._exit(0)
os.waitpid(child, 0)
print(json.dumps({"child": ask(sys.argv[2])}), flush=True)
"""


def test_the_server_forks_only_for_children_of_its_own_process(tmp_path):
    address = rank_server.address([])
    asked = subprocess.run([sys.executable, "-c", _ASK, address, str(tmp_path / "child"),
                            str(tmp_path / "grandchild")], capture_output=True, text=True, timeout=120)
    answers = {key: value for line in asked.stdout.splitlines() for key, value in json.loads(line).items()}
    assert answers["grandchild"] == "" and not (tmp_path / "grandchild").exists()  # refused, nothing ran
    pid, status = answers["child"]
    assert pid.isdigit() and status == "0" and (tmp_path / "child").is_dir()  # served: the target ran


def test_the_server_refuses_another_user_even_among_its_processes_children(tmp_path):
    # An abstract socket has no file permissions: the peer's user is what the server checks.
    if os.getuid() != 0:
        pytest.skip("becoming another user needs root")
    address = rank_server.address([])
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # only sockets here: this process's OpenMP pool is not touched
        try:
            os.setgid(65534)
            os.setuid(65534)  # nobody
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            connection.connect("\0" + address)  # the server listens: anything may connect
            request = {"target": "os:mkdir", "args": [str(tmp_path / "nobody")], "environment": {},
                       "cwd": "/", "path": sys.path}
            try:  # closed before the request is read
                socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
                answer = connection.recv(64)
            except (BrokenPipeError, ConnectionResetError):
                answer = b""
            os.write(writer, answer or b"refused")
        finally:
            os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    assert os.read(reader, 64) == b"refused" and not (tmp_path / "nobody").exists()


def test_a_process_past_its_imports_forks_its_server_which_forks_working_ranks():
    # As a warm spare does: imports, no computation, then a server forked from it (no second
    # interpreter importing all of it again), whose ranks compute.
    code = ("import json, os, sys, psutil; from worker.job_process import warm_imports; warm_imports(); "
            "from grpo_core.run import rank_server; from grpo_core.run.launch import launch_ranks; "
            "rank_server.address(['worker.ranks'], fork=True); server = rank_server.server_pid(); "
            "sys.path.insert(0, os.path.join(os.getcwd(), 'tests', 'grpo_core')); "
            "from test_rank_server import describe; "
            "ranks = launch_ranks(describe, (), 2, device='cpu'); "
            "print(json.dumps({'me': os.getpid(), 'server': server, 'same': rank_server.server_pid(), "
            "'ranks': ranks, 'name': psutil.Process(server).name(), "
            "'forked': psutil.Process(server).cmdline() == psutil.Process().cmdline()}))")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(repo / "tests")})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["server"] == found["same"] and found["server"] != found["me"]
    assert found["forked"] and found["name"] == rank_server.SERVER_NAME  # not a second interpreter
    assert [(r["rank"], r["name"]) for r in found["ranks"]] == [(0, "grpo-rank-0"), (1, "grpo-rank-1")]
    assert all(r["parent"] == found["server"] and r["computed"] for r in found["ranks"]), found
    wait_until(lambda: process_gone(found["server"]), 30, "the server to end with its process")
