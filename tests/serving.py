"""A test HTTP server on a thread (the fake health endpoints and the fake Docker socket)."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(srv: socketserver.BaseServer) -> Iterator[None]:
    """Serves ``srv`` on a daemon thread for the ``with`` block, then shuts it down and closes
    it (a short poll interval: shutdown waits for one)."""
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)
