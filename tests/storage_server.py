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
_SERVER = """
import os, sys, time
from moto.server import ThreadedMotoServer
parent, port = int(sys.argv[1]), int(sys.argv[2])
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
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
    process = subprocess.Popen([sys.executable, "-c", _SERVER, str(os.getpid()), str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", bucket, process)
    try:
        wait_until(lambda: _answers(server.endpoint) or process.poll() is not None, 60, "moto's S3 server",
                   details=lambda: process.stderr.read().decode() if process.poll() is not None else "")
        assert process.poll() is None, process.stderr.read().decode()
        from api.storage.s3 import s3_client

        s3_client(server.env, concurrency=1).create_bucket(Bucket=bucket)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        process.stderr.close()
