"""Lab tier: the best rungs, cgroup v2 and memory.high, tested for real in the lab VM.

scripts/lab-vm boots Debian's stock kernel (6.1: kprobes, fentry, cgroup v2 with the memory
controller) under QEMU and runs these tests there with the host's .venv and the BPF object
built on the host, so CO-RE relocation onto another kernel is proven too. Outside the VM they
are skipped (tests/conftest.py). Every test runs its workload in its own child cgroup of the
VM's root cgroup (32-64 MiB limits) and checks the BPF events against the kernel's own
accounting: the kernel log's OOM report and the cgroup's ``memory.events`` counters.

Rung variants: a test parametrized by ``rung`` runs once with everything loadable (the best
rung wins) and once with the fentry/fexit programs switched off, so the kprobe rung is tested
even where fentry works. When a rung cannot attach on this kernel the fentry variant is
skipped with the kernel's reason and the kprobe variant still runs.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tracer.bpf import hooks, layout
from tracer.events import Event, Exit, KmsgOom, OomKill, ReclaimStall, ReclaimSummary
from tracer.record import Recorder, RecordResult, Targets
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup, parse_flat_keyed
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.lab

MiB = 1024 * 1024
HOG = "chunks = []\nwhile True:\n    chunks.append(b'x' * (1 << 20))\n"
# Allocates until its cgroup's memory.current passes memory.high by a tenth, then exits 0:
# argv[1] is the cgroup's directory. A bounded overage keeps the throttling penalty short
# (the kernel's penalty grows with the square of the overage, up to 2 s per return to user).
HIGH_HOG = """
import sys
cur = open(sys.argv[1] + "/memory.current")
high = int(open(sys.argv[1] + "/memory.high").read())
chunks = []
while len(chunks) < 128:
    cur.seek(0)
    if int(cur.read()) > high * 11 // 10:
        break
    chunks.append(b"x" * (1 << 20))
