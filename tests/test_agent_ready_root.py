"""Tier 3 (root, real kernel): "ready" is a promise. Each signal that says the agent is up
(/readyz answering 200, /metrics answering 200, systemd's READY=1 on $NOTIFY_SOCKET, the ready
line) turns true only once an OOM kill started at that instant is judged.

Every round is a fresh agent start, watched on all four signals at once: the instant a signal
turns true, its own OOM victim starts, in its own child memory cgroup (a `dd` whose 64 MiB
buffer does not fit in 16 MiB: killed within milliseconds of its start). 20 rounds: 20 kills
per signal, each at the very start of an agent (the moment the promise is about; a second kill
against a started agent would test nothing new). Each kill must reach the agent's log as a
high-confidence cgroup OOM of that pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest

from tests.test_agent_root import AgentProc
from tests.workloads import in_cgroup
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

pytestmark = pytest.mark.root

MiB = 1024 * 1024
ROUNDS = 20
SIGNALS = ("readyz", "metrics", "notify", "line")
VICTIM = ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]
POLL_S = 0.005  # how often the HTTP and line signals are looked at


def _status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _waiters(agent: AgentProc, notify: socket.socket) -> dict[str, Callable[[], bool]]:
    """For each signal, a check that blocks for at most a poll and says whether it is true."""

    def http(path: str) -> Callable[[], bool]:
        return lambda: _status(agent.port, path) == 200 or bool(time.sleep(POLL_S))

    def line() -> bool:
        return b"ready: watching" in agent.stderr() or bool(time.sleep(POLL_S))

    def ready_1() -> bool:
        try:
            msg = notify.recv(4096)
        except TimeoutError:
            return False
        return "READY=1" in msg.decode().splitlines()

    return {"readyz": http("/readyz"), "metrics": http("/metrics"), "notify": ready_1, "line": line}


@pytest.fixture
def victims_cgroups(layout: CgroupLayout) -> Iterator[dict[str, ChildCgroup]]:
    parent = own_memory_cgroup(layout=layout)
    with ExitStack() as stack:
        yield {
            s: stack.enter_context(
                ChildCgroup(parent, f"wr-ready-{s}-{os.getpid()}", 16 * MiB, layout=layout)
            )
            for s in SIGNALS
        }


def _round(tmp: Path, n: int, cgroups: dict[str, ChildCgroup]) -> dict[str, str]:
    """One fresh agent start: for each signal, the pid of the OOM victim started the instant
    it turned true and what the agent said of it ("" while nothing)."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp / f"notify-{n}"))
    notify.settimeout(0.2)
    state = tmp / f"state-{n}"
    agent = AgentProc(state, "--retain", "1m", env={"NOTIFY_SOCKET": str(tmp / f"notify-{n}")})
    pids: dict[str, int] = {}
    errors: list[str] = []
    deadline = time.monotonic() + 20  # (start-up takes about half a second)

    def watch(name: str, check: Callable[[], bool]) -> None:
        while time.monotonic() < deadline and agent.proc.poll() is None:
            if check():
                victim = subprocess.Popen(in_cgroup(cgroups[name], *VICTIM))
                pids[name] = victim.pid
                if victim.wait() != -signal.SIGKILL:
                    errors.append(f"{name}: the victim was not OOM-killed ({victim.returncode})")
                return

    try:
        threads = [
            threading.Thread(target=watch, args=(name, check))
            for name, check in _waiters(agent, notify).items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        judged: dict[str, str] = {}
        until = time.monotonic() + 15
        while time.monotonic() < until and len(judged) < len(pids):
            judged = _judged(agent, pids)
            time.sleep(0.05)
    finally:
        agent.proc.send_signal(signal.SIGTERM)
        agent.proc.wait(timeout=60)
        notify.close()
    assert not errors, (errors, agent.stderr().decode(errors="replace"))
    shutil.rmtree(state)
    return {
        name: judged.get(name, "not judged") if name in pids else "never turned true"
        for name in SIGNALS
    }


def _judged(agent: AgentProc, pids: dict[str, int]) -> dict[str, str]:
    """The agent's log line (OpenTelemetry JSON) for each victim: "cause confidence"."""
    agent.out.seek(0)
    by_pid = {}
    for ln in agent.out.read().splitlines():
        a = orjson.loads(ln)["attributes"]
        by_pid[a["process.pid"]] = f"{a['whyrestart.cause']} {a['whyrestart.confidence']}"
    return {name: by_pid[pid] for name, pid in pids.items() if pid in by_pid}


def test_an_oom_kill_started_the_instant_each_readiness_signal_turns_true_is_judged(
    victims_cgroups: dict[str, ChildCgroup],
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="wr-ready-"))  # (short: a unix socket path is < 108)
    rounds: list[dict[str, str]] = []
    try:
        for n in range(ROUNDS):
            rounds.append(_round(tmp, n, victims_cgroups))
            if set(rounds[-1].values()) != {"cgroup_oom high"}:
                break  # (the rounds so far show what failed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name in SIGNALS:
        got = [r[name] for r in rounds]
        assert got == ["cgroup_oom high"] * ROUNDS, (name, rounds)
