"""One started bubblewrap sandbox seen from the host (:mod:`grpo_core.rewards.sandbox` starts it):
its input fed and its outputs read with caps and a deadline, and its stop, which returns only once
no process of the run is left."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time

__all__ = ["SandboxRun", "child_pid"]

_READ_CHUNK = 65536


class SandboxRun:
    """One started sandbox: bwrap's process, its output so far, and how to stop it cleanly."""

    def __init__(self, process: subprocess.Popen, info: int, wall_seconds: float, output_bytes: int) -> None:
        self.process, self.output_bytes = process, output_bytes
        self.deadline = time.monotonic() + wall_seconds
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
        room = self.output_bytes - len(buffer)
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
        init_pid = child_pid(bytes(self.info)) if self.process.poll() is None else None
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


def child_pid(info: bytes) -> int | None:
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None
