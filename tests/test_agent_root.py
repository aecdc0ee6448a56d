"""Tier 3 (root, real kernel): the agent watching the whole host. A real OOM kill in a child
memory cgroup reaches /metrics, the journal and an incident; a restarted agent lists it once;
the incident replays to the same verdict without root; bad set-ups are clear errors."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.workloads import HOG, in_cgroup
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

pytestmark = pytest.mark.root

MiB = 1024 * 1024
WHYRESTART = [sys.executable, "-m", "tracer.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AgentProc:
    def __init__(self, state: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.state = state
        # files, not pipes: a busy host's verdict lines must never fill a pipe nobody reads
        self.out = (state.parent / f"agent-{self.port}.out").open("w+b")
        self.err = (state.parent / f"agent-{self.port}.err").open("w+b")
        self.proc = subprocess.Popen(
            [
                *WHYRESTART,
                "agent",
                "--state-dir",
                str(state),
                "--metrics-addr",
                f"127.0.0.1:{self.port}",
                "--log-format",
                "json",
                *extra,
            ],
            stdout=self.out,
            stderr=self.err,
            env={**os.environ, **(env or {})},
        )

    def wait_ready(self, timeout: float = 60) -> None:
        """An always-on agent is running long before the workload: wait until it says it is
        ready the way an orchestrator asks (its readinessProbe: /readyz answers 200)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.readyz() == 200:
                return
            time.sleep(0.05)
        self.err.seek(0)
        raise AssertionError(f"agent not ready: {self.err.read().decode(errors='replace')}")

    def readyz(self) -> int | None:
        """/readyz's status, None while nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def stderr(self) -> bytes:
        """What the agent said on stderr so far."""
        self.err.seek(0)
        return self.err.read()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def stop(self) -> tuple[int, bytes]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.out.seek(0)
        return self.proc.returncode, self.out.read()


def history(state: Path) -> list[dict[str, object]]:
    out = subprocess.run(
        [*WHYRESTART, "history", "--state-dir", str(state), "--json"],
        capture_output=True,
        check=True,
    ).stdout
    return list(orjson.loads(out)["entries"])


@pytest.fixture
def agent_state(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "state"
    for unit in tmp_path.glob("agent-*.err"):  # shown when a test fails
        print(unit.read_text(errors="replace")[-4000:])


def until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_an_oom_kill_reaches_metrics_history_and_an_incident(
    agent_state: Path,
    tmp_path: Path,
    layout: CgroupLayout,
    unprivileged: tuple[list[str], dict[str, str]],
) -> None:
    agent = AgentProc(agent_state)
    try:
        agent.wait_ready()
        name = f"wr-agent-oom-{os.getpid()}"
        with ChildCgroup(own_memory_cgroup(layout=layout), name, 64 * MiB, layout=layout) as cg:
            hog = subprocess.run(in_cgroup(cg, sys.executable, "-c", HOG))
            assert hog.returncode == -signal.SIGKILL
            path = cg.path
        until(lambda: "whyrestart_oom_kills_total{" in agent.metrics())
        text = agent.metrics()
        # (other OOM kills on this host may be counted too: the agent watches everything)
        ooms = [ln for ln in text.splitlines() if ln.startswith("whyrestart_oom_kills_total{")]
        assert any('limit_scope="own"' in ln for ln in ooms), ooms
        assert 'cause="cgroup_oom",confidence="high"' in text

        def ours() -> list[dict[str, object]]:
            return [
                e
                for e in history(agent_state)
                if e["cause"] == "cgroup_oom" and e["verdict"]["limit_cgroup"] == path  # type: ignore[index]
            ]

        until(lambda: len(ours()) == 1)
        code, out = agent.stop()
        assert code == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    kills = ours()
    assert len(kills) == 1 and kills[0]["confidence"] == "high"
    incident = str(kills[0]["incident"])
    # the JSON log line for it, with OpenTelemetry names
    lines = [orjson.loads(ln) for ln in out.splitlines()]
    mine = [ln for ln in lines if ln["attributes"].get("whyrestart.incident") == incident]
    assert any(ln["attributes"]["whyrestart.cause"] == "cgroup_oom" for ln in mine)

    # a restarted agent adds no duplicate
    again = AgentProc(agent_state)
    try:
        again.wait_ready()
        assert len(ours()) == 1
        assert again.stop()[0] == 0
    finally:
        if again.proc.poll() is None:
            again.proc.kill()
    assert len(ours()) == 1

    # the incident replays to the same verdict, without root
    src = next((agent_state / "incidents").glob(incident + ".trace*"))
    public = Path(tempfile.mkdtemp(prefix="wr-incident-"))  # (pytest's tmp dirs are 0700)
    os.chmod(public, 0o755)
    mine_copy = public / ("incident" + "".join(src.suffixes))
    shutil.copy(src, mine_copy)
    os.chown(mine_copy, 65534, 65534)
    res = subprocess.run(
        [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            *unprivileged[0],
            "explain",
            str(mine_copy),
            "--json",
        ],
        capture_output=True,
        cwd="/",
        env=unprivileged[1],
    )
    shutil.rmtree(public)
    assert res.returncode == 0, res.stderr
    verdicts = [v for v in orjson.loads(res.stdout)["verdicts"] if v["pid"] == kills[0]["pid"]]
    assert [(v["cause"], v["confidence"]) for v in verdicts] == [("cgroup_oom", "high")]


def test_bad_setups_are_clear_errors(agent_state: Path, tmp_path: Path) -> None:
    first = AgentProc(agent_state)
    try:
        first.wait_ready()
        second = subprocess.run(
            [*WHYRESTART, "agent", "--state-dir", str(agent_state), "--metrics-addr", ""],
            capture_output=True,
            timeout=60,
        )
        assert second.returncode == 2
        assert b"another whyrestart agent" in second.stderr
        busy = subprocess.run(
            [
                *WHYRESTART,
                "agent",
                "--state-dir",
                str(tmp_path / "other"),
                "--metrics-addr",
                f"127.0.0.1:{first.port}",
            ],
            capture_output=True,
            timeout=60,
        )
        assert busy.returncode == 2 and b"--metrics-addr" in busy.stderr
        assert first.stop()[0] == 0
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        res = subprocess.run(
            [*WHYRESTART, "agent", "--state-dir", str(ro / "state"), "--metrics-addr", ""],
            capture_output=True,
            timeout=60,
        )
        assert res.returncode == 7 and b"read-only" in res.stderr, res.stderr
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", str(ro)], check=True)


def test_the_kernel_counts_clean_exits_inside_a_unit_and_sends_the_rest(
    agent_state: Path, layout: CgroupLayout
) -> None:
    """200 clean `true`s (and one `seq`) inside a cgroup are counted in the kernel, not sent;
    the failing `false` and the cgroup's first process (its parent is outside) are sent."""
    agent = AgentProc(agent_state, "--retain", "10m")
    try:
        agent.wait_ready()
        name = f"wr-agent-clean-{os.getpid()}"
        with ChildCgroup(own_memory_cgroup(layout=layout), name, None, layout=layout) as cg:
            procs = os.path.join(cg.abs_path, "cgroup.procs")
            script = (
                f"echo $$ > {procs}; for i in $(seq 200); do /bin/true; done; /bin/false; exit 0"
            )
            assert subprocess.run(["sh", "-c", script]).returncode == 0
            path, cid = cg.path, cg.cgroup_id
            # (while the cgroup exists: the agent names a cgroup by its path when it reads the
            # kernel's counts, every few seconds)
            series = (
                f'whyrestart_clean_exits_total{{container="",namespace="",pod="",unit="{path}"}}'
            )
            until(lambda: f"{series} 201.0" in agent.metrics(), timeout=30)
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    from tracer.events import Exec, Exit
    from tracer.trace.reader import read_trace

    events = [
        e for seg in sorted((agent_state / "segments").iterdir()) for e in read_trace(seg).events
    ]
    exits = [e for e in events if isinstance(e, Exit) and e.cgroup_id == cid]
    assert sorted(e.comm for e in exits) == ["false", "sh"]
    assert [e for e in events if isinstance(e, Exec) and e.cgroup_id == cid] == []


