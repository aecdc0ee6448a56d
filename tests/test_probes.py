"""Health probes (tracer.sources.probes), tier 1: parsers, and real probes on 127.0.0.1.

The HTTP endpoint is a real ``http.server`` in a thread that can be told to answer at once, to
answer slowly, to answer 500, or to stop accepting (its socket closed: connection refused).
No timing assertions beyond "a server that sleeps 3x the timeout gives timed_out".
"""

from __future__ import annotations

import dataclasses
import http.server
import itertools
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.serving import serving
from tracer.errors import UsageError
from tracer.parse.values import parse_duration
from tracer.sources.probes import (
    Prober,
    ProbeResult,
    ProbeSpec,
    parse_probe,
    run_probe,
)

TIMEOUT = 0.2


# ---------------------------------------------------------------------------------------------
# A local HTTP server with modes


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler asleep in "slow" mode must not hold up teardown
    mode = "ok"  # "ok", "slow", "500"
    delay_s = 0.0
    hits = 0
    posted: tuple[tuple[str, bytes], ...] = ()  # (Content-Type, body) of each POST


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.hits += 1
        if self.server.mode == "slow":
            time.sleep(self.server.delay_s)
        code = 500 if self.server.mode == "500" else 200
        body = b"fine\n" if code == 200 else b"broken\n"
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the probe gave up and closed: expected in "slow" mode

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posted += ((self.headers["Content-Type"], body),)
        self.do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    with serving(srv):
        yield srv


def _url(srv: _Server, path: str = "/healthz") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# parse_probe


def test_parse_http() -> None:
    spec = parse_probe("http://127.0.0.1:8080/healthz?full=1")
    assert spec == ProbeSpec(
        kind="http",
        text="http://127.0.0.1:8080/healthz?full=1",
        host="127.0.0.1",
        port=8080,
        path="/healthz?full=1",
    )
    assert parse_probe("http://localhost").port == 80
    assert parse_probe("http://localhost:81").path == "/"
    assert parse_probe("HTTP://[::1]:9000/x").host == "::1"


def test_parse_tcp() -> None:
    spec = parse_probe("tcp://127.0.0.1:6379")
    assert (spec.kind, spec.host, spec.port) == ("tcp", "127.0.0.1", 6379)


