"""gunicorn's configuration for the model server (tests/servers/pymodel), from the
environment ``command()`` sets."""

from __future__ import annotations

import os
from typing import Any

from gunicorn.errors import HaltServer

bind = f"127.0.0.1:{os.environ['PYMODEL_PORT']}"
workers = int(os.environ.get("PYMODEL_WORKERS", "2"))
worker_class = "uvicorn_worker.UvicornWorker"
graceful_timeout = 3
timeout = 60
loglevel = "info"
# (its default socket is one per host user: every test server would share it)
control_socket_disable = True


def child_exit(server: Any, worker: Any) -> None:
    """A worker is gone. By default the master forks a new one (gunicorn's own behaviour);
    with PYMODEL_EXIT_ON_WORKER_DEATH=1 a worker that dies while the server is serving makes
    the master give up and exit 1, as vLLM's API server does when its engine core process
    dies. (While the master is stopping, its listeners are closed: its own stop is no
    failure.)"""
    if os.environ.get("PYMODEL_EXIT_ON_WORKER_DEATH") == "1" and server.LISTENERS:
        raise HaltServer(f"Failed core proc(s): {{{worker.pid}}}", 1)
