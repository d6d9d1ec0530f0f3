"""Where ranks are forked from: a server that imported torch, transformers and the ranks' code
once, so a launch's ranks start in milliseconds. Started as fresh interpreters, each rank of each
launch paid those imports again (3-7 s of CPU a rank, k times per launch, again on every retry
and resume); that is most of the time between a multi-device job's dispatch and its first step.

**Why a server, and not a fork of the launcher.** The server never computes, so it holds none of
what makes a fork unsafe: no OpenMP thread pool (a child forked after its parent ran a parallel
region hangs in its first one; measured here with torch's CPU kernels), no CUDA context, no open
connection to a database or an object store. The launcher's own process may hold all of those.

**Forked or started.** A launcher that has imported everything and computed nothing yet (a
warm spare job process, right after its imports) forks its server: a fork instead of a second
interpreter importing it all, and ranks that inherit every import the job needs. Any other
launcher starts a fresh interpreter as its server.

**Why torch's launcher still sees processes of its own.** Torch's elastic agent starts each rank
as a command and reads its exit status, signals it to take a group down, and reports every
failed rank with its status (:mod:`grpo_core.run.rank_failures` needs them all; its
multiprocessing form reports only the first). So the command it starts is a stand-in
(:mod:`grpo_core.run.rank_client`, a bare interpreter with no imports to speak of): it hands
the server its environment, working directory and standard streams, the server forks the rank
with them, and the stand-in forwards the agent's signals to the rank and ends as the rank ended
(the same exit code, or killed by the same signal). To the agent the stand-in *is* the rank.

**Lifetimes.** The server dies with the thread that started it (:func:`die_with_parent`), so each
launching thread has its own (:func:`address`); each rank dies with the server; a stand-in dies
with the agent's process, and the server kills a rank whose stand-in went. So every rank still
ends with its launcher, however it ends. A server is kept for the thread's next launch, and
replaced when the launcher's environment changed since it started (libraries read some of it once,
at the imports the server did).

**Who may ask.** The server listens on an abstract Unix socket and forks only for a peer of its
own user that is a child of the process it serves (the agent's stand-ins are): nothing else on
the machine, a sandboxed program included, can have code run through it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

from grpo_core.run.lifetime import die_with_parent
from grpo_core.run.processes import name_process, parent_pid
from grpo_core.run.rank_client import FORWARDED_SIGNALS

log = logging.getLogger(__name__)

# A request: JSON (the rank's target, arguments, environment, working directory and import path)
# with the stand-in's stdin, stdout and stderr attached.
MAX_REQUEST_BYTES = 1 << 22
_STREAMS = 3


@dataclass
class _Server:
    process: subprocess.Popen | _Forked
    address: str
    environment: dict[str, str]


class _Forked:
    """A server forked from its launcher: the parts of :class:`subprocess.Popen` used here."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


# Variables a server may differ from its launcher in (each rank takes its launcher's environment
# anyway; the comparison is only about what the server's imports read): the devices, read when
# CUDA initialises, which a server never does (a warm job process starts its server before it
# knows its job's devices); torch's launcher's own, which it sets in its process at the first
# launch; the name of the test pytest runs, which changes at every test.
NOT_READ_AT_IMPORT = ("CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST")
NOT_READ_AT_IMPORT_PREFIXES = ("TORCHELASTIC_",)

# Each thread's own: a server dies with the thread that started it. (Not a dict by thread id: a new
# thread may get a dead one's id while the kernel is still killing that one's server.)
_here = threading.local()
# A forked child is not its parent's server's parent: it starts its own.
os.register_at_fork(after_in_child=lambda: _here.__dict__.clear())


def address(modules: list[str], fork: bool = False) -> str:
    """The socket of this thread's server, started (importing ``modules`` besides the launcher)
    unless it runs with the environment the launcher has now.

    ``fork``: this process has imported ``modules`` and never computed (a warm spare job process,
    right after its imports), so a server is forked from it, already past its imports, instead of
    starting as a fresh interpreter that imports them all again (~2 s of CPU)."""
    environment = _imports_read(os.environ)
    server: _Server | None = getattr(_here, "server", None)
    if server is not None and server.process.poll() is not None:
        log.warning("the rank server %s had exited (%s); starting another", server.process.pid,
                    server.process.returncode)
        server = None
    if server is not None and server.environment != environment:
        changed = {name for name, _ in set(server.environment.items()) ^ set(environment.items())}
        log.info("the environment changed since the rank server %s started (%s); starting another",
                 server.process.pid, ", ".join(sorted(changed)))
        _stop(server)
        server = None
    if server is None:
        server = _here.server = _start(modules, environment, fork)
    return server.address


def server_pid() -> int | None:
    """The pid of this thread's server while it runs (what its ranks' parent is), else None."""
    server: _Server | None = getattr(_here, "server", None)
    return server.process.pid if server is not None and server.process.poll() is None else None


def _imports_read(environment: os._Environ | dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in environment.items()
            if name not in NOT_READ_AT_IMPORT and not name.startswith(NOT_READ_AT_IMPORT_PREFIXES)}


def _start(modules: list[str], environment: dict[str, str], fork: bool) -> _Server:
    name = f"grpo-rank-server-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    modules = ["grpo_core.run.launch", *modules]
    path = [os.path.abspath(entry) for entry in sys.path]
    try:
        listener.bind(f"\0{name}")
        listener.listen(64)  # the stand-ins wait in the queue while the server imports
        process = _fork(listener, modules, path) if fork else subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(listener.fileno()), str(os.getpid()), json.dumps(modules),
             json.dumps(path)],
            # In the root folder: the launcher's may be removed under it (a warm job process's is),
            # and every relative lookup of a library loading there would fail.
            pass_fds=[listener.fileno()], cwd="/")
    finally:
        listener.close()  # the server holds its own copy
    return _Server(process, name, environment)


