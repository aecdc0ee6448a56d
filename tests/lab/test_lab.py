"""Lab tier: the best rungs, cgroup v2 and memory.high, tested for real in the lab VMs.

scripts/lab-vm boots Debian's stock kernels (6.1 and 5.10: kprobes, fentry, cgroup v2 with the
memory controller) under QEMU and runs these tests there with the host's .venv and the BPF
object built on the host, so CO-RE relocation onto other kernels is proven too (in the suites of
LAB_BUILD_IN_VM, bookworm by default, with the objects built in the VM from its own BTF
instead). Outside the VM they are skipped (tests/conftest.py). Every test runs its workload in
its own child cgroup of the VM's root cgroup (limits of 16-48 MiB) and checks the BPF events
against the kernel's own accounting: the kernel log's OOM report, the cgroup's
``memory.events`` and ``memory.pressure``.

Rung variants: a test parametrized by ``rung`` runs once with every program loadable (the best
rung wins: "fentry") and once with the fentry/fexit programs switched off ("kprobe"), so the
kprobe rung is tested even where fentry works. Where a rung cannot attach on this kernel, that
variant is skipped with the kernel's reason and the next rung's variant still runs.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tracer.bpf import gpuhooks, hooks, layout
from tracer.errors import BpfError
from tracer.events import Event, Exit, KmsgOom, OomKill, ReclaimStall, ReclaimSummary
from tracer.parse.cgroup import parse_flat_keyed
from tracer.pipeline.assembly import Profile
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources import system
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.lab

# the lab's kernel packages (scripts/lab-vm: .lab/kernel/SUITE/), seen from the guest over 9p
LAB_KERNELS = Path(__file__).resolve().parents[2] / ".lab" / "kernel"

MiB = 1024 * 1024
HOG = "chunks = []\nwhile True:\n    chunks.append(b'x' * (1 << 20))\n"
# Allocates for argv[1] seconds (at most 32 MiB), then exits 0. Above memory.high every
# allocation is throttled (reclaim, then a penalty sleep of up to 2 s per return to user
# space), so the time bound, not the amount, keeps the test short.
HIGH_HOG = """
import sys, time
deadline = time.monotonic() + float(sys.argv[1])
chunks = []
while len(chunks) < 32 and time.monotonic() < deadline:
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
OOM_BTF_PROGRAMS = dict(hooks.LADDERS["oom"])["tp_btf"]
# rung variant -> the programs switched off to get it
RUNGS = {"fentry": (), "kprobe": FENTRY_PROGRAMS}

# Bugs this tier found that are not fixed yet. A test that meets one (and only that exact
# failure) is reported as xfailed with the reason; once the bug is fixed it simply passes.
ENOTSUPP = 524  # the kernel's internal "operation not supported" errno
KNOWN_BUG_LOOKUP_AND_DELETE = (
    "known bug: KernelHooks.drain_reclaim uses BPF_MAP_LOOKUP_AND_DELETE_ELEM on a hash map, which "
    "kernels before 5.14 refuse with ENOTSUPP (524), so every recording aborts there"
)
KNOWN_BUG_NESTED_STALLS = (
    "known bug: reclaim_starts is keyed by thread only, and the over-high handler reclaims "
    "(try_to_free_mem_cgroup_pages) inside itself: the memcg reclaim hook overwrites and "
    "deletes the handler's start, so its fexit/kretprobe finds none and the throttle is lost"
)


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
    system.ensure_tracefs()
    probe = hooks.KernelHooks(config, disabled=disabled)
    try:
        return probe.attach()
    finally:
        probe.close()


@pytest.fixture(scope="session")
def attached() -> dict[str, hooks.Attached]:
    """What attaches on this kernel with every program loadable ("fentry") and with the
    fentry/fexit programs off ("kprobe"); the table goes to scripts/lab-vm's summary."""
    out = {name: _attach(disabled) for name, disabled in RUNGS.items()}
    lines = [f"Linux {os.uname().release} (mark_victim: {mark_victim_prototype()})"]
    for hook in hooks.LADDERS:
        best, second = out["fentry"].rungs[hook], out["kprobe"].rungs[hook]
        line = f"{hook:15} {best or 'none':10}"
        if second != best:
            line += f" fentry off: {second or 'none':10}"
        refused = out["fentry"].failures.get(hook, [])
        if refused:
            line += "  not attached: " + "; ".join(refused)
        lines.append(line.rstrip())
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    where = os.environ.get("WHYRESTART_LAB_OUT")
    if where and os.path.isdir(where):
        Path(where, "rungs.txt").write_text(report)
    return out


