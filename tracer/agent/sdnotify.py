"""systemd's readiness protocol (sd_notify(3)): one datagram of ``KEY=VALUE`` lines to the
AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace).
Written here rather than taken from a library: the protocol is these few lines, and the
maintained implementation (python-systemd) needs libsystemd's headers to build."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(state: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=watching"``) to the service manager. None when
    it was sent or nobody listens (no ``$NOTIFY_SOCKET``: not started by systemd as
    Type=notify); otherwise why it could not be, for the caller to say."""
    addr = environ.get("NOTIFY_SOCKET", "")
    if not addr:
        return None
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    elif addr[0] != "/":
        return f"NOTIFY_SOCKET={addr!r} is neither a path nor an abstract socket (@name)"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as exc:
        return f"cannot notify systemd through {environ['NOTIFY_SOCKET']}: {exc.strerror or exc}"
    return None
