"""A recording session: load and attach the BPF side, watch the targets, run the command, and
stream every event, in time order, into the trace file and the live analysis.

Data flow (one line per stage):
  ring buffer -> decode -> + kernel-log OOM reports -> + cgroup names -> reorder window
  -> trace writer and Analyzer (the very events written are the ones analysed, so replaying
  the file gives the same verdicts).

The ring buffer is drained on a 10 ms timer (records are submitted without wake-ups, except
OOM kills), which keeps the tracer's cost low under exit storms (DESIGN.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from tracer import __version__, selfguard
from tracer.analysis.verdicts import Analyzer, Restart, Verdict
from tracer.bpf import hooks, layout
from tracer.bpf.decode import Decoder
from tracer.bpf.libbpf import RingBuffer
from tracer.clock import boottime_ns
from tracer.errors import KernelUnsupported, OutputError, PermissionProblem, UsageError
from tracer.events import (
    CgroupMkdir,
    CgroupSample,
    EffectiveLimit,
    Event,
    Exec,
    Exit,
    Fork,
    GpuAllocFailure,
    GpuOomRecovered,
    KmsgOom,
    Lost,
    OomKill,
    ReclaimStall,
    ReclaimSummary,
    Signal,
)
from tracer.follow import Follower, ProbeSetup
from tracer.gpu.side import GpuSide
from tracer.merge import Reorder
from tracer.parse.kmsg import OomAssembler
from tracer.sources import system
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver, parse_proc_cgroup
from tracer.sources.kmsg import KmsgReader, monotonic_to_boottime_offset_ns, record_ts_ns
from tracer.sources.samplers import DEFAULT_INTERVAL_NS, SamplerSet
from tracer.spawn import GatedChild
from tracer.trace.format import SCHEMA_VERSION, TraceFooter, TraceHeader
from tracer.trace.writer import TraceWriter

POLL_MS = 10
MAX_KNOWN_PIDS = 65536
# Reclaim aggregates are read from the kernel this often (one summary per cgroup and kind).
RECLAIM_DRAIN_NS = 1_000_000_000
DEFAULT_STALL_THRESHOLD_NS = 10_000_000
# After the command exits: time for the kernel log and the last records to arrive.
GRACE_S = 0.2
FINAL_DRAIN_S = 2.0
TRIM_S = 60.0  # how often freed heap is handed back to the kernel (selfguard.trim_heap)


@dataclass
class Targets:
    pids: list[int] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    all: bool = False
    command: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    probes: ProbeSetup | None = None
    supervisor_pids: list[int] = field(default_factory=list)
    redact: bool = False  # keep command lines out of the trace

    def describe(self) -> dict[str, Any]:
        return {
            "pids": self.pids,
            "cgroups": self.cgroups,
            "all": self.all,
            "command": ["[redacted]"] if self.redact and self.command else self.command,
            "containers": self.containers,
            "probes": [s.text for s in self.probes.specs] if self.probes else [],
            "supervisor_pids": self.supervisor_pids,
        }


@dataclass
class RecordResult:
    path: str | None
    header: TraceHeader
    verdicts: list[Verdict]
    restarts: list[Restart]
    restart_counts: list[tuple[str, int, int | None, str]]
    counts: dict[str, int]
    lost: int
    warnings: list[str]
    reason: str
    command_status: int | None  # the command's exit status as a shell reports it


def memory_hierarchy_id(cg_layout: CgroupLayout, proc_root: str = "/proc") -> int:
    """The id of the hierarchy cgroup ids come from: v1 memory's (the number before ":memory:"
    in /proc/self/cgroup), or 0 for cgroup v2."""
    if cg_layout.memory_version != 1:
        return 0
    try:
        with open(os.path.join(proc_root, "self", "cgroup")) as f:
            for line in parse_proc_cgroup(f.read()):
                if "memory" in line.controllers:
                    return line.hierarchy_id
    except OSError:
        pass
    return 0


def preflight() -> None:
    """The checks without which recording cannot work, each with its fix."""
    if os.geteuid() != 0:
        raise PermissionProblem(
            "recording needs root: BPF programs are loaded into the kernel",
            "run it with sudo (replaying a trace does not need root)",
        )
    if not os.path.exists(system.BTF_PATH):
        raise KernelUnsupported(
            f"this kernel has no BTF ({system.BTF_PATH} is missing)",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default on Debian, Ubuntu, "
            "Fedora and RHEL since 2021)",
        )
    if not os.path.exists(hooks.object_path()):
        raise KernelUnsupported(
            f"the BPF object {hooks.object_path()} is not built",
            "run scripts/setup (or: make -C bpf)",
        )


def _check_output(path: str, overwrite: bool) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise OutputError(
            f"cannot write {path}: directory {d} does not exist",
            "create it or choose another -o path",
        )
    if not os.access(d, os.W_OK):
        raise OutputError(f"cannot write {path}: {d} is not writable", "choose a writable -o path")
    if os.path.isdir(path):
        raise OutputError(f"cannot write {path}: it is a directory", "name a file with -o")
    if os.path.lexists(path) and not overwrite:
        raise OutputError(
            f"cannot write {path}: it exists", "choose another -o path, or replace it with --force"
        )


class _StopFlag:
    def __init__(self) -> None:
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


class Recorder:
    def __init__(
        self,
        output: str | None,
        targets: Targets,
        *,
        duration: float | None = None,
        status: Callable[[str, bool], None] | None = None,
        on_event: Callable[[Event | None, list[Verdict]], None] | None = None,
        stall_threshold_ns: int = DEFAULT_STALL_THRESHOLD_NS,
        sample_interval_ns: int = DEFAULT_INTERVAL_NS,
        overwrite: bool = False,
    ) -> None:
        self.overwrite = overwrite
        self._guard: selfguard.Guard | None = None
        self.sample_interval_ns = sample_interval_ns
        self.stall_threshold_ns = stall_threshold_ns
        self.output = output
        self.targets = targets
        self.duration = duration
        self.status = status
        self.on_event = on_event
        self.header: TraceHeader | None = None
        self._counts: Counter[str] = Counter()
        self.stop = _StopFlag()
        self.warnings: list[str] = []
        # (a live tail reads every verdict; otherwise only the kept ones are built)
        # (built from what the header's targets will say: a replay builds the same one)
        self.analyzer = Analyzer.from_header(targets.describe(), every_verdict=on_event is not None)
        self._named: set[int] = {0}
        # pids seen in the watched set (dict: insertion order, trimmed oldest-first); exited ones
        # stay a while because their kernel-log OOM report can arrive after the exit
        self._known_pids: dict[int, None] = {}
        self._sampled_ids: set[int] = set()
        self._pids_alive: set[int] = set(targets.pids)
        self._watched_cgroup_paths: list[str] = []
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._kswapd_seen = 0
        self._last_drain_ns = 0
        self._reclaim_full_warned = False

    # -- set-up -----------------------------------------------------------------------------

    def _validate(self, resolver: CgroupResolver) -> list[int]:
        for pid in self.targets.pids:
            if not psutil.pid_exists(pid):
                raise UsageError(f"no process with pid {pid}", "check the pid with ps")
        ids = []
        for path in self.targets.cgroups:
            ids.append(resolver.id_of(path))
            self._watched_cgroup_paths.append(path.rstrip("/") or "/")
        t = self.targets
        if t.command:
            exe = t.command[0] if "/" in t.command[0] else shutil.which(t.command[0])
            if exe is None or not os.access(exe, os.X_OK):
                raise UsageError(
                    f"cannot run {t.command[0]}: command not found or not executable",
                    "check the command and its PATH",
                )
        if not (t.pids or t.cgroups or t.all or t.command or t.containers):
            raise UsageError(
                "nothing to record",
                "give a command after --, or --pid, --cgroup, --container or --all",
            )
        return ids

    def _seed_pid(self, probe: hooks.Probe, pid: int) -> None:
        probe.watch_pid(pid)
        self._know(pid)
        try:
            for child in psutil.Process(pid).children(recursive=True):
                probe.watch_pid(child.pid)
                self._know(child.pid)
        except psutil.Error:
            pass

    def _start_command(self, probe: hooks.Probe) -> GatedChild:
        child = GatedChild(
            self.targets.command, before_exec=self._guard.reset_in_child if self._guard else None
        )
        probe.watch_pid(child.pid)
        self._know(child.pid)
        child.release()
        return child

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> RecordResult:
        preflight()
        with selfguard.guarded() as guard:
            self._guard = guard
            return self._run_guarded()

    def _run_guarded(self) -> RecordResult:
        if self.output is not None:
            _check_output(self.output, self.overwrite)
        system.ensure_tracefs()
        cg_layout = CgroupLayout.from_system()
        resolver = CgroupResolver(cg_layout)
        self.follower = Follower(self.targets.containers, self.targets.probes, resolver.path_of)
        for path in self.follower.initial_cgroups():
            self.targets.cgroups.append(path)
        cgroup_ids = self._validate(resolver)
        config = layout.WrConfig(
            filter_all=int(self.targets.all),
            memcg_v1=int(cg_layout.memory_version == 1),
            self_tgid=os.getpid(),
            watch_cgroups=int(bool(cgroup_ids) or self.follower.following),
            stall_threshold_ns=self.stall_threshold_ns,
            follow_cgroups=int(self.follower.following),
            hierarchy_id=memory_hierarchy_id(cg_layout),
        )
        probe = hooks.Probe(config)
        try:
            return self._run(probe, resolver, cg_layout, cgroup_ids)
        finally:
            probe.close()

    def _kmsg(self) -> KmsgReader | None:
        try:
            return KmsgReader()
        except Exception as exc:
            self.warnings.append(f"kernel log unavailable ({exc}): OOM reports come from BPF only")
            return None

    def _run(
        self,
        probe: hooks.Probe,
        resolver: CgroupResolver,
        cg_layout: CgroupLayout,
        cgroup_ids: list[int],
    ) -> RecordResult:
        attached = probe.attach()
        for hook, rung in attached.rungs.items():
            if rung is None and hook not in hooks.ENRICHING:
                self.warnings.append(
                    f"hook {hook} did not attach: " + "; ".join(attached.failures.get(hook, []))
                )
        rungs: dict[str, str | None] = dict(attached.rungs)
        kmsg = self._kmsg()
        if rungs.get("oom") is None and kmsg is not None:
            rungs["oom"] = "kmsg"
        if rungs.get("memory_high") is None and cg_layout.memory_version == 2:
            rungs["memory_high"] = "cgroupfs"  # memory.events "high" deltas + memory.pressure
        for cid in cgroup_ids:
            probe.watch_cgroup(cid)
        for path in self.targets.cgroups:
            for pid in resolver.procs(path):
                self._seed_pid(probe, pid)
        for pid in self.targets.pids:
            self._seed_pid(probe, pid)

        samplers = SamplerSet(cg_layout, resolver, interval_ns=self.sample_interval_ns)
        for path in self.targets.cgroups:
            samplers.watch_cgroup(path)
        for pid in self._known_pids:
            samplers.watch_pid(pid)
        # GPU evidence (tracer/gpu/side.py): its own BPF object and NVML, never fatal.
        gpu = GpuSide(filter_all=self.targets.all, memcg_v1=cg_layout.memory_version == 1)
        gpu.watch(self._known_pids)
        rungs["gpu_alloc"] = gpu.rung
        for path in self.follower.follow_paths():
            probe.follow_path(path)
        self.follower.start()
        rb = RingBuffer(probe.events)
        decoder = Decoder(page_size=os.sysconf("SC_PAGE_SIZE"))
        assembler = OomAssembler()
        kmsg_offset = monotonic_to_boottime_offset_ns()
        start_ns = boottime_ns()
        header = TraceHeader(
            schema=SCHEMA_VERSION,
            tool_version=__version__,
            host=platform.node(),
            kernel=platform.release(),
            cgroup=dataclasses.asdict(cg_layout),
            clock_offset_ns=time.time_ns() - start_ns,
            hooks=rungs,
            targets=self.targets.describe(),
            started_ns=start_ns,
            extra={
                "hook_failures": attached.failures,
                "page_size": decoder.page_size,
                "libbpf": system.libbpf_version(),
                "self_protection": self._guard.applied if self._guard else {},
                "gpu": gpu.describe(),
            },
        )
        self.header = header
        writer = (
            TraceWriter.open(self.output, header, overwrite=self.overwrite)
            if self.output is not None
            else None
        )
        reorder = Reorder()
        lost_seen = 0
        selfguard.trim_heap()  # libbpf's parse of the kernel BTF is freed by now
        child: GatedChild | None = None
        prev_handlers = self._install_signal_handlers()
        started = time.monotonic()
        next_status = started
        grace_until: float | None = None
        next_flush = time.monotonic() + 1.0
        next_trim = time.monotonic() + TRIM_S
        next_reclaim_ns = start_ns + RECLAIM_DRAIN_NS
        self._last_drain_ns = start_ns
        try:
            if self.targets.command:
                child = self._start_command(probe)
                samplers.watch_pid(child.pid)
                gpu.watch([child.pid])
            behind = False
            while True:
                events = decoder.decode_batch(rb.drain(0 if behind else POLL_MS))
                # A full batch: the ring holds more, older than anything stamped "now". Until
                # it is caught up, only ring records flow (the kernel log, samples and counters
                # wait; they would overtake the backlog and break the trace's time order).
                behind = rb.full
                now_ns = boottime_ns()
                if not behind:
                    if kmsg is not None:
                        for rec in kmsg.read_available():
                            rec_ts = record_ts_ns(rec, kmsg_offset)
                            events.extend(
                                k for k in assembler.feed(rec, rec_ts) if self._wants_kmsg(k)
                            )
                            events.extend(gpu.from_kmsg(rec, rec_ts))
                    events.extend(gpu.poll(now_ns))
                    if now_ns >= next_reclaim_ns:
                        events.extend(self._reclaim_summaries(probe, now_ns))
                        next_reclaim_ns = now_ns + RECLAIM_DRAIN_NS
                    lost = probe.lost_count()
                    if lost > lost_seen:
                        events.append(Lost(ts=now_ns, count=lost - lost_seen))
                        lost_seen = lost
                self._track(events, samplers, resolver)
                gpu.track(events)
                events.extend(self._follow(events, probe, samplers, resolver, poll=not behind))
                if not behind:
                    events.extend(samplers.due(now_ns))
                reorder.push(self._name_cgroups(events, resolver))
                self._emit(reorder.pop_ready(None if behind else now_ns), writer)

                now = time.monotonic()
                if writer is not None and now >= next_flush:
                    # a quiet recording still reaches the disk within a second (tail -f, crashes)
                    writer.flush()
                    next_flush = now + 1.0
                if now >= next_trim:
                    selfguard.trim_heap()
                    next_trim = now + TRIM_S
                if self.status and now >= next_status:
                    self.status(self._status_line(now - started, writer, lost_seen), False)
                    next_status = now + 0.5
                if grace_until is None:
                    reason = self._should_stop(child, now - started)
                    if reason:
                        self.stop.set(reason)
                        grace_until = now + GRACE_S
                elif now >= grace_until:
                    break
            # final drain: whatever is still in flight (a flood that goes on is cut after
            # FINAL_DRAIN_S; what it leaves in the ring is not in the trace, and not lost)
            drain_until = time.monotonic() + FINAL_DRAIN_S
            while True:
                events = decoder.decode_batch(rb.drain(0))
                if not rb.full or time.monotonic() >= drain_until:
                    break
                self._track(events, samplers, resolver)
                reorder.push(self._name_cgroups(events, resolver))
                self._emit(reorder.pop_ready(None), writer)
            events.extend(gpu.poll(boottime_ns(), final=True))
            self._track(events, samplers, resolver)
            events.extend(self._reclaim_summaries(probe, boottime_ns()))
            reorder.push(self._name_cgroups(events, resolver))
            self._emit(reorder.flush(), writer)
            lost = probe.lost_count()
            if lost > lost_seen:
                ev = Lost(ts=boottime_ns(), count=lost - lost_seen)
                self._emit([ev], writer)
                lost_seen = lost
        except BaseException as exc:
            # Whatever went wrong, what was recorded stays replayable and says why it ended.
            if writer is not None and not writer.closed:
                reason = (
                    f"failed: {exc}" if not isinstance(exc, KeyboardInterrupt) else ("interrupted")
                )
                with contextlib.suppress(Exception):
                    writer.close(
                        TraceFooter(
                            ended_ns=boottime_ns(),
                            counts=dict(self._counts),
                            lost=lost_seen,
                            warnings=[*self.warnings, reason],
                            exit=reason,
                        )
                    )
            raise
        finally:
            self._restore_signal_handlers(prev_handlers)
            rb.free()
            samplers.close()
            self.follower.close()
            if kmsg is not None:
                kmsg.close()
            gpu.close()
            self.warnings.extend(gpu.warnings)
        final = self.analyzer.finish()
        if self.on_event is not None and final:
            self.on_event(None, final)
        if decoder.unknown or decoder.malformed:
            self.warnings.append(
                f"{decoder.unknown} records of unknown type and "
                f"{decoder.malformed} short records were skipped"
            )
        if reorder.late:
            self.warnings.append(f"{reorder.late} events arrived later than the reorder window")
        command_status = None
        if child is not None and child.returncode is not None:
            rc = child.returncode
            command_status = rc if rc >= 0 else 128 - rc
        footer = TraceFooter(
            ended_ns=boottime_ns(),
            counts=dict(self._counts),
            lost=lost_seen,
            warnings=list(self.warnings),
            exit=self.stop.reason or "stopped",
        )
        if writer is not None:
            writer.close(footer)
        if self.status:
            self.status(self._status_line(time.monotonic() - started, writer, lost_seen), True)
        return RecordResult(
            path=self.output,
            header=header,
            verdicts=list(self.analyzer.verdicts),
            restarts=self.analyzer.restarts,
            restart_counts=self.analyzer.restart_counts(),
            counts=dict(self._counts),
            lost=lost_seen,
            warnings=list(self.warnings),
            reason=self.stop.reason or "stopped",
            command_status=command_status,
        )

    def _reclaim_summaries(self, probe: hooks.Probe, now_ns: int) -> list[Event]:
        interval = now_ns - self._last_drain_ns
        self._last_drain_ns = now_ns
        out: list[Event] = []
        for cgroup_id, kind, st in sorted(probe.drain_reclaim(), key=lambda x: (x[0], x[1])):
            out.append(
                ReclaimSummary(
                    ts=now_ns,
                    cgroup_id=cgroup_id,
                    kind=layout.STALL_KINDS.get(kind, str(kind)),
                    count=st.count,
                    total_ns=st.total_ns,
                    max_ns=st.max_ns,
                    reclaimed_bytes=st.reclaimed_pages * self._page_size,
                    interval_ns=interval,
                )
            )
        wakeups = probe.kswapd_wakeups()
        if wakeups > self._kswapd_seen:
            out.append(
                ReclaimSummary(
                    ts=now_ns,
                    cgroup_id=0,
                    kind="kswapd",
                    count=wakeups - self._kswapd_seen,
                    total_ns=0,
                    max_ns=0,
                    reclaimed_bytes=0,
                    interval_ns=interval,
                )
            )
            self._kswapd_seen = wakeups
        full = probe.reclaim_table_full()
        if full and not self._reclaim_full_warned:
            self._reclaim_full_warned = True
            self.warnings.append(
                f"reclaim aggregation table full: {full} stalls were not counted in summaries"
            )
        return out

    def _should_stop(self, child: GatedChild | None, elapsed: float) -> str | None:
        if self.stop.reason:
            return self.stop.reason
        if child is not None and child.poll() is not None:
            return "command exited"
        if self.duration is not None and elapsed >= self.duration:
            return "duration reached"
        if (
            child is None
            and self.targets.pids
            and not self.targets.all
            and not self.targets.cgroups
            and not self._pids_alive
        ):
            return "watched processes exited"
        return None

    def _emit(self, events: Sequence[Event], writer: TraceWriter | None) -> None:
        if not events:
            return
        if writer is not None:
            writer.write_many(events)
        counts = self._counts
        for ev in events:
            counts[ev.KIND] += 1
        if self.on_event is None:
            self.analyzer.feed_many(events)  # (kept verdicts: the end-of-run table reads them)
            return
        for ev in events:
            self.on_event(ev, self.analyzer.feed(ev))

    def _track(
        self, events: Sequence[Event], samplers: SamplerSet, resolver: CgroupResolver
    ) -> None:
        """Follow the watched set: which pids and cgroups the samplers read.

        Under --all, processes are not sampled one by one (every process forked on the host,
        ten times a second, would cost more than the rest of the recorder, and verdicts do not
        use them): the cgroups they run in are."""
        every = self.targets.all
        for ev in events:
            if isinstance(ev, Exit):
                # the exit event, not the pid's absence: a zombie nobody reaps still "exists"
                self._pids_alive.discard(ev.pid)
                samplers.unwatch_pid(ev.pid)
            elif isinstance(ev, Fork):
                if not every:
                    self._know(ev.child_pid)
                    samplers.watch_pid(ev.child_pid)
            elif isinstance(ev, Exec):
                if not every:
                    self._know(ev.pid)
                    samplers.watch_pid(ev.pid)
                self._sample_cgroup(ev.cgroup_id, samplers, resolver)
            elif isinstance(ev, OomKill) and ev.limit_cgroup_id:
                self._sample_cgroup(ev.limit_cgroup_id, samplers, resolver)

    def _follow(
        self,
        events: list[Event],
        probe: hooks.Probe,
        samplers: SamplerSet,
        resolver: CgroupResolver,
        poll: bool = True,
    ) -> list[Event]:
        extra, watch = self.follower.on_events(events)
        for cid in watch:
            probe.watch_cgroup(cid)
            self._sample_cgroup(cid, samplers, resolver)
        return extra + self.follower.poll() if poll else extra

    def _sample_cgroup(
        self, cgroup_id: int, samplers: SamplerSet, resolver: CgroupResolver
    ) -> None:
        if cgroup_id in self._sampled_ids:
            return
        self._sampled_ids.add(cgroup_id)
        path = resolver.path_of(cgroup_id)
        if path is not None:
            with contextlib.suppress(UsageError):  # gone already: nothing to sample
                samplers.watch_cgroup(path)

    def _know(self, pid: int) -> None:
        self._known_pids[pid] = None
        if len(self._known_pids) > MAX_KNOWN_PIDS:
            for old in list(self._known_pids)[: MAX_KNOWN_PIDS // 2]:
                del self._known_pids[old]

    def _wants_kmsg(self, k: KmsgOom) -> bool:
        if self.targets.all or k.victim_pid in self._known_pids:
            return True
        return any(
            k.task_memcg == p or k.task_memcg.startswith(p.rstrip("/") + "/")
            for p in self._watched_cgroup_paths
        )

    def _name_cgroups(self, events: list[Event], resolver: CgroupResolver) -> list[Event]:
        """Prefix each event whose cgroup ids are new with their CgroupInfo records."""
        out: list[Event] = []
        for ev in events:
            for cid in _cgroup_ids(ev):
                if cid not in self._named:
                    self._named.add(cid)
                    info = resolver.info(cid, ev.ts)
                    if info is not None:
                        out.append(info)
                        unit = self.follower.name(cid, info.path, ev.ts)
                        if unit is not None:
                            out.append(unit)
            out.append(ev)
        return out

    def _status_line(self, elapsed: float, writer: TraceWriter | None, lost: int) -> str:
        n = sum(self._counts.values())
        if writer is None:
            return f"tailing {elapsed:6.1f}s  events {n}  lost {lost}"
        size = writer.bytes_written
        return (
            f"recording {elapsed:6.1f}s  events {n}  lost {lost}  "
            f"{self.output} {size / 1024:.1f} KiB"
        )

    # -- signals ----------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        prev: dict[int, Any] = {}

        def handler(signum: int, _frame: object) -> None:
            self.stop.set(f"interrupted by {signal.Signals(signum).name}")

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            # not the main thread (tests): the caller stops us instead
            with contextlib.suppress(ValueError):
                prev[sig] = signal.signal(sig, handler)
        return prev

    @staticmethod
    def _restore_signal_handlers(prev: dict[int, Any]) -> None:
        for sig, h in prev.items():
            signal.signal(sig, h)


def _cgroup_ids(ev: Event) -> tuple[int, ...]:
    if isinstance(ev, Exit | Fork | Exec | GpuAllocFailure | GpuOomRecovered):
        return (ev.cgroup_id,)
    if isinstance(ev, Signal):
        return (ev.sender_cgroup_id,)
    if isinstance(ev, OomKill):
        return (ev.victim_cgroup_id, ev.limit_cgroup_id)
    if isinstance(ev, ReclaimStall):
        return (ev.cgroup_id, ev.task_cgroup_id)
    if isinstance(ev, ReclaimSummary | CgroupSample | EffectiveLimit | CgroupMkdir):
        return (ev.cgroup_id,)
    return ()


__all__ = ["RecordResult", "Recorder", "Targets", "preflight"]
