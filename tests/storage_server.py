"""An S3-compatible server for the tests: moto's server mode (none of MinIO, Ceph or SeaweedFS is
in this machine's package sources; moto is the best-kept Python-packaged S3 emulator), run as a
process of its own on a free port, so the code under test talks real HTTP to something it can
lose. The process also ends when the test process that started it dies (it watches its parent),
so a killed session leaves no server behind. Imported by name (tests/ is on sys.path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from waiting import wait_until

from api.cli.dev import free_port

BUCKET = "grpo-test"
# The bucket is made in the server's memory before it listens, so that no client (a worker
# retrying through an outage) ever finds the server up and the bucket missing.
# werkzeug logs every request to stderr, a pipe read only when the server fails: a few hundred
# requests would fill it and block the server, so only its warnings are written.
# SIGUSR1 stops its server thread, which closes the socket (connections are refused), and SIGUSR2
# starts it again, the objects kept in memory meanwhile: a store that goes away and comes back
# whole, which a kill cannot give.
_SERVER = """
import logging, os, signal, sys, time
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer
parent, port, bucket = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s3_backends[DEFAULT_ACCOUNT_ID]["global"].create_bucket(bucket, "us-east-1")
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
signal.signal(signal.SIGUSR1, lambda *_: server.stop())
signal.signal(signal.SIGUSR2, lambda *_: server.start())
server.start()
while os.getppid() == parent:
    time.sleep(0.5)
server.stop()
"""


@dataclass
class S3Server:
    endpoint: str
    bucket: str
    process: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        """The standard variables a client of this server is configured by."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def kill(self) -> None:
        """Gone at once, as a crashed server is: connections are refused from here on."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.process.stderr.close()

    def stop_listening(self) -> None:
        """Connections refused from here on, as a store that went away; what it holds is kept."""
        self.process.send_signal(signal.SIGUSR1)
        wait_until(lambda: not _answers(self.endpoint), 30, "moto's S3 server to stop listening")

    def listen_again(self) -> None:
        """Back after :meth:`stop_listening`, holding what it held."""
        self.process.send_signal(signal.SIGUSR2)
        _ready(self)

    def restart(self) -> None:
        """A killed server back on the same endpoint with its bucket: moto keeps objects in
        memory, so the bucket comes back empty, as a store whose disk was replaced would."""
        self.process = _started(int(self.endpoint.rsplit(":", 1)[1]), self.bucket)
        _ready(self)


def _started(port: int, bucket: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _SERVER, str(os.getpid()), str(port), bucket],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _ready(server: S3Server) -> None:
    process = server.process
    wait_until(lambda: _answers(server.endpoint) or process.poll() is not None, 60, "moto's S3 server",
               details=lambda: process.stderr.read().decode() if process.poll() is not None else "")
    assert process.poll() is None, process.stderr.read().decode()


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
            return True
    except OSError:
        return False


@contextmanager
def s3_server(bucket: str = BUCKET) -> Iterator[S3Server]:
    """A fresh server holding one empty bucket, stopped at the end of the block."""
    port = free_port()
    server = S3Server(f"http://127.0.0.1:{port}", bucket, _started(port, bucket))
    try:
        _ready(server)
        yield server
    finally:
        process = server.process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if not process.stderr.closed:
            process.stderr.close()
