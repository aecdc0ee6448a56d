"""Tier 3 (root): a hand-written supervisor, the process that started the server, kills it
after the health endpoint stopped answering (probe_kill, as for any runtime); a kill -9 from
an unrelated shell while the probes pass stays a signal_kill (issue 18)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.mt.program import the_program
from tracer.events import ProbeSample
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources.probes import parse_probe
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

# The server answers /health at once, until /tmp/...hang exists: then it stops answering (a
# deadlock, a stall), as model servers do under memory pressure.
SERVER = """
import http.server, os, sys, time
HANG = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if os.path.exists(HANG):
            time.sleep(30)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

# The supervisor starts the server (its command: argv[3:], then PORT HANG), polls /health every
# 0.3 s with a 0.3 s timeout, and after 5 failures in a row SIGKILLs it (what a home-made
# watchdog does); it exits once the server is gone, whoever ended it.
SUPERVISOR = """
import os, signal, subprocess, sys, time, urllib.request
port, hang, server = sys.argv[1], sys.argv[2], sys.argv[3:]
child = subprocess.Popen([*server, port, hang])
url = f"http://127.0.0.1:{port}/health"
failed = 0
while child.poll() is None:
    time.sleep(0.3)
    try:
        urllib.request.urlopen(url, timeout=0.3).read()
        failed = 0
    except Exception:
        failed += 1
        if failed == 5:
            os.kill(child.pid, signal.SIGKILL)
child.wait()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(port: int) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("server did not start")


def record_supervised(
    tmp_path: Path, action: object, server: list[str] | None = None
) -> tuple[RecordResult, int]:
    """Record the supervisor running ``server`` (a command that takes PORT HANG; the Python
    SERVER by default) with an http probe of its /health; ``action(hang, server_pid)`` once a
    few probes passed."""
    port = free_port()
    hang = tmp_path / "hang"
    if server is None:
        (tmp_path / "server.py").write_text(SERVER)
        server = [sys.executable, str(tmp_path / "server.py")]
    (tmp_path / "supervisor.py").write_text(SUPERVISOR)
    from tracer.pipeline.follow import ProbeSetup

    probes = ProbeSetup([parse_probe(f"http://127.0.0.1:{port}/health")], 0.3, 0.3)
    argv = [sys.executable, str(tmp_path / "supervisor.py"), str(port), str(hang), *server]
    rec = Recorder(str(tmp_path / "s.trace"), Targets(command=argv, probes=probes), duration=90)
    out: dict[str, RecordResult] = {}
    t = threading.Thread(target=lambda: out.setdefault("res", rec.run()))
    t.start()
    wait_up(port)
    time.sleep(1.0)  # a few probes pass
    server_pid = int(
        subprocess.run(
            ["pgrep", "-f", f"{server[-1]} {port}"], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )
    assert callable(action)
    action(hang, server_pid)
    t.join(90)
    assert not t.is_alive()
    return out["res"], server_pid


def test_parent_supervisor_kill_after_failed_probes_is_a_probe_kill(tmp_path: Path) -> None:
    res, server = record_supervised(tmp_path, lambda hang, _pid: hang.write_text(""))
    probes = [e for e in read_trace(res.path).events if isinstance(e, ProbeSample)]
    # (the first ones may find nothing listening yet)
    assert any(p.ok for p in probes) and sum(p.timed_out for p in probes) >= 3
    [v] = [v for v in res.verdicts if v.pid == server]
    assert (v.cause, v.signal, v.sender_role) == ("probe_kill", "SIGKILL", "supervisor")
    assert v.confidence == "high" and v.probe_failures >= 3
    assert v.sender_pid != os.getpid()  # the supervisor, not the test
    assert "(pid " in v.summary and "the process that started it" in v.summary
    assert sum(what.startswith("probe http://") for _, what in v.evidence) >= 3


def test_manual_kill_while_probes_pass_is_a_signal_kill(tmp_path: Path) -> None:
    def kill_from_elsewhere(_hang: Path, pid: int) -> None:
        # an unrelated shell: not the server's parent, not in the recorded tree
        subprocess.run(["sh", "-c", f"kill -9 {pid}"], check=True)

    res, server = record_supervised(tmp_path, kill_from_elsewhere)
    [v] = [v for v in res.verdicts if v.pid == server]
    assert (v.cause, v.signal, v.sender_role) == ("signal_kill", "SIGKILL", "other")
    assert v.probe_failures == 0 and v.confidence == "high"
    assert signal.SIGKILL == 9


def test_a_multithreaded_server_killed_after_failed_probes_is_one_probe_kill(
    tmp_path: Path, mtwork: Path
) -> None:
    """The twin of the first test with tests/mt/mtwork.c as the server: one thread per
    connection (wrk1, wrk2, ...), so the threads hanging when the supervisor kills it were
    started by the server while the probes failed, after the evidence began."""
    res, server = record_supervised(
        tmp_path, lambda hang, _pid: hang.write_text(""), [str(mtwork), "serve"]
    )
    [(v, ex)] = the_program(read_trace(res.path).events, res.verdicts)
    assert (ex.pid, ex.status) == (server, signal.SIGKILL)
    assert (v.cause, v.signal, v.sender_role) == ("probe_kill", "SIGKILL", "supervisor")
    assert v.confidence == "high" and v.probe_failures >= 3
    assert sum(what.startswith("probe http://") for _, what in v.evidence) >= 3
