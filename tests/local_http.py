"""A threaded ``http.server`` serving a test's handler on a local port for the length of a
``with`` block: the verifier service and the webhook receiver of the tests both run on it.
Imported by name (tests/ is on sys.path)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], port: int = 0) -> Iterator[int]:
    """Serve ``handler`` on 127.0.0.1:``port`` (0: one the OS picks; ThreadingHTTPServer sets
    SO_REUSEADDR, so a port just released can be served again); yields the port."""
    httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