def test_a_v1_service_without_memory_accounting_starts_a_unit_in_the_unified_tree(
    agent_state: Path, layout: CgroupLayout
) -> None:
    """Issue 31 item 7: on a v1 host systemd (hybrid mode) gives a service a cgroup of its own
    in the unified tree, but a memory cgroup only with memory accounting on; without it the
    service shares its parent's memory cgroup. Its main process's clean exit and its exec are
    still sent: here a process moves itself into a new unified-tree cgroup (as systemd places
    a service) and execs `true`."""
    if layout.memory_version != 1 or layout.unified_root is None:
        pytest.skip("not a v1 host with the unified tree mounted (hybrid mode)")
    agent = AgentProc(agent_state)
    unified = os.path.join(layout.unified_root, f"wr-agent-v1svc-{os.getpid()}")
    os.mkdir(unified)
    try:
        agent.wait_ready()
        procs = os.path.join(unified, "cgroup.procs")
        service = subprocess.Popen(["sh", "-c", f"echo $$ > {procs} && exec /bin/true"])
        assert service.wait() == 0
        time.sleep(2.5)  # past the segment's one-second flush
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
        os.rmdir(unified)
    from tracer.events import Exec, Exit
    from tracer.trace.reader import read_trace

    events = [
        e for seg in sorted((agent_state / "segments").iterdir()) for e in read_trace(seg).events
    ]
    mine = [e for e in events if isinstance(e, Exec | Exit) and e.pid == service.pid]
    assert [(type(e).__name__, e.comm) for e in mine] == [("Exec", "true"), ("Exit", "true")]
    assert [e.wait.code for e in mine if isinstance(e, Exit)] == [0]