"""

FENTRY_PROGRAMS = tuple(
    p
    for ladder in hooks.LADDERS.values()
    for rung, progs in ladder
    if rung == "fentry"
    for p in progs
)
OOM_CONTEXT_PROGRAMS = tuple(p for _, progs in hooks.LADDERS["oom_context"] for p in progs)
# A test parametrized with these runs the best rung ("fentry": nothing disabled) and the
# kprobe rung (fentry/fexit programs disabled).
RUNGS = {"fentry": (), "kprobe": FENTRY_PROGRAMS}


# -- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cg_layout() -> CgroupLayout:
    lay = CgroupLayout.from_system()
    assert lay.memory_version == 2, f"the lab VM mounts cgroup v2 with memory; got {lay}"
    return lay


@pytest.fixture
def parent(cg_layout: CgroupLayout) -> str:
    return own_memory_cgroup(layout=cg_layout)


def _attach(disabled: tuple[str, ...]) -> hooks.Attached:
    config = layout.WrConfig(
        filter_all=0, memcg_v1=0, self_tgid=os.getpid(), watch_cgroups=0, stall_threshold_ns=0
    )
    probe = hooks.Probe(config, disabled=disabled)
    try:
        return probe.attach()
    finally:
        probe.close()


@pytest.fixture(scope="session")
def attached() -> dict[str, hooks.Attached]:
    """What attaches on this kernel with everything loadable and with fentry switched off; the
    table is written for scripts/lab-vm to show in its summary."""
    out = {name: _attach(disabled) for name, disabled in RUNGS.items()}
    lines = [f"kernel {os.uname().release}"]
    for hook in hooks.LADDERS:
        best, nofentry = out["fentry"].rungs[hook], out["kprobe"].rungs[hook]
        line = f"{hook:15} {best or 'none':11}"
        if nofentry != best:
            line += f" (fentry off: {nofentry or 'none'})"
        failed = out["fentry"].failures.get(hook)
        if failed:
            line += "  refused: " + "; ".join(failed)
        lines.append(line)
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    where = os.environ.get("WHYRESTART_LAB_OUT")
    if where and os.path.isdir(where):
        Path(where, "rungs.txt").write_text(report)
    return out


def need_rung(attached: dict[str, hooks.Attached], rung: str, hook: str) -> None:
    """Skip (fentry variant) or fail (kprobe variant) when ``rung`` does not win ``hook``."""
    got = attached[rung].rungs[hook]
    if got == rung:
        return
    why = "; ".join(attached[rung].failures.get(hook, [])) or f"{got} attached first"
    if rung == "fentry":
        pytest.skip(
            f"the fentry rung of {hook} does not attach on this kernel ({why}); "
            "the kprobe variant tests the next rung"
        )
    pytest.fail(f"the {rung} rung of {hook} did not attach: {why}")


def record(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    *,
    disabled: tuple[str, ...] = (),
    stall_threshold_ns: int = 10_000_000,
) -> tuple[RecordResult, list[Event]]:
    """Record ``argv`` with the programs in ``disabled`` switched off; the result and the
    events of the trace file it wrote."""

    class _Probe(hooks.Probe):
        def __init__(
            self, config: layout.WrConfig, path: str | None = None, off: tuple[str, ...] = ()
        ) -> None:
            super().__init__(config, path, (*off, *disabled))

    monkeypatch.setattr(hooks, "Probe", _Probe)
    out = str(tmp_path / "lab.trace")
    res = Recorder(
        out, Targets(command=argv), duration=90, stall_threshold_ns=stall_threshold_ns
    ).run()
    return res, list(read_trace(out).events)


def in_cgroup(cg: ChildCgroup, *argv: str) -> list[str]:
    """A command line that moves itself into the cgroup, then execs argv."""
    procs = os.path.join(cg.abs_path, "cgroup.procs")
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]


def memory_events(cg: ChildCgroup) -> dict[str, int]:
    return parse_flat_keyed(Path(cg.abs_path, "memory.events").read_text())


def delta(before: dict[str, int], after: dict[str, int], key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def only(events: list[Event], kind: type[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, kind)]


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rung", list(RUNGS))
def test_oom_kill_gets_the_exact_memcg(
    rung: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """oom_kill_process's oc->memcg via fentry/kprobe: the OOM event names the cgroup, and the
    verdict agrees with the kernel log and memory.events."""
    need_rung(attached, rung, "oom_context")
    name = f"wr-lab-oom-{rung}"
    with ChildCgroup(parent, name, 48 * MiB, layout=cg_layout) as cg:
        before = memory_events(cg)
        res, events = record(
            tmp_path, monkeypatch, in_cgroup(cg, sys.executable, "-c", HOG), disabled=RUNGS[rung]
        )
        after = memory_events(cg)
        path, cid = cg.path, cg.cgroup_id
    assert res.header.hooks["oom_context"] == rung
    [hog] = only(events, Exit)
    assert isinstance(hog, Exit) and hog.wait.signal == signal.SIGKILL
    [oom] = only(events, OomKill)
    assert isinstance(oom, OomKill)
    assert (oom.rung, oom.victim_pid, oom.memcg) == (rung, hog.pid, True)
    assert (oom.limit_cgroup_id, oom.victim_cgroup_id, oom.limit_bytes) == (cid, cid, 48 * MiB)
    assert 40 * MiB < oom.usage_bytes <= 48 * MiB
    [kmsg] = only(events, KmsgOom)
    assert isinstance(kmsg, KmsgOom)
    assert (kmsg.victim_pid, kmsg.memcg, kmsg.oom_memcg, kmsg.task_memcg) == (
        hog.pid,
        True,
        path,
        path,
    )
    assert delta(before, after, "oom_kill") == 1
    assert delta(before, after, "oom") >= 1
    [v] = res.verdicts
    assert (v.pid, v.cause, v.confidence) == (hog.pid, "cgroup_oom", "high")
    assert (v.limit_cgroup, v.limit_bytes) == (path, 48 * MiB)
    assert res.lost == 0


@pytest.mark.parametrize("rung", list(RUNGS))
def test_limit_of_an_ancestor_and_memcg_reclaim_name_that_ancestor(
    rung: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """The limit is on the parent: oc->memcg and try_to_free_mem_cgroup_pages' memcg both name
    the parent, not the task's own cgroup; memory.events agrees (oom on the parent only)."""
    need_rung(attached, rung, "oom_context")
    need_rung(attached, rung, "memcg_reclaim")
    with ChildCgroup(parent, f"wr-lab-nested-{rung}", 40 * MiB, layout=cg_layout) as outer:
        with ChildCgroup(outer.path, "inner", None, layout=cg_layout) as inner:
            b_outer, b_inner = memory_events(outer), memory_events(inner)
            res, events = record(
                tmp_path,
                monkeypatch,
                in_cgroup(inner, sys.executable, "-c", HOG),
                disabled=RUNGS[rung],
                stall_threshold_ns=0,  # every reclaim pass becomes an event
            )
            a_outer, a_inner = memory_events(outer), memory_events(inner)
            inner_id = inner.cgroup_id
        outer_path, outer_id = outer.path, outer.cgroup_id
    assert res.header.hooks["memcg_reclaim"] == rung
    [hog] = only(events, Exit)
    assert isinstance(hog, Exit)
    [oom] = only(events, OomKill)
    assert isinstance(oom, OomKill)
    assert (oom.rung, oom.limit_cgroup_id, oom.victim_cgroup_id) == (rung, outer_id, inner_id)
    assert oom.limit_bytes == 40 * MiB
    [v] = res.verdicts
    assert (v.cause, v.limit_cgroup, v.limit_scope) == ("cgroup_oom", outer_path, "ancestor")
    # the kernel counts the OOM on the cgroup at its limit, the kill on the victim's and up
    assert delta(b_outer, a_outer, "oom") >= 1 and delta(b_inner, a_inner, "oom") == 0
    assert delta(b_outer, a_outer, "oom_kill") == delta(b_inner, a_inner, "oom_kill") == 1
    assert delta(b_outer, a_outer, "max") >= 1

    stalls = [e for e in only(events, ReclaimStall) if isinstance(e, ReclaimStall)]
    memcg = [s for s in stalls if s.kind == "memcg" and s.pid == hog.pid]
    assert memcg, f"no memcg reclaim stall recorded: {stalls}"
    assert {(s.cgroup_id, s.task_cgroup_id, s.rung) for s in memcg} == {(outer_id, inner_id, rung)}
    assert all(s.duration_ns > 0 for s in memcg)
    summaries = [
        e
        for e in only(events, ReclaimSummary)
        if isinstance(e, ReclaimSummary) and e.kind == "memcg"
    ]
    by_cgroup = {s.cgroup_id for s in summaries}
    assert outer_id in by_cgroup and inner_id not in by_cgroup
    assert sum(s.count for s in summaries if s.cgroup_id == outer_id) >= len(memcg)


