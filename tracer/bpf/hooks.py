"""Which program runs each hook: the fallback ladders, loading, and attaching best-first.

Every rung of a ladder is a twin program in bpf/whyrestart.bpf.c sharing one inline handler.
All twins that the kernel accepts are loaded; then, per hook, the rungs are attached best-first
and the first one that attaches wins. A program the kernel refuses at load time (fentry gets
EPERM on some kernels; tp_btf needs the kernel's tracepoint prototype to match) is switched off
with ``bpf_program__set_autoload`` and the object is loaded again without it. The chosen rung of
every hook is reported, written into the trace header, and shown by ``whyrestart doctor``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from tracer.bpf import layout
from tracer.bpf.libbpf import (
    BpfObject,
    Link,
    Map,
    attach_kretprobe_maxactive,
    lib,
    remove_stale_kprobe_events,
)
from tracer.bpf.objects import default_object
from tracer.errors import BpfError, KernelUnsupported
from tracer.events import signal_name
from tracer.sources import system

# hook -> [(rung, programs)], best first; a rung is used only if all its programs attach.
# "oom_context" does not emit: it lets mark_victim read oom_control (the exact memcg) instead of
# walking ancestors; see the OOM block in the C file.
LADDERS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    # the *_dedup rungs are for kernels whose sched_process_exit has no group_dead (see C file)
    "exit": [
        ("tp_btf", ("exit_btf",)),
        ("tp_btf_dedup", ("exit_btf_dedup",)),
        ("tracepoint", ("exit_tp",)),
        ("tracepoint_dedup", ("exit_tp_dedup",)),
    ],
    "signal": [("tp_btf", ("signal_btf",)), ("tracepoint", ("signal_tp",))],
    "oom": [("tp_btf", ("oom_btf",)), ("tracepoint", ("oom_tp",))],
    "oom_context": [
        ("fentry", ("oom_fentry", "oom_fexit")),
        ("kprobe", ("oom_kprobe", "oom_kretprobe")),
    ],
    "fork": [("tp_btf", ("fork_btf",)), ("raw_tp", ("fork_raw",))],
    "exec": [("tp_btf", ("exec_btf",)), ("raw_tp", ("exec_raw",))],
    "cgroup_mkdir": [("tp_btf", ("cgroup_mkdir_btf",)), ("raw_tp", ("cgroup_mkdir_raw",))],
    "cgroup_rmdir": [("tp_btf", ("cgroup_rmdir_btf",)), ("raw_tp", ("cgroup_rmdir_raw",))],
    "memcg_reclaim": [
        ("fentry", ("memcg_reclaim_fentry", "memcg_reclaim_fexit")),
        ("kprobe", ("memcg_reclaim_kprobe", "memcg_reclaim_kretprobe")),
        ("tp_btf", ("memcg_reclaim_begin_btf", "memcg_reclaim_end_btf")),
        ("tracepoint", ("memcg_reclaim_begin_tp", "memcg_reclaim_end_tp")),
    ],
    "direct_reclaim": [
        ("tp_btf", ("direct_reclaim_begin_btf", "direct_reclaim_end_btf")),
        ("tracepoint", ("direct_reclaim_begin_tp", "direct_reclaim_end_tp")),
    ],
    "kswapd": [("tp_btf", ("kswapd_wakeup_btf",)), ("tracepoint", ("kswapd_wakeup_tp",))],
    "memory_high": [
        ("fentry", ("high_fentry", "high_fexit")),
        ("kprobe", ("high_kprobe", "high_kretprobe")),
    ],
}
# An aggregate of stalls unchanged for this many drains (a minute at one a second) leaves the
# kernel's table: its cgroup is idle or gone.
RECLAIM_IDLE_DRAINS = 60
# Without these, there is nothing to attribute an exit to.
REQUIRED = ("exit",)
# Hooks whose absence is normal on some kernels and only lowers precision.
ENRICHING = ("oom_context", "memory_high")

# The memory.high handler was renamed when its fast-path check became an inline wrapper; the
# programs are pointed at whichever name this kernel has (see the C file).
HIGH_HANDLERS = ("__mem_cgroup_handle_over_high", "mem_cgroup_handle_over_high")
RETARGETED = ("high_fentry", "high_fexit", "high_kprobe", "high_kretprobe")
TRAMPOLINE_SECTIONS = ("fentry/", "fexit/", "fmod_ret/")


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bit: the hash handle_mkdir computes over a new cgroup's path."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def kernel_function(
    candidates: tuple[str, ...],
    btf: str = "/sys/kernel/btf/vmlinux",
    kallsyms: str = "/proc/kallsyms",
) -> str | None:
    """The first of ``candidates`` that this kernel has as a function.

    Looked up among the names in the kernel's BTF first: a plain 5 MB read and a byte search,
    about 7 ms, where /proc/kallsyms is generated on every read (30-50 ms here, a tenth of the
    start-up). BTF describes the functions that were not inlined, which are the ones a kprobe
    or fentry program can attach to; kallsyms answers when the BTF names neither. (Building a
    set of kallsyms' ~200,000 names took 0.6 s: a byte search there too.)"""
    for path, patterns in (
        (btf, (b"\0%s\0",)),
        (kallsyms, (b" T %s\n", b" t %s\n")),
    ):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        for c in candidates:
            if any(p % c.encode() in data for p in patterns):
                return c
    return None


_FAILED_PROG = re.compile(r"prog '(\w+)': (?:.*fail|.*error|.*invalid|.*not)", re.IGNORECASE)

DEFAULT_OBJECT = default_object("whyrestart.bpf.o")


def object_path() -> str:
    return os.environ.get("WHYRESTART_BPF_OBJECT", DEFAULT_OBJECT)


@dataclass
class Attached:
    """What ended up running: the rung per hook (None: nothing attached) and why rungs failed."""

    rungs: dict[str, str | None] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    refused_at_load: dict[str, str] = field(default_factory=dict)
    # programs attached with less than intended (a kretprobe with the default maxactive)
    degraded: dict[str, str] = field(default_factory=dict)


class KernelHooks:
    """The loaded object with its hooks attached; the only owner of links and maps."""

    def __init__(
        self, config: layout.WrConfig, path: str | None = None, disabled: tuple[str, ...] = ()
    ) -> None:
        self.path = path or object_path()
        self.config = config
        self.attached = Attached()
        self.high_handler: str | None = None
        self._links: list[Link] = []
        self.obj = self._load(set(disabled))
        self.events: Map = self.obj.map("events")
        self.watched_pids: Map = self.obj.map("watched_pids")
        self.watched_cgroups: Map = self.obj.map("watched_cgroups")
        self.lost: Map = self.obj.map("lost")
        self.signals_unsent_map: Map = self.obj.map("signals_unsent")
        self.reclaim_stats: Map = self.obj.map("reclaim_stats")
        self.reclaim_max: Map = self.obj.map("reclaim_max")
        # (cgroup id, kind) -> (the totals last read, drains since they last changed)
        self._reclaim_seen: dict[tuple[int, int], tuple[layout.WrReclaimStats, int]] = {}
        self.pressure_counters: Map = self.obj.map("pressure_counters")
        self.clean_exits: Map = self.obj.map("clean_exits")
        self.cgroups_gone: Map = self.obj.map("cgroups_gone")
        self._cgroups_refused = 0
        if config.self_tgid == os.getpid():
            # this thread is the recorder's: what it (and the threads it starts) runs is a
            # helper, never evidence (see the helpers map in the C file)
            self.obj.map("recorder_threads").update(
                ctypes.c_uint32(threading.get_native_id()), ctypes.c_uint8(1)
            )

    # -- loading ----------------------------------------------------------------------------

    def _open(self, disabled: set[str]) -> BpfObject:
        obj = BpfObject(self.path)
        rodata = obj.map(".rodata").initial_value()
        want = ctypes.sizeof(self.config)
        if len(rodata) < want:
            obj.close()
            raise BpfError(f"configuring {self.path}: .rodata is {len(rodata)} bytes", 22)
        ctypes.memmove(rodata, ctypes.byref(self.config), want)
        for prog in obj.programs():
            if prog.name in disabled:
                prog.set_autoload(False)
            elif prog.name in RETARGETED and prog.section.startswith(TRAMPOLINE_SECTIONS):
                assert self.high_handler is not None
                prog.set_attach_target(self.high_handler)
        return obj

    def _load(self, disabled: set[str]) -> BpfObject:
        every = {p for ladder in LADDERS.values() for _, progs in ladder for p in progs}
        for name in disabled:
            self.attached.refused_at_load[name] = "switched off by the caller"
        self.high_handler = kernel_function(HIGH_HANDLERS)
        tracefs = system.tracefs_events_dir()
        if tracefs is not None:
            remove_stale_kprobe_events(tracefs)
        if self.high_handler is None:
            for name in RETARGETED:
                self.attached.refused_at_load[name] = "no memory.high handler in kallsyms"
                disabled.add(name)
        while True:
            obj = self._open(disabled)
            sections = {p.name: p.section for p in obj.programs()}
            try:
                obj.load()
                return obj
            except BpfError as exc:
                log = lib().take_log()
                obj.close()
                culprit = next(
                    (
                        m.group(1)
                        for line in log
                        if (m := _FAILED_PROG.search(line))
                        and m.group(1) in every
                        and m.group(1) not in disabled
                    ),
                    None,
                )
                if culprit is None:
                    tail = "\n    ".join(log[-12:])
                    raise BpfError(
                        exc.step, exc.errno, (exc.fix or "") + ("\n  libbpf said:\n    " + tail)
                    ) from exc
                reason = next((ln for ln in log if f"'{culprit}'" in ln), str(exc))
                reason = reason.removeprefix("libbpf: ")
                victims = {culprit}
                if exc.errno == errno.EPERM and sections[culprit].startswith(TRAMPOLINE_SECTIONS):
                    # The kernel refuses BPF trampolines altogether: one reload, not one per
                    # fentry/fexit program.
                    victims = {
                        n for n, sec in sections.items() if sec.startswith(TRAMPOLINE_SECTIONS)
                    }
                for name in victims - disabled:
                    self.attached.refused_at_load[name] = (
                        reason
                        if name == culprit
                        else "this kernel refuses BPF trampolines (fentry/fexit): EPERM"
                    )
                disabled |= victims

    # -- attaching --------------------------------------------------------------------------

    def attach(self) -> Attached:
        for hook, ladder in LADDERS.items():
            self.attached.rungs[hook] = None
            for rung, names in ladder:
                refused = [n for n in names if n in self.attached.refused_at_load]
                if refused:
                    self.attached.failures.setdefault(hook, []).append(
                        f"{rung}: refused at load ({self.attached.refused_at_load[refused[0]]})"
                    )
                    continue
                links: list[Link] = []
                try:
                    for name in names:
                        target = (
                            self.high_handler if name in ("high_kprobe", "high_kretprobe") else None
                        )
                        links.append(self._attach(name, target))
                except BpfError as exc:
                    for link in links:
                        link.destroy()
                    self.attached.failures.setdefault(hook, []).append(f"{rung}: {exc.message}")
                    continue
                self._links.extend(links)
                self.attached.rungs[hook] = rung
                break
        for hook in REQUIRED:
            if self.attached.rungs[hook] is None:
                self.close()
                raise KernelUnsupported(
                    f"no rung of the {hook} hook attached: "
                    + "; ".join(self.attached.failures.get(hook, [])),
                    "check `whyrestart doctor`: the kernel needs BTF and tracepoints",
                )
        return self.attached

    def _attach(self, name: str, target: str | None) -> Link:
        prog = self.obj.program(name)
        if not prog.section.startswith("kretprobe"):
            return prog.attach(target)
        # a kretprobe: through a tracefs event with room for many callers in flight, else
        # libbpf's own attach with the kernel's default (see KRETPROBE_MAXACTIVE)
        function = target or prog.section.partition("/")[2]
        tracefs = system.tracefs_events_dir()
        if tracefs is not None:
            try:
                return attach_kretprobe_maxactive(prog, function, tracefs)
            except BpfError as exc:
                self.attached.degraded[name] = f"default maxactive: {exc.message}"
        else:
            self.attached.degraded[name] = "default maxactive: tracefs is not mounted"
        return prog.attach(target)

    # -- maps -------------------------------------------------------------------------------

    def is_helper(self, pid: int) -> bool:
        return pid == self.config.self_tgid or self.obj.map("helpers").lookup(
            ctypes.c_uint32(pid), ctypes.c_uint8()
        )

    def watch_pid(self, pid: int, proc_root: str = "/proc", *, command: bool = False) -> bool:
        """Watch a process, and tell the kernel its threads running now (a signal or OOM that a
        classic tracepoint names by thread id finds its process through watched_threads).

        The recorder itself and the helpers its threads forked since the object was loaded are
        never watched (False), except the command it was asked to record (``command``): forked
        by the recorder, it starts out a helper."""
        if command:
            self.obj.map("helpers").delete(ctypes.c_uint32(pid))
        elif self.is_helper(pid):
            return False
        self.watched_pids.update(ctypes.c_uint32(pid), ctypes.c_uint8(1))
        try:
            tids = [int(t) for t in os.listdir(os.path.join(proc_root, str(pid), "task"))]
        except (OSError, ValueError):
            return True  # gone already, or not started yet (a gated child has one thread)
        threads = self.obj.map("watched_threads")
        for tid in tids:
            if tid != pid:
                threads.update(ctypes.c_uint32(tid), ctypes.c_uint32(pid))
        return True

    def follow_path(self, path: str) -> None:
        """Watch any cgroup later created at this path, from the kernel (see handle_mkdir)."""
        self.obj.map("follow_paths").update(
            ctypes.c_uint64(fnv1a64(path.encode())), ctypes.c_uint8(1)
        )

    def supervisor_names(self, names: Iterable[str]) -> None:
        """The process supervisors' names (comm, as the kernel truncates it): under the agent's
        filter the clean exits and execs of their direct children are sent (starts_unit in the
        C file), so a program they restart is seen restarting."""
        comms = self.obj.map("supervisor_comms")
        for name in names:
            key = ctypes.create_string_buffer(name.encode()[:15], 16)  # (zero-padded)
            comms.update(key, ctypes.c_uint8(1))

    def watch_cgroup(self, cgroup_id: int) -> bool:
        """Watch a cgroup and everything below it. False when it is not watched: the table is
        full (counted: ``watched_cgroups_refused``), or the cgroup is gone already (its rmdir
        passed before this insert, which would otherwise stay in the table for good)."""
        key = ctypes.c_uint64(cgroup_id)
        try:
            self.watched_cgroups.update(key, ctypes.c_uint8(1))
        except BpfError as exc:
            if exc.errno != errno.E2BIG:
                raise
            self._cgroups_refused += 1
            return False
        if self.cgroups_gone.lookup(key, ctypes.c_uint8()):
            self.watched_cgroups.delete(key)
            return False
        return True

    def watched_cgroups_refused(self) -> int:
        """Cgroups that found watched_cgroups full, here and in the kernel (handle_mkdir)."""
        return self._cgroups_refused + self.pressure_counters.percpu_sum_u64(2)

    def lost_count(self) -> int:
        return self.lost.percpu_sum_u64(0)

    def signals_unsent(self) -> dict[str, int]:
        """Signal name -> signals to watched processes the kernel counted instead of sending
        (handled or ignored ones that can neither end a process nor explain its end; see
        signals_unsent in the C file), running totals since load ("SIG0": out of range)."""
        out: dict[str, int] = {}
        for sig in range(layout.SIG_SLOTS):
            n = self.signals_unsent_map.percpu_sum_u64(sig)
            if n:
                out[signal_name(sig)] = n
        return out

    def drain_reclaim(self) -> list[tuple[int, int, layout.WrReclaimStats]]:
        """The stalls per (cgroup, kind) since the last call: [(cgroup id, kind, stats)].

        The kernel's totals only grow (see reclaim_stats in the C file): the differences from
        the last reading are the news, and no stall ending during a drain is lost. max_ns is
        the longest since the last drain (reclaim_max, taken and deleted). An entry idle for
        RECLAIM_IDLE_DRAINS drains is retired, so a churn of cgroups cannot fill the table."""
        out = []
        seen = set()
        for key, cur in self.reclaim_stats.items(layout.WrReclaimKey, layout.WrReclaimStats):
            ident = (int(key.cgroup_id), int(key.kind))
            if ident in seen:  # (a listing that races an insert may repeat a key)
                continue
            seen.add(ident)
            last, idle = self._reclaim_seen.get(ident, (None, 0))
            news = layout.WrReclaimStats(
                count=cur.count - (last.count if last else 0),
                total_ns=cur.total_ns - (last.total_ns if last else 0),
                reclaimed_pages=cur.reclaimed_pages - (last.reclaimed_pages if last else 0),
            )
            if news.count:
                # (a stall that ended after the totals were read leaves its max for the next
                # drain, with its count: taken only where a stall was counted)
                longest = ctypes.c_uint64(0)
                self.reclaim_max.pop(key, longest)
                news.max_ns = longest.value
                self._reclaim_seen[ident] = (cur, 0)
                out.append((ident[0], ident[1], news))
            elif idle + 1 >= RECLAIM_IDLE_DRAINS:
                self.reclaim_stats.delete(key)
                del self._reclaim_seen[ident]
            else:
                self._reclaim_seen[ident] = (cur, idle + 1)
        return out

    def clean_exit_counts(self) -> dict[int, int]:
        """cgroup id -> clean exits the agent filter counted there instead of sending them
        (running totals: the caller takes deltas; an entry the LRU dropped starts again)."""
        items = self.clean_exits.items(layout.CgroupKey, ctypes.c_uint64)
        return {int(key.id): int(value.value) for key, value in items}

    def kswapd_wakeups(self) -> int:
        return self.pressure_counters.percpu_sum_u64(0)

    def reclaim_table_full(self) -> int:
        return self.pressure_counters.percpu_sum_u64(1)

    def close(self) -> None:
        for link in self._links:
            link.destroy()
        self._links.clear()
        self.obj.close()
