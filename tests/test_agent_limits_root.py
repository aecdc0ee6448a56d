"""Tier 3 (root): the agent within its bounds. The disk budget holds under a storm of failing
processes; a state dir on a full disk costs records (counted), never the agent, and writing
resumes when space returns; hundreds of short-lived cgroups leave neither series nor memory
behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_agent_root import AgentProc, until
from tracer.agent.state import StateDir
from tracer.events import CgroupInfo
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup
from tracer.trace.reader import TraceReader

pytestmark = pytest.mark.root

MiB = 1024 * 1024


def metric(text: str, name: str) -> float:
    """The sum of every series of ``name`` in an exposition."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ")
    )


def failing_storm(n: int) -> None:
    """``n`` processes that exit 1 (each one a verdict, forwarded by the kernel filter)."""
    subprocess.run(
        ["sh", "-c", f"i=0; while [ $i -lt {n} ]; do /bin/false; i=$((i+1)); done"], check=False
    )


def test_the_disk_budget_holds_under_a_storm_of_failures(tmp_path: Path) -> None:
    budget = 512 * 1024
    state = tmp_path / "state"
    agent = AgentProc(state, "--max-disk", str(budget), "--log-format", "none")
    peak = rounds = 0
    try:
        agent.wait_ready()
        # storms until the budget has had to evict (a quiet host writes less than a busy one),
        # then two more
        evicted_at: int | None = None
        while rounds < 40 and (evicted_at is None or rounds < evicted_at + 2):
            failing_storm(3000)
            rounds += 1
            peak = max(peak, StateDir(str(state)).used())
            if evicted_at is None and metric(agent.metrics(), "whyrestart_evicted_files_total"):
                evicted_at = rounds
        assert evicted_at is not None, "40 storms never filled the budget"
        # every failure judged, not dropped (verdicts come a settle window after their exit)
        made = 3000 * rounds
        until(lambda: metric(agent.metrics(), "whyrestart_exits_total") >= made, timeout=60)
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    used = StateDir(str(state)).used()
    # the budget is applied at each rotation and every few seconds; in between, the segment
    # being written (it rotates at an eighth of the budget, flushed each second) and an
    # incident being cut can stand above it
    assert peak <= budget * 1.5, (peak, budget)
    assert used <= budget * 1.25, (used, budget)


def test_a_full_disk_is_counted_and_writing_resumes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(state)], check=True)
    agent = AgentProc(state, "--log-format", "none")
    try:
        agent.wait_ready()
        until(lambda: _fill(agent) > 0, timeout=120)
        assert agent.proc.poll() is None  # alive
        subprocess.run(["mount", "-o", "remount,size=64m", str(state)], check=True)
        before = sorted((state / "segments").iterdir())
        failing_storm(200)
        until(lambda: sorted((state / "segments").iterdir()) != before, timeout=60)
        code, _ = agent.stop()
        assert code == 0
        segments = sorted((state / "segments").iterdir())
        assert segments[-1] not in before  # a new segment was written after space returned
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
        subprocess.run(["umount", "-l", str(state)], check=False)


def _fill(agent: AgentProc) -> float:
    failing_storm(500)
    return metric(agent.metrics(), "whyrestart_records_unwritten")


TRANSIENT = 16


def cgroup_dirs(root: str) -> set[str]:
    return {d for d, _, _ in os.walk(root)}


def test_short_lived_cgroups_leave_no_series_and_no_memory(tmp_path: Path) -> None:
    layout = CgroupLayout.from_system()
    if layout.memory_root is None:
        pytest.skip("no memory cgroup controller mounted")
    agent = AgentProc(tmp_path / "state", "--series-ttl", "1s", "--log-format", "none")
    prefix = f"wr-churn-{os.getpid()}-"
    series = re.compile(rf'whyrestart_clean_exits_total{{[^}}]*unit="[^"]*/{prefix}\d+"}}')
    seen = 0
    try:
        agent.wait_ready()
        parent = own_memory_cgroup(layout=layout)
        for batch in range(10):
            cgs = [
                ChildCgroup(parent, f"{prefix}{batch * 50 + i}", None, layout=layout)
                for i in range(50)
            ]
            for cg in cgs:
                cg.__enter__()
            try:
                for cg in cgs:
                    procs = os.path.join(cg.abs_path, "cgroup.procs")
                    subprocess.run(["sh", "-c", f"echo $$ > {procs}; /bin/true"], check=True)
                until(lambda: len(series.findall(agent.metrics())) >= 50, timeout=30)
                seen += len(series.findall(agent.metrics()))
            finally:
                for cg in cgs:
                    cg.__exit__(None, None, None)
        # every cgroup is gone: their series expire (ttl 1 s, checked every few seconds)
        until(lambda: not series.findall(agent.metrics()), timeout=60)
        rss = metric(agent.metrics(), "whyrestart_agent_process_resident_memory_bytes")
        # and what the agent keeps about them goes once two sweeps found them gone (a sweep
        # runs every 5 minutes, and at SIGHUP: two of those here)
        known = metric(agent.metrics(), "whyrestart_agent_cgroups_known")
        host_before = cgroup_dirs(layout.memory_root)

        def swept() -> int:
            return agent.stderr().count(b"gone cgroups swept")

        agent.proc.send_signal(signal.SIGHUP)
        until(lambda: swept() == 1)
        agent.proc.send_signal(signal.SIGHUP)
        until(lambda: swept() == 2)
        time.sleep(6)  # (the gauge is set every 5 s)
        after = metric(agent.metrics(), "whyrestart_agent_cgroups_known")
        # the host's other users (a test run beside this one, a container start) may have
        # made cgroups meanwhile, which the agent rightly knows: those still there, and a few
        # that came and went between the sweeps (a cgroup is forgotten once two sweeps found
        # it gone); a leak would keep all 500 of the churn's
        appeared = len(cgroup_dirs(layout.memory_root) - host_before) + TRANSIENT
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    assert seen >= 500
    assert rss < 150 * MiB, rss
    # the churn's cgroups the agent named (on a loaded host it names some only after they are
    # gone, which it cannot): the segments hold each one's naming record
    named = set()
    for seg in sorted((tmp_path / "state" / "segments").iterdir()):
        with TraceReader(seg) as reader:
            named |= {e.cgroup_id for e in reader if isinstance(e, CgroupInfo) and prefix in e.path}
    assert named and after <= known - len(named) + appeared, (known, after, len(named), appeared)
