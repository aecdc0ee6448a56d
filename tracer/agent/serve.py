"""The agent's HTTP endpoint: ``/metrics`` (Prometheus text, prometheus_client's WSGI app) and
``/readyz``, the readiness an orchestrator probes.

The port is bound when the agent starts (a busy port is a usage error before any BPF is
loaded), but until the agent is ready (tracer.pipeline.record.Recorder's ``on_ready``: the hooks are
attached and every source reads) both paths answer 503: a scrape then is not ``up``, so that
nothing says the agent watches before an OOM kill would be seen. After that, ``/readyz``
answers 200 and ``/metrics`` the metrics."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

READY_PATH = "/readyz"
NOT_READY = b"not ready: the BPF hooks are being attached\n"

StartResponse = Callable[..., Any]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Not one stderr line per scrape."""


def app(
    registry: CollectorRegistry, ready: threading.Event
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def serve(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if not ready.is_set():
            start_response(
                "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8"), ("Retry-After", "1")],
            )
            return [NOT_READY]
        if environ.get("PATH_INFO") == READY_PATH:
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ready\n"]
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return serve


def start(
    host: str, port: int, registry: CollectorRegistry, ready: threading.Event
) -> ThreadingWSGIServer:
    """Bind and serve from a daemon thread; OSError if the address cannot be bound."""
    # (as prometheus_client's own server: the family of the address, so that [::1] binds)
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = info[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(str(sockaddr[0]), port, app(registry, ready), Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="whyrestart-http", daemon=True).start()
    return httpd