def test_sighup_reloads_sigkill_loses_at_most_a_second_and_the_agent_protects_itself(
    agent_state: Path,
) -> None:
    agent = AgentProc(agent_state, "--log-format", "none")
    try:
        agent.wait_ready()
        pid = agent.proc.pid
        with open(f"/proc/{pid}/oom_score_adj") as f:
            adj = f.read().strip()
        # the witness is not the OOM killer's first pick; without CAP_SYS_RESOURCE (some
        # sandboxes) lowering it is refused, and the header says so (checked below)
        assert (adj == "-900") == _has_cap(CAP_SYS_RESOURCE)
        agent.proc.send_signal(signal.SIGHUP)
        until(lambda: b"reloaded" in (agent_state.parent / f"agent-{agent.port}.err").read_bytes())
        assert agent.proc.poll() is None  # SIGHUP does not stop it
        marker = subprocess.Popen(["sh", "-c", "exit 77"])
        assert marker.wait() == 77
        time.sleep(2.5)  # past the segment's one-second flush
        agent.proc.kill()
        agent.proc.wait(timeout=30)
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    from tracer.events import Exit
    from tracer.trace.reader import TraceReader

    found = []
    for seg in sorted((agent_state / "segments").iterdir()):
        with TraceReader(seg) as reader:  # (the last one has no footer: the agent was killed)
            # (by pid: other processes of the host exit 77 too, a skipped lab run for one)
            found += [e for e in reader if isinstance(e, Exit) and e.pid == marker.pid]
    assert [e.wait.code for e in found] == [77]
    with TraceReader(sorted((agent_state / "segments").iterdir())[0]) as reader:
        protection = reader.header.extra["self_protection"]
    assert protection["data_limit_bytes"] == 1 << 30
    if not _has_cap(CAP_SYS_RESOURCE):
        assert protection["oom_score_adj_error"] == "Permission denied"


CAP_SYS_RESOURCE = 24


def _has_cap(cap: int) -> bool:
    with open("/proc/self/status") as f:
        eff = next(line for line in f if line.startswith("CapEff:"))
    return bool(int(eff.split()[1], 16) >> cap & 1)