def test_parse_exec() -> None:
    spec = parse_probe("exec:sh -c 'test -e /tmp/ready && echo ok'")
    assert spec.kind == "exec"
    assert spec.argv == ("sh", "-c", "test -e /tmp/ready && echo ok")


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("localhost:8080", "no scheme"),
        ("https://example.com/", "unsupported scheme 'https'"),
        ("udp://1.2.3.4:53", "unsupported scheme 'udp'"),
        ("tcp://127.0.0.1", "needs a port"),
        ("tcp://127.0.0.1:80/path", "no path"),
        ("http://:8080/x", "no host"),
        ("http://127.0.0.1:http/", "port is not a number"),
        ("http://127.0.0.1:70000/", "port is not a number"),
        ("tcp://127.0.0.1:0", "port 0"),
        ("http://u:p@127.0.0.1:80/", "credentials"),
        ("exec:", "no command"),
        ("exec:   ", "no command"),
        ("exec:sh -c 'unbalanced", "cannot split"),
        ("", "no scheme"),
    ],
)
def test_parse_probe_errors(spec: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_probe(spec)
    text = str(info.value)
    assert repr(spec) in text  # names the spec...
    assert why in text
    assert "http://HOST:PORT/PATH" in text and "tcp://HOST:PORT" in text and "exec:CMD" in text
    assert info.value.exit_code == 2


# ---------------------------------------------------------------------------------------------
# parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.5", 0.5), ("2", 2.0), (".25", 0.25), ("500ms", 0.5), ("2s", 2.0), ("1.5s", 1.5),
     (" 250 ms ", 0.25), ("10", 10.0)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "0", "0s", "0ms", "-1", "-0.5s", "abc", "1m", "100us", "1e3", "inf", "nan", "1.2.3", "s"],
)
def test_parse_duration_errors(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_duration(text)
    assert repr(text) in str(info.value)
    assert "500ms" in str(info.value)


# ---------------------------------------------------------------------------------------------
# One probe


def _check_shape(r: ProbeResult) -> None:
    assert r.start_ns > 0 and r.latency_ns >= 0
    assert (r.error == "") == r.ok
    if r.timed_out:
        assert not r.ok


def test_http_ok(server: _Server) -> None:
    r = run_probe(parse_probe(_url(server)), timeout_s=5.0)
    _check_shape(r)
    assert (r.ok, r.timed_out, r.status, r.error) == (True, False, 200, "")
    assert server.hits == 1


def test_http_with_a_body_posts_it(server: _Server) -> None:
    """repro's --probe-data: the probe asks for real work (a POST), JSON sent as JSON."""
    spec = dataclasses.replace(parse_probe(_url(server, "/completion")), body=b'{"n": 1}')
    r = run_probe(spec, timeout_s=5.0)
    assert (r.ok, r.status) == (True, 200)
    form = dataclasses.replace(spec, body=b"a=1")
    assert run_probe(form, timeout_s=5.0).ok
    assert server.posted == (
        ("application/json", b'{"n": 1}'),
        ("application/x-www-form-urlencoded", b"a=1"),
    )


def test_http_slow_times_out(server: _Server) -> None:
    server.mode, server.delay_s = "slow", 3 * TIMEOUT
    r = run_probe(parse_probe(_url(server)), timeout_s=TIMEOUT)
    _check_shape(r)
    assert r.timed_out is True
    assert r.ok is False
    assert r.latency_ns == int(TIMEOUT * 1e9)  # a timeout reports the timeout, by definition
    assert r.status is None


def test_http_500_not_ok(server: _Server) -> None:
    server.mode = "500"
    r = run_probe(parse_probe(_url(server)), timeout_s=5.0)
    _check_shape(r)
    assert (r.ok, r.timed_out, r.status, r.error) == (False, False, 500, "HTTP 500")


def test_http_stopped_server_refused(server: _Server) -> None:
    url = _url(server)
    server.shutdown()
    server.server_close()  # stop accepting: the listening socket is gone
    r = run_probe(parse_probe(url), timeout_s=5.0)
    _check_shape(r)
    assert (r.ok, r.timed_out, r.status) == (False, False, None)
    assert "refused" in r.error.lower()


def test_tcp_ok(server: _Server) -> None:
    r = run_probe(parse_probe(f"tcp://127.0.0.1:{server.server_address[1]}"), timeout_s=5.0)
    _check_shape(r)
    assert (r.ok, r.timed_out, r.status) == (True, False, None)


def test_tcp_closed_port_not_ok() -> None:
    r = run_probe(parse_probe(f"tcp://127.0.0.1:{_closed_port()}"), timeout_s=5.0)
    _check_shape(r)
    assert (r.ok, r.timed_out) == (False, False)
    assert "refused" in r.error.lower()


def test_exec_true_false() -> None:
    ok = run_probe(parse_probe("exec:true"), timeout_s=5.0)
    _check_shape(ok)
    assert (ok.ok, ok.status) == (True, 0)
    bad = run_probe(parse_probe("exec:false"), timeout_s=5.0)
    _check_shape(bad)
    assert (bad.ok, bad.timed_out, bad.status, bad.error) == (False, False, 1, "exit status 1")
    code = run_probe(parse_probe("exec:sh -c 'exit 7'"), timeout_s=5.0)
    assert (code.ok, code.status) == (False, 7)


def test_exec_signal() -> None:
    r = run_probe(parse_probe("exec:sh -c 'kill -TERM $$'"), timeout_s=5.0)
    assert (r.ok, r.timed_out, r.status, r.error) == (False, False, -15, "killed by SIGTERM")


def test_exec_missing_command() -> None:
    r = run_probe(parse_probe("exec:/nonexistent/whyrestart-probe"), timeout_s=5.0)
    _check_shape(r)
    assert (r.ok, r.timed_out, r.status) == (False, False, None)
    assert "cannot run" in r.error


def test_exec_past_timeout_is_killed(tmp_path: Path) -> None:
    pidfile = os.path.join(str(tmp_path), "pid")
    # The shell records the pid of a grandchild sleep, which must die with the probe's group.
    spec = parse_probe(f"exec:sh -c 'sleep 30 & echo $! > {pidfile}; wait'")
    r = run_probe(spec, timeout_s=TIMEOUT)
    _check_shape(r)
    assert r.timed_out is True and r.ok is False
    assert r.latency_ns == int(TIMEOUT * 1e9)
    assert "killed" in r.error
    with open(pidfile) as f:
        sleeper = int(f.read())

    # Killed with its group; reparented to init (or a subreaper), so wait until it is reaped.
    def gone() -> bool:
        try:
            with open(f"/proc/{sleeper}/stat") as st:
                return st.read().split(") ")[1].startswith("Z")
        except FileNotFoundError:
            return True

    _wait_for(gone)


# ---------------------------------------------------------------------------------------------
# Prober


def test_prober_runs_periodically(server: _Server) -> None:
    prober = Prober(parse_probe(_url(server)), interval_s=0.02, timeout_s=2.0)
    with prober:
        _wait_for(lambda: prober.completed >= 3)
    results = prober.poll()
    assert len(results) == prober.completed >= 3
    assert all(r.ok and r.status == 200 for r in results)
    # Never overlapping: each probe starts after the previous one ended.
    for a, b in itertools.pairwise(results):
        assert b.start_ns >= a.start_ns + a.latency_ns
    assert prober.poll() == []  # drained
    assert prober.dropped == 0


def test_prober_slow_probes_do_not_overlap(server: _Server) -> None:
    server.mode, server.delay_s = "slow", 3 * TIMEOUT
    prober = Prober(parse_probe(_url(server)), interval_s=0.01, timeout_s=TIMEOUT)
    with prober:
        _wait_for(lambda: prober.completed >= 2)
    results = prober.poll()
    assert len(results) >= 2
    assert all(r.timed_out and not r.ok for r in results)
    for a, b in itertools.pairwise(results):
        assert b.start_ns >= a.start_ns + a.latency_ns


def test_prober_bounded_queue_counts_drops() -> None:
    prober = Prober(parse_probe("exec:true"), interval_s=0.001, timeout_s=5.0, max_queue=2)
    with prober:
        _wait_for(lambda: prober.completed >= 5)
    # Stopped: the counters are final now.
    results = prober.poll()
    assert len(results) == 2
    assert prober.dropped == prober.completed - 2
    assert results[0].start_ns < results[1].start_ns  # the newest are kept


def test_prober_rejects_bad_interval() -> None:
    with pytest.raises(UsageError):
        Prober(parse_probe("exec:true"), interval_s=0, timeout_s=1.0)
