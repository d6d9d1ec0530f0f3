"""The command torch's elastic agent starts for a rank: a stand-in for the rank the rank server
forks (:mod:`grpo_core.run.rank_server` says why). Standard library only, run as
``python -S -c``: it starts in milliseconds.

``python -S -c 'from grpo_core.run.rank_client import main; main()' ADDRESS PARENT_PID PATH
TARGET [ARG...]``: die with the agent's process (PARENT_PID), hand the server at ADDRESS this
process's environment (the agent put the rank's number and rendezvous there), working directory
and standard streams, with the import path PATH (JSON) and ``module:function`` TARGET to call
with the ARGs; forward the agent's signals to the rank; end as the rank ended.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from grpo_core.run.lifetime import die_with_parent

# The signals torch's elastic agent handles (it takes the ranks down on them): each reaches the rank.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def main() -> None:
    address, parent_pid, path, target, *args = sys.argv[1:]
    die_with_parent(int(parent_pid))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.connect(f"\0{address}")
    request = {"target": target, "args": args, "environment": dict(os.environ), "cwd": os.getcwd(),
               "path": json.loads(path)}
    socket.send_fds(server, [json.dumps(request).encode()], [0, 1, 2])
    # A signal before the rank's pid came ends this process, and the server kills the rank.
    rank = int(server.recv(64) or _rank_lost())
    for number in FORWARDED_SIGNALS:
        signal.signal(number, lambda number, _frame: _forward(rank, number))
    status = server.recv(64)  # retried across the forwarded signals' handlers (PEP 475)
    if not status:
        _rank_lost()
    status = int(status)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number in FORWARDED_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    sys.exit(os.waitstatus_to_exitcode(status))


def _forward(rank: int, number: int) -> None:
    try:
        os.kill(rank, number)
    except ProcessLookupError:
        pass  # it ended already; its status is on its way


def _rank_lost() -> bytes:
    """The server went without answering: to the agent, a rank that died."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")