@pytest.mark.parametrize("rung", list(RUNGS))
def test_memory_high_throttling_has_durations(
    rung: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """memory.high below the working set: the over-high handler throttles the task; each pass
    is a "high" stall with its duration, attributed to the cgroup over its memory.high."""
    need_rung(attached, rung, "memory_high")
    with ChildCgroup(
        parent, f"wr-lab-high-{rung}", 64 * MiB, high_bytes=24 * MiB, layout=cg_layout
    ) as cg:
        before = memory_events(cg)
        res, events = record(
            tmp_path,
            monkeypatch,
            in_cgroup(cg, sys.executable, "-c", HIGH_HOG, cg.abs_path),
            disabled=RUNGS[rung],
            stall_threshold_ns=1_000_000,
        )
        after = memory_events(cg)
        cid = cg.cgroup_id
    assert res.header.hooks["memory_high"] == rung
    [hog] = only(events, Exit)
    assert isinstance(hog, Exit) and hog.wait.code == 0, hog
    assert delta(before, after, "high") >= 1
    assert delta(before, after, "oom_kill") == 0
    high = [
        e for e in only(events, ReclaimStall) if isinstance(e, ReclaimStall) and e.kind == "high"
    ]
    assert high, "no memory.high throttling stall recorded"
    assert {(s.pid, s.cgroup_id, s.task_cgroup_id, s.rung) for s in high} == {
        (hog.pid, cid, cid, rung)
    }
    assert all(s.duration_ns >= 1_000_000 for s in high)
    # the penalty sleep itself: at 10% over memory.high the kernel sleeps well over 10 ms
    assert max(s.duration_ns for s in high) >= 10_000_000
    summaries = [
        e
        for e in only(events, ReclaimSummary)
        if isinstance(e, ReclaimSummary) and e.kind == "high"
    ]
    assert {s.cgroup_id for s in summaries} == {cid}
    assert sum(s.count for s in summaries) >= len(high)
    [v] = res.verdicts
    assert (v.cause, v.exit_code) == ("app_exit", 0)


def test_oom_group_kills_every_member_and_each_gets_a_verdict(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """memory.oom.group=1: one OOM kills every task in the cgroup; each one is a victim with
    its own OOM event and its own cgroup_oom verdict."""
    with ChildCgroup(parent, "wr-lab-group", 48 * MiB, layout=cg_layout) as cg:
        Path(cg.abs_path, "memory.oom.group").write_text("1")
        before = memory_events(cg)
        members = ["sh", "-c", 'sleep 60 & sleep 60 & exec "$@"', "sh", sys.executable, "-c", HOG]
        # the recorded command stays outside the group and outlives it by a second, so every
        # member's exit is recorded before the recording ends
        argv = ["sh", "-c", '"$@"; sleep 1; exit 0', "sh", *in_cgroup(cg, *members)]
        res, events = record(tmp_path, monkeypatch, argv)
        after = memory_events(cg)
        path, cid = cg.path, cg.cgroup_id
    assert delta(before, after, "oom_kill") == 3
    if "oom_group_kill" in after:
        assert delta(before, after, "oom_group_kill") == 1
    ooms = [e for e in only(events, OomKill) if isinstance(e, OomKill)]
    assert len(ooms) == 3
    assert {(o.memcg, o.limit_cgroup_id, o.victim_cgroup_id) for o in ooms} == {(True, cid, cid)}
    assert sorted(o.victim_comm for o in ooms).count("sleep") == 2
    victims = {o.victim_pid for o in ooms}
    killed = {v.pid: v for v in res.verdicts if v.pid in victims}
    assert set(killed) == victims
    for v in killed.values():
        assert (v.cause, v.limit_cgroup, v.limit_bytes) == ("cgroup_oom", path, 48 * MiB), v
    others = [v for v in res.verdicts if v.pid not in victims]
    assert sorted((v.comm, v.cause, v.exit_code) for v in others) == [
        ("sh", "app_exit", 0),
        ("sleep", "app_exit", 0),
    ]


def test_old_mark_victim_format_falls_back_to_the_tracepoint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """Linux 6.1's mark_victim tracepoint is mark_victim(int pid): the tp_btf rung (written for
    mark_victim(task, uid)) is refused and the classic tracepoint takes over. Without the
    oom_context hooks, the limit is found by walking the OOM-ing task's cgroups in BPF."""
    release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    if release >= (6, 8):
        pytest.skip(f"kernel {os.uname().release} has the newer mark_victim(task, uid) prototype")
    assert attached["fentry"].rungs["oom"] == "tracepoint", attached["fentry"].failures.get("oom")
    with ChildCgroup(parent, "wr-lab-oldtp", 48 * MiB, layout=cg_layout) as cg:
        before = memory_events(cg)
        res, events = record(
            tmp_path,
            monkeypatch,
            in_cgroup(cg, sys.executable, "-c", HOG),
            disabled=OOM_CONTEXT_PROGRAMS,
        )
        after = memory_events(cg)
        path, cid = cg.path, cg.cgroup_id
    assert res.header.hooks["oom"] == "tracepoint"
    assert res.header.hooks["oom_context"] is None
    [hog] = only(events, Exit)
    assert isinstance(hog, Exit)
    [oom] = only(events, OomKill)
    assert isinstance(oom, OomKill)
    assert (oom.rung, oom.victim_pid, oom.memcg) == ("tracepoint", hog.pid, True)
    assert (oom.limit_cgroup_id, oom.limit_bytes) == (cid, 48 * MiB)
    [kmsg] = only(events, KmsgOom)
    assert isinstance(kmsg, KmsgOom) and (kmsg.victim_pid, kmsg.oom_memcg) == (hog.pid, path)
    assert delta(before, after, "oom_kill") == 1
    [v] = res.verdicts
    assert (v.pid, v.cause, v.limit_cgroup, v.limit_bytes) == (
        hog.pid,
        "cgroup_oom",
        path,
        48 * MiB,
    )