def test_objects_are_built_from_this_kernels_btf(attached: dict[str, hooks.Attached]) -> None:
    """Issue 31 item 5: in the suites of LAB_BUILD_IN_VM (bookworm's 6.1, older than the 6.16
    change of sched_process_exit that once broke the build), scripts/lab/guest builds the
    objects with `make -C bpf` from this kernel's own BTF, and this tier loads those: the
    vmlinux.h they were compiled with is this kernel's, and every hook attached from them."""
    built = os.environ.get("WHYRESTART_LAB_BPF_BUILT")
    if not built:
        pytest.skip("this run loads the host's objects (LAB_BUILD_IN_VM does not name its suite)")
    assert hooks.object_path() == os.path.join(built, "whyrestart.bpf.o")
    assert gpuhooks.object_path() == os.path.join(built, "gpu.bpf.o")
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    dumped = subprocess.run(
        [bpftool, "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert Path(built, "vmlinux.h").read_text() == dumped, "not this kernel's vmlinux.h"
    rungs = attached["fentry"].rungs
    missing = [h for h in ("exit", "signal", "oom", "oom_context", "fork", "exec") if not rungs[h]]
    assert not missing, f"hooks that attached no rung from the VM-built object: {missing}"


def mark_victim_prototype() -> str:
    """The kernel's oom/mark_victim tracepoint: "task" for the newer mark_victim(task, uid)
    (also backported to stable kernels: Debian's 6.1.192 and 5.10.262 have it, 5.10.223 does
    not), "pid" for the older mark_victim(int pid). The record format changed with the
    prototype: the newer one carries the victim's uid."""
    events = system.tracefs_events_dir()
    assert events, "tracefs is not mounted"
    fmt = Path(events, "events/oom/mark_victim/format").read_text()
    return "task" if "uid_t uid" in fmt else "pid"


def need_rung(attached: dict[str, hooks.Attached], variant: str, hook: str, rung: str) -> None:
    """Skip the test when ``rung`` cannot win ``hook`` on this kernel, with the reason."""
    got = attached[variant].rungs[hook]
    if got == rung:
        return
    why = "; ".join(attached[variant].failures.get(hook, [])) or f"{got} won"
    pytest.skip(f"the {rung} rung of {hook} does not attach on Linux {os.uname().release}: {why}")


def record(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    *,
    disabled: tuple[str, ...] = (),
    stall_threshold_ns: int = 10_000_000,
    cgroups: tuple[str, ...] = (),
    duration: float = 90,
) -> tuple[RecordResult, list[Event]]:
    """Record ``argv`` (and the ``cgroups`` too) with the programs in ``disabled`` switched
    off, for at most ``duration`` seconds: the result and the events of the trace file it
    wrote."""

    class _Hooks(hooks.KernelHooks):
        def __init__(
            self, config: layout.WrConfig, path: str | None = None, off: tuple[str, ...] = ()
        ) -> None:
            super().__init__(config, path, (*off, *disabled))

    monkeypatch.setattr(hooks, "KernelHooks", _Hooks)
    out = str(tmp_path / "lab.trace")
    try:
        res = Recorder(
            out,
            Targets(command=argv, cgroups=list(cgroups)),
            duration=duration,
            profile=Profile(stall_threshold_ns=stall_threshold_ns),
        ).run()
    except BpfError as exc:
        if exc.step == "draining map reclaim_stats" and exc.errno == ENOTSUPP:
            pytest.xfail(KNOWN_BUG_LOOKUP_AND_DELETE)
        raise
    return res, list(read_trace(out).events)


def in_cgroup(cg: ChildCgroup, *argv: str) -> list[str]:
    """A command line that moves itself into the cgroup, then execs argv."""
    procs = os.path.join(cg.abs_path, "cgroup.procs")
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]


def memory_events(cg: ChildCgroup) -> dict[str, int]:
    return parse_flat_keyed(Path(cg.abs_path, "memory.events").read_text())


def pressure_some_us(cg: ChildCgroup) -> int:
    """memory.pressure "some" total: microseconds some task of the cgroup stalled on memory."""
    first = Path(cg.abs_path, "memory.pressure").read_text().splitlines()[0]
    return int(first.rsplit("total=", 1)[1])


def delta(before: dict[str, int], after: dict[str, int], key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def victim_cgroup(res: RecordResult, cgroup_id: int, oom: OomKill) -> int:
    """The victim's cgroup id as the OOM event has it: tp_btf has the task; the tracepoint
    rung's record names the victim by pid only (0), unless the victim is the task whose
    allocation failed: the current task, whose cgroup is known."""
    if res.header.hooks["oom"] == "tp_btf" or oom.victim_pid == oom.trigger_pid:
        return cgroup_id
    return 0


def exits(events: list[Event]) -> list[Exit]:
    return [e for e in events if isinstance(e, Exit)]


def ooms(events: list[Event]) -> list[OomKill]:
    return [e for e in events if isinstance(e, OomKill)]


def kmsg_ooms(events: list[Event]) -> list[KmsgOom]:
    return [e for e in events if isinstance(e, KmsgOom)]


def stalls(events: list[Event], kind: str) -> list[ReclaimStall]:
    return [e for e in events if isinstance(e, ReclaimStall) and e.kind == kind]


def summaries(events: list[Event], kind: str) -> list[ReclaimSummary]:
    return [e for e in events if isinstance(e, ReclaimSummary) and e.kind == kind]


# -- OOM kills: the exact memcg from oom_kill_process ----------------------------------------------


def test_every_hook_has_a_rung_on_this_kernel(attached: dict[str, hooks.Attached]) -> None:
    """Every hook attaches somewhere on every lab kernel: a construct one kernel's verifier
    refuses in a shared handler takes every rung of its hook down at once (a fetching atomic
    add, refused before 5.12, left 5.10 with no signal hook at all)."""
    missing = {
        hook: attached["fentry"].failures.get(hook, [])
        for hook, rung in attached["fentry"].rungs.items()
        if rung is None
    }
    assert missing == {}


@pytest.mark.parametrize("variant", list(RUNGS))
def test_oom_kill_gets_the_exact_memcg(
    variant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """memory.max OOM: the fentry/kprobe rung reads oc->memcg; the OOM event names the cgroup,
    and the verdict agrees with the kernel log and with memory.events."""
    need_rung(attached, variant, "oom_context", variant)
    with ChildCgroup(parent, f"wr-lab-oom-{variant}", 48 * MiB, layout=cg_layout) as cg:
        before = memory_events(cg)
        res, events = record(
            tmp_path, monkeypatch, in_cgroup(cg, sys.executable, "-c", HOG), disabled=RUNGS[variant]
        )
        after = memory_events(cg)
        path, cid = cg.path, cg.cgroup_id
    assert res.header.hooks["oom_context"] == variant
    [hog] = exits(events)
    assert hog.wait.signal == signal.SIGKILL
    [oom] = ooms(events)
    assert (oom.rung, oom.victim_pid, oom.memcg) == (variant, hog.pid, True)
    # oom_control's own constraint, and a kill (not a mark of a task already exiting)
    assert (oom.constraint, oom.exiting) == ("memcg", False)
    assert (oom.limit_cgroup_id, oom.limit_bytes) == (cid, 48 * MiB)
    assert oom.victim_cgroup_id == victim_cgroup(res, cid, oom)
    assert 40 * MiB < oom.usage_bytes <= 48 * MiB
    [kmsg] = kmsg_ooms(events)
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


@pytest.mark.parametrize("variant", list(RUNGS))
def test_limit_on_an_ancestor_is_the_exact_memcg(
    variant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """The limit is on the parent: oc->memcg names the parent, not the victim's own cgroup;
    memory.events agrees (the OOM is counted on the parent only, the kill on both)."""
    need_rung(attached, variant, "oom_context", variant)
    with ChildCgroup(parent, f"wr-lab-anc-{variant}", 40 * MiB, layout=cg_layout) as outer:
        with ChildCgroup(outer.path, "inner", None, layout=cg_layout) as inner:
            b_outer, b_inner = memory_events(outer), memory_events(inner)
            res, events = record(
                tmp_path,
                monkeypatch,
                in_cgroup(inner, sys.executable, "-c", HOG),
                disabled=RUNGS[variant],
            )
            a_outer, a_inner = memory_events(outer), memory_events(inner)
            inner_id = inner.cgroup_id
        outer_path, outer_id = outer.path, outer.cgroup_id
    [oom] = ooms(events)
    assert (oom.rung, oom.limit_cgroup_id) == (variant, outer_id)
    assert oom.victim_cgroup_id == victim_cgroup(res, inner_id, oom)
    assert oom.limit_bytes == 40 * MiB
    [kmsg] = kmsg_ooms(events)
    assert (kmsg.oom_memcg, kmsg.task_memcg) == (outer_path, outer_path + "/inner")
    [v] = res.verdicts
    assert (v.cause, v.limit_cgroup, v.limit_scope) == ("cgroup_oom", outer_path, "ancestor")
    assert delta(b_outer, a_outer, "oom") >= 1 and delta(b_inner, a_inner, "oom") == 0
    assert delta(b_outer, a_outer, "oom_kill") == delta(b_inner, a_inner, "oom_kill") == 1


def test_oom_group_kills_every_member_and_each_gets_a_verdict(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """memory.oom.group=1: one OOM kills every task of the cgroup; each is a victim with its
    own OOM event and its own cgroup_oom verdict."""
    with ChildCgroup(parent, "wr-lab-group", 48 * MiB, layout=cg_layout) as cg:
        Path(cg.abs_path, "memory.oom.group").write_text("1")
        before = memory_events(cg)
        members = ["sh", "-c", 'sleep 60 & sleep 60 & exec "$@"', "sh", sys.executable, "-c", HOG]
        # the recorded command stays outside the group and outlives it by a second, so that
        # every member's exit is recorded before the recording ends
        argv = ["sh", "-c", '"$@"; sleep 1; exit 0', "sh", *in_cgroup(cg, *members)]
        res, events = record(tmp_path, monkeypatch, argv)
        after = memory_events(cg)
        path, cid = cg.path, cg.cgroup_id
    kills = ooms(events)
    victims = {o.victim_pid for o in kills}
    assert len(victims) == len(kills) == 3, kills
    # The kernel kills the chosen victim, then every member of the group: the victim a second
    # time if it has not exited yet. memory.events counts both kills, mark_victim (TIF_MEMDIE
    # already set) only the first.
    assert delta(before, after, "oom_kill") in (3, 4), (before, after)
    assert {(o.memcg, o.limit_cgroup_id, o.victim_cgroup_id) for o in kills} == {
        (True, cid, victim_cgroup(res, cid, o)) for o in kills
    }
    exact = "memcg" if res.header.hooks["oom_context"] else ""
    assert {(o.constraint, o.exiting) for o in kills} == {(exact, False)}
    if "oom_group_kill" in after:  # Linux 5.17+
        assert delta(before, after, "oom_group_kill") == 1
    comms = {e.pid: e.comm for e in exits(events)}
    assert sorted(comms[p] for p in victims).count("sleep") == 2
    killed = {v.pid: v for v in res.verdicts if v.pid in victims}
    assert set(killed) == victims
    for v in killed.values():
        assert (v.cause, v.limit_cgroup, v.limit_bytes) == ("cgroup_oom", path, 48 * MiB), v
    others = sorted((v.comm, v.cause, v.exit_code) for v in res.verdicts if v.pid not in victims)
    assert others == [("sh", "app_exit", 0), ("sleep", "app_exit", 0)]


# -- OOM kills: the fallback rungs and the mark_victim prototype -----------------------------------


def test_mark_victim_prototype_decides_the_oom_rung(attached: dict[str, hooks.Attached]) -> None:
    """tp_btf/mark_victim is written for mark_victim(task, uid); on a kernel with the older
    mark_victim(int pid) the verifier must refuse it, so the classic tracepoint takes over
    (a tp_btf program reading an int as a task pointer would see no victim at all)."""
    rungs, failures = attached["fentry"].rungs, attached["fentry"].failures.get("oom", [])
    if mark_victim_prototype() == "task":
        assert rungs["oom"] == "tp_btf", failures
    else:
        assert rungs["oom"] == "tracepoint", "tp_btf attached to mark_victim(int pid)"
        assert any(f.startswith("tp_btf") for f in failures), failures


@pytest.mark.parametrize("rung", ["tp_btf", "tracepoint"])
def test_oom_without_oom_context_walks_to_the_limit(
    rung: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """Without oom_kill_process (no kprobes, no fentry) the mark_victim rungs find the cgroup
    at its limit by walking the memory cgroups in BPF; the tracepoint rung must read this
    kernel's record format right (its pid is where CO-RE says)."""
    disabled = OOM_CONTEXT_PROGRAMS
    if rung == "tracepoint":
        disabled += OOM_BTF_PROGRAMS
    else:
        need_rung(attached, "fentry", "oom", "tp_btf")
    with ChildCgroup(parent, f"wr-lab-walk-{rung}", 40 * MiB, layout=cg_layout) as outer:
        with ChildCgroup(outer.path, "inner", None, layout=cg_layout) as inner:
            before = memory_events(inner)
            res, events = record(
                tmp_path,
                monkeypatch,
                in_cgroup(inner, sys.executable, "-c", HOG),
                disabled=disabled,
            )
            after = memory_events(inner)
            inner_id = inner.cgroup_id
        outer_path, outer_id = outer.path, outer.cgroup_id
    assert (res.header.hooks["oom"], res.header.hooks["oom_context"]) == (rung, None)
    [hog] = exits(events)
    [oom] = ooms(events)
    assert (oom.rung, oom.victim_pid, oom.memcg) == (rung, hog.pid, True)
    assert (oom.limit_cgroup_id, oom.limit_bytes) == (outer_id, 40 * MiB)
    assert oom.victim_cgroup_id == victim_cgroup(res, inner_id, oom)
    [kmsg] = kmsg_ooms(events)
    assert (kmsg.victim_pid, kmsg.oom_memcg) == (hog.pid, outer_path)
    assert delta(before, after, "oom_kill") == 1
    [v] = res.verdicts
    assert (v.pid, v.cause, v.limit_cgroup, v.limit_bytes) == (
        hog.pid,
        "cgroup_oom",
        outer_path,
        40 * MiB,
    )


# Holds 40 MiB under its own name, says so, and waits to be killed.
BIG = """
import time
open("/proc/self/comm", "w").write("bigholder")
chunks = [b"x" * (1 << 20) for _ in range(40)]
print("held", flush=True)
time.sleep(120)
"""
# Allocates 30 MiB, then exits 0.
SMALL = "chunks = [b'x' * (1 << 20) for _ in range(30)]\n"


@pytest.mark.parametrize("variant", list(RUNGS))
def test_a_victim_another_tasks_allocation_chose_is_named_by_its_task(
    variant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """The classic mark_victim record has the victim's tid alone. A process that entered the
    watched cgroup by migration (as runc moves a container's init in) is not among the
    watched pids; when another task's allocation makes the OOM killer choose it, the record
    must still name it, its comm and its cgroup: from oom_control's chosen task (kernel-side
    review §10)."""
    need_rung(attached, variant, "oom_context", variant)
    with ChildCgroup(parent, f"wr-lab-chosen-{variant}", 56 * MiB, layout=cg_layout) as cg:
        big = subprocess.Popen(
            in_cgroup(cg, sys.executable, "-c", BIG), stdout=subprocess.PIPE, text=True
        )
        try:
            assert big.stdout is not None and big.stdout.readline().strip() == "held"
            res, events = record(
                tmp_path,
                monkeypatch,
                in_cgroup(cg, sys.executable, "-c", SMALL),
                disabled=(*RUNGS[variant], *OOM_BTF_PROGRAMS),
                cgroups=(cg.path,),
            )
        finally:
            big.kill()
            code = big.wait()
        cid = cg.cgroup_id
    assert code == -signal.SIGKILL
    assert res.header.hooks["oom"] == "tracepoint"
    [oom] = ooms(events)
    assert oom.victim_pid == big.pid and oom.trigger_pid != big.pid
    assert (oom.victim_comm, oom.victim_cgroup_id, oom.memcg) == ("bigholder", cid, True)
    [kmsg] = kmsg_ooms(events)
    assert kmsg.victim_pid == big.pid


# 1 GiB at most: more than the VM has left beside the holder below, and it ends once the
# holder is gone
BOUNDED_HOG = "chunks = []\nfor _ in range(1024):\n    chunks.append(b'x' * (1 << 20))\n"
# Allocates argv[1] MiB, says so on stdout, then holds it.
HOLD = """
import sys, time
chunks = [b"x" * (1 << 20) for _ in range(int(sys.argv[1]))]
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("rung", ["tp_btf", "tracepoint"])
def test_a_global_oom_with_a_cgroup_near_its_limit_is_global(
    rung: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """The VM (2 GiB) runs out while the biggest process sits 48 MiB under its cgroup's
    1.25 GiB limit: the OOM killer picks it, and the walk rungs must not call that a memcg OOM
    (a charge fails within a folio of the limit; 48 MiB is not that). The kernel log says
    CONSTRAINT_NONE too, and the verdict is global_oom."""
    disabled = OOM_CONTEXT_PROGRAMS
    if rung == "tracepoint":
        disabled += OOM_BTF_PROGRAMS
    else:
        need_rung(attached, "fentry", "oom", "tp_btf")
    limit, held = 1280 * MiB, 1232
    with ChildCgroup(parent, f"wr-lab-global-{rung}", limit, layout=cg_layout) as near:
        # the holder fills its cgroup to 48 MiB under the limit, then the hog (no limit of its
        # own) allocates until the VM runs out
        procs = os.path.join(near.abs_path, "cgroup.procs")
        script = (
            f'sh -c \'echo $$ > {procs} && exec "$0" -c "$1" {held}\' "$0" "$1" | '
            '{ read line; exec "$0" -c "$2"; }'
        )
        res, events = record(
            tmp_path,
            monkeypatch,
            ["sh", "-c", script, sys.executable, HOLD, BOUNDED_HOG],
            disabled=disabled,
            # a VM with no swap thrashes on its own code pages before its OOM killer runs: 98 s
            # for this test on a busy host under TCG, and a 90 s recording ended before the
            # kill ("no OOM kill") or before the victim's exit (no verdict); the command ends
            # itself once the hog is done
            duration=300,
        )
        near_id = near.cgroup_id
    assert (res.header.hooks["oom"], res.header.hooks["oom_context"]) == (rung, None)
    kills = ooms(events)
    assert kills, "no OOM kill"
    holder = kills[0]
    assert holder.victim_cgroup_id == victim_cgroup(res, near_id, holder)
    assert (holder.rung, holder.memcg) == (rung, False)
    [kmsg] = [k for k in kmsg_ooms(events) if k.victim_pid == holder.victim_pid]
    assert (kmsg.memcg, kmsg.constraint) == (False, "CONSTRAINT_NONE")
    mine = [v for v in res.verdicts if v.pid == holder.victim_pid]
    assert len(mine) == 1, (
        f"verdicts {[(v.pid, v.cause) for v in res.verdicts]}; the victim's exits "
        f"{[e for e in exits(events) if e.pid == holder.victim_pid]}; lost {res.lost}; "
        f"warnings {res.warnings}; ended: {res.reason}"
    )
    [v] = mine
    assert (v.cause, v.limit_cgroup) == ("global_oom", None)


class _StartKey(ctypes.Structure):
    # struct reclaim_start_key in bpf/whyrestart.bpf.c
    _fields_ = [("tid", ctypes.c_uint32), ("kind", ctypes.c_uint32), ("start", ctypes.c_uint64)]


def test_64_threads_throttled_at_once_are_each_closed_on_the_kprobe_rung(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """64 threads over memory.high at once, each asleep in the penalty on its own way back to
    user space: more calls in flight than a kretprobe's default maxactive (max(10, 2 x CPUs)).
    Attached through a tracefs event with room for them all, the kretprobe misses none, every
    start is closed (none left in reclaim_starts) and every duration is sane."""
    from tests.mt import build

    need_rung(attached, "kprobe", "memory_high", "kprobe")
    if build.gcc() is None:
        pytest.skip("no C compiler (gcc) to build tests/mt")
    mtwork = build.mtwork(tmp_path)
    left: list[int] = []
    profile: list[list[str]] = []

    class Hooks(hooks.KernelHooks):
        def close(self) -> None:
            starts = self.obj.map("reclaim_starts").keys(_StartKey)
            left.append(sum(1 for k in starts if k.kind == 3))  # type: ignore[attr-defined]
            tracefs = system.tracefs_events_dir()
            if tracefs:  # "EVENT HITS MISSES" per kprobe event (the event's name only)
                text = Path(tracefs, "kprobe_profile").read_text()
                profile.extend(ln.split() for ln in text.splitlines())
            super().close()

    monkeypatch.setattr(hooks, "KernelHooks", Hooks)
    with ChildCgroup(
        parent, "wr-lab-high64", 512 * MiB, high_bytes=16 * MiB, layout=cg_layout
    ) as cg:
        res, events = record(
            tmp_path,
            monkeypatch,
            in_cgroup(cg, str(mtwork), "touch", "64", "8", "4"),
            disabled=RUNGS["kprobe"],
            stall_threshold_ns=0,
        )
        cid = cg.cgroup_id
    assert res.header.hooks["memory_high"] == "kprobe"
    [ex] = exits(events)
    assert ex.wait.code == 0
    high = stalls(events, "high")
    assert {(s.pid, s.cgroup_id) for s in high} == {(ex.pid, cid)}
    # each throttle pairs its own entry and return: it lies inside the throttled process's
    # life (a return paired with another task's entry would start before it, or end after)
    assert all(ex.start_ns < s.ts - s.duration_ns < s.ts <= ex.ts for s in high), [
        (s.ts - s.duration_ns, s.ts) for s in high
    ]
    # attached through the tracefs event (with maxactive): it missed no return, none left open
    [kret] = [p for p in profile if p[0] == "high_kretprobe"]
    assert (int(kret[1]) > 0, int(kret[2])) == (True, 0)  # hits, and no miss
    assert left == [0]
    # and it had more throttles in flight at once than a default maxactive would follow
    edges = sorted(e for s in high for e in ((s.ts - s.duration_ns, 1), (s.ts, -1)))
    at_once = max(itertools.accumulate(step for _, step in edges))
    default = max(10, 2 * (os.cpu_count() or 1))
    print(f"{len(high)} throttles closed, {at_once} at once, by {len({s.comm for s in high})}")
    if at_once <= default:
        pytest.skip(
            f"Linux {os.uname().release} throttled at most {at_once} of the 64 threads at once "
            f"here: more than a default maxactive ({default}) in flight cannot be shown"
        )


# -- memcg reclaim and memory.high throttling ------------------------------------------------------


@pytest.mark.parametrize("variant", list(RUNGS))
def test_memcg_reclaim_names_the_memcg_being_reclaimed(
    variant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """try_to_free_mem_cgroup_pages' memcg argument: reclaim stalls of a task in an unlimited
    child are charged to the limited parent being reclaimed, and memory.events agrees."""
    need_rung(attached, variant, "memcg_reclaim", variant)
    with ChildCgroup(parent, f"wr-lab-reclaim-{variant}", 40 * MiB, layout=cg_layout) as outer:
        with ChildCgroup(outer.path, "inner", None, layout=cg_layout) as inner:
            b_outer, b_inner = memory_events(outer), memory_events(inner)
            res, events = record(
                tmp_path,
                monkeypatch,
                in_cgroup(inner, sys.executable, "-c", HOG),
                disabled=RUNGS[variant],
                stall_threshold_ns=0,  # every reclaim pass is an event
            )
            a_outer, a_inner = memory_events(outer), memory_events(inner)
            inner_id = inner.cgroup_id
        outer_id = outer.cgroup_id
    assert res.header.hooks["memcg_reclaim"] == variant
    [hog] = exits(events)
    memcg = [s for s in stalls(events, "memcg") if s.pid == hog.pid]
    assert memcg, "no memcg reclaim stall recorded"
    assert {(s.cgroup_id, s.task_cgroup_id, s.rung) for s in memcg} == {
        (outer_id, inner_id, variant)
    }
    assert all(s.duration_ns > 0 for s in memcg)
    sums = summaries(events, "memcg")
    assert {s.cgroup_id for s in sums} == {outer_id}
    assert sum(s.count for s in sums) == len(stalls(events, "memcg"))
    # the kernel counts hitting memory.max on the limited cgroup only
    assert delta(b_outer, a_outer, "max") >= 1 and delta(b_inner, a_inner, "max") == 0


@pytest.mark.parametrize("variant", list(RUNGS))
def test_reclaim_asked_for_from_outside_is_not_the_cgroups_stall(
    variant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """A write of memory.high (or memory.reclaim) reclaims in the writer, which is not in the
    cgroup (kubelet's MemoryQoS, senpai): its passes are "external", never the cgroup's own
    "memcg" stall that an OOM verdict cites (kernel-side review §17). The cgroup's
    memory.current dropping is the kernel's own word that the reclaim happened."""
    need_rung(attached, variant, "memcg_reclaim", variant)
    # Page cache to reclaim: in the VM every writable place is tmpfs (shmem: never reclaimed
    # without swap, and charged to its writer), so the pages are read from the host's root,
    # shared over 9p with cache=loose: a lab kernel's image, which the guest never reads
    # itself; each variant its own 24 MiB of it (pages already cached are not charged anew).
    images = sorted(LAB_KERNELS.glob("*/vmlinux"))
    if not images:
        pytest.skip(f"no kernel image under {LAB_KERNELS} to read page cache from")
    skip = list(RUNGS).index(variant) * 24
    read = ["dd", f"if={images[0]}", "of=/dev/null", "bs=1M", f"skip={skip}", "count=24"]
    with ChildCgroup(parent, f"wr-lab-external-{variant}", None, layout=cg_layout) as target:
        # its page cache, charged to the cgroup that read it
        subprocess.run(in_cgroup(target, *read), capture_output=True, check=True)
        current = Path(target.abs_path, "memory.current")
        before = int(current.read_text())
        res, events = record(
            tmp_path,
            monkeypatch,
            # lowering memory.high reclaims down to it in the writer (memory_high_write, since
            # 5.9; memory.reclaim, which does the same, came in 5.19)
            ["sh", "-c", f"echo {before - 12 * MiB} > {target.abs_path}/memory.high"],
            disabled=RUNGS[variant],
            stall_threshold_ns=0,
        )
        after = int(current.read_text())
        target_id = target.cgroup_id
    assert res.header.hooks["memcg_reclaim"] == variant
    assert before >= 20 * MiB and before - after >= 8 * MiB, (before, after)
    external = stalls(events, "external")
    assert external and {s.cgroup_id for s in external} == {target_id}
    assert [s for s in stalls(events, "memcg") if s.cgroup_id == target_id] == []
    assert {s.cgroup_id for s in summaries(events, "external")} == {target_id}


@pytest.mark.parametrize("variant", list(RUNGS))
def test_memory_high_throttling_has_durations(
    variant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    cg_layout: CgroupLayout,
    attached: dict[str, hooks.Attached],
) -> None:
    """memory.high below the working set: each pass of the over-high handler (reclaim, then the
    penalty sleep) is a "high" stall with its duration, charged to the cgroup over memory.high;
    memory.events and memory.pressure agree."""
    need_rung(attached, variant, "memory_high", variant)
    with ChildCgroup(
        parent, f"wr-lab-high-{variant}", 64 * MiB, high_bytes=16 * MiB, layout=cg_layout
    ) as cg:
        before, psi_before = memory_events(cg), pressure_some_us(cg)
        res, events = record(
            tmp_path,
            monkeypatch,
            in_cgroup(cg, sys.executable, "-c", HIGH_HOG, "1.5"),
            disabled=RUNGS[variant],
            stall_threshold_ns=1_000_000,
        )
        after, psi_after = memory_events(cg), pressure_some_us(cg)
        cid = cg.cgroup_id
    assert res.header.hooks["memory_high"] == variant
    [hog] = exits(events)
    assert hog.wait.code == 0, hog
    assert delta(before, after, "high") >= 1
    assert delta(before, after, "oom_kill") == 0
    high = stalls(events, "high")
    if not high and any(s.cgroup_id == cid for s in summaries(events, "memcg")):
        pytest.xfail(KNOWN_BUG_NESTED_STALLS)
    assert high, "no memory.high throttling stall recorded"
    assert {(s.pid, s.cgroup_id, s.task_cgroup_id, s.rung) for s in high} == {
        (hog.pid, cid, cid, variant)
    }
    assert all(s.duration_ns >= 1_000_000 for s in high)
    longest = max(s.duration_ns for s in high)
    assert longest >= 10_000_000, "no penalty sleep: the longest throttle was {longest} ns"
    # the kernel's own stall clock for the cgroup saw at least the longest throttle
    assert (psi_after - psi_before) * 1000 >= longest // 2
    # a pass that names no cgroup would be a handler call with nothing over memory.high
    sums = summaries(events, "high")
    assert {s.cgroup_id for s in sums} == {cid}
    assert sum(s.count for s in sums) >= len(high)
    [v] = res.verdicts
    assert (v.cause, v.exit_code) == ("app_exit", 0)
