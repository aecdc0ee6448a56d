"""The agent's readiness signals without root: the HTTP endpoint (/readyz and /metrics answer
503 until ready, then 200), systemd's notify protocol, and the deployment files probing them."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from tracer.agent import sdnotify, serve


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def test_readyz_and_metrics_answer_503_until_ready_then_200() -> None:
    registry = CollectorRegistry()
    Counter("whyrestart_test_things", "a counter", registry=registry).inc()
    ready = threading.Event()
    httpd = serve.start("127.0.0.1", 0, registry, ready)
    try:
        port = int(httpd.server_address[1])
        for path in ("/readyz", "/metrics"):
            code, body = _get(port, path)
            assert (code, body) == (503, serve.NOT_READY), path
        ready.set()
        assert _get(port, "/readyz") == (200, b"ready\n")
        code, body = _get(port, "/metrics")
        assert code == 200 and b"whyrestart_test_things_total 1.0" in body
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_ipv6_loopback_binds() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    try:
        httpd = serve.start("::1", 0, CollectorRegistry(), threading.Event())
    except OSError as exc:
        pytest.skip(f"::1 cannot be bound here: {exc}")
    assert httpd.socket.family == socket.AF_INET6
    httpd.server_close()


def _receiver(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(address)
    s.settimeout(5)
    return s


def test_notify_sends_one_datagram_to_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with _receiver(path) as rx:
        assert sdnotify.notify("READY=1\nSTATUS=watching", {"NOTIFY_SOCKET": path}) is None
        assert rx.recv(4096) == b"READY=1\nSTATUS=watching"


def test_notify_reaches_an_abstract_socket() -> None:
    name = f"whyrestart-test-{threading.get_native_id()}"
    with _receiver("\0" + name) as rx:
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": "@" + name}) is None
        assert rx.recv(4096) == b"READY=1"


def test_notify_without_a_manager_is_nothing_and_a_bad_socket_is_said(tmp_path: Path) -> None:
    assert sdnotify.notify("READY=1", {}) is None
    gone = str(tmp_path / "gone")
    problem = sdnotify.notify("READY=1", {"NOTIFY_SOCKET": gone})
    assert problem is not None and gone in problem
    problem = sdnotify.notify("READY=1", {"NOTIFY_SOCKET": "vsock:2:1"})
    assert problem is not None and "vsock:2:1" in problem