def _fork(listener: socket.socket, modules: list[str], path: list[str]) -> _Forked:
    owner = os.getpid()
    pid = os.fork()
    if pid == 0:  # the server: it never returns
        try:
            os.chdir("/")  # as a started server does
            # Nor does it hold the launcher's stdin (a spare's is the pipe its attempt comes on: a
            # write there must fail once the spare is gone).
            nothing = os.open(os.devnull, os.O_RDONLY)
            os.dup2(nothing, 0)
            os.close(nothing)
            _serve(listener.fileno(), owner, modules, path)
        finally:
            os._exit(1)
    return _Forked(pid)


# The server's command: this package found where the launcher found it, whatever the directory.
_SERVE = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
          "from grpo_core.run.rank_server import serve; serve()")


def _stop(server: _Server) -> None:
    server.process.kill()
    server.process.wait()


# --- the server's side -----------------------------------------------------------------------


def serve() -> None:
    """The server's process: ``-c`` with the listening socket's fd, the pid it serves, the modules
    to import (JSON) and the import path (JSON)."""
    _serve(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4]))


# What ps and psutil call a server (15 bytes at most); a rank forked from it is named grpo-rank-N.
SERVER_NAME = "grpo-rankserver"


def _serve(listener_fd: int, owner: int, modules: list[str], path: list[str]) -> None:
    die_with_parent(owner)
    name_process(SERVER_NAME)  # a forked one would be named, and listed, as the job process it left
    sys.path[:] = path
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # each rank then imports it itself, and reports what is missing
    _Loop(socket.socket(fileno=listener_fd), owner).run()


class _Loop:
    """Accept requests, fork their ranks, and tell each stand-in how its rank ended."""

    def __init__(self, listener: socket.socket, owner: int) -> None:
        self.listener, self.owner = listener, owner
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, None)

    def run(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    self._accept()
                elif key.data[0] == "ended":
                    self._ended(*key.data[1:])
                else:
                    self._stand_in_went(*key.data[1:])

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        try:
            request, streams = self._receive(connection)
        except (OSError, ValueError):
            connection.close()
            return
        try:
            pid = os.fork()
            if pid == 0:
                self._become_rank(connection, request, streams)  # never returns
        finally:
            for fd in streams:
                os.close(fd)
        try:
            connection.send(str(pid).encode())
        except OSError:
            pass  # the stand-in is gone: it is noticed below, and the rank killed
        exit_fd = os.pidfd_open(pid)
        self.selector.register(exit_fd, selectors.EVENT_READ, ("ended", pid, connection, exit_fd))
        self.selector.register(connection, selectors.EVENT_READ, ("stand-in", pid, connection))

    def _receive(self, connection: socket.socket) -> tuple[dict, list[int]]:
        # Who is asking, before reading anything: no other process can make this one wait.
        peer_pid, peer_uid, _ = _peer(connection)
        if peer_uid != os.getuid() or parent_pid(peer_pid) != self.owner:
            raise ValueError(f"refused a request from pid {peer_pid}")
        message, streams, _, _ = socket.recv_fds(connection, MAX_REQUEST_BYTES, _STREAMS)
        try:
            if len(streams) != _STREAMS:
                raise ValueError(f"a request from pid {peer_pid} without its {_STREAMS} streams")
            return json.loads(message), streams
        except ValueError:
            for fd in streams:
                os.close(fd)
            raise

    def _ended(self, pid: int, connection: socket.socket, exit_fd: int) -> None:
        _, status = os.waitpid(pid, 0)
        self.selector.unregister(exit_fd)
        os.close(exit_fd)
        try:
            connection.send(str(status).encode())
        except OSError:
            pass
        if connection.fileno() != -1:
            self.selector.unregister(connection)
            connection.close()

    def _stand_in_went(self, pid: int, connection: socket.socket) -> None:
        # Anything readable is the stand-in's end: it sends nothing after its request.
        if connection.fileno() == -1:
            return  # its rank ended in the same round, and was answered
        self.selector.unregister(connection)
        connection.close()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _become_rank(self, connection: socket.socket, request: dict, streams: list[int]) -> None:
        """In the forked child: drop the server's files, take the stand-in's streams, environment,
        directory and path, and run the target; the exit status tells how it went, as a fresh
        interpreter's would (1 and the traceback on stderr for an exception)."""
        code = 1
        try:
            server = os.getppid()
            for key in list(self.selector.get_map().values()):
                if isinstance(key.fileobj, int):
                    os.close(key.fileobj)
                else:
                    key.fileobj.close()
            self.selector.close()
            connection.close()
            for target_fd, fd in enumerate(streams):
                os.dup2(fd, target_fd)
            die_with_parent(server)
            for number in FORWARDED_SIGNALS:  # as a fresh interpreter has them
                default = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
                signal.signal(number, default)
            os.environ.clear()
            os.environ.update(request["environment"])
            os.chdir(request["cwd"])
            sys.path[:] = request["path"]
            module, _, function = request["target"].partition(":")
            getattr(importlib.import_module(module), function)(*request["args"])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)


def _peer(connection: socket.socket) -> tuple[int, int, int]:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)
