"""A recording session: load and attach the BPF side, watch the targets, run the command, and
stream every event, in time order, into the trace file and the live analysis.

The flow is `tracer.pipeline`'s; this module assembles it for a recording:
  sources: ring buffer, kernel log, GPU side, kernel counters, followed containers (restart
    counts, probes), any extra source (repro's liveness prober), samplers
  -> enrichment: the watched set, GPU tracking, container following, cgroup names
  -> reorder window -> sinks: trace writer, Analyzer (the very events written are the ones
  analysed, so replaying the file gives the same verdicts).

The ring buffer is drained on a 10 ms timer (records are submitted without wake-ups, except
OOM kills), which keeps the tracer's cost low under exit storms (ARCHITECTURE.md,
"Wake-ups cost").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from tracer import __version__, selfguard
from tracer.analysis.analyzer import Analyzer, Restart, Verdict
from tracer.analysis.senders import PROCESS_SUPERVISORS
from tracer.bpf import hooks, layout
from tracer.clock import boottime_ns, realtime_offset_ns
from tracer.errors import KernelUnsupported, OutputError, PermissionProblem, UsageError
from tracer.events import Event
from tracer.gpu.side import GpuSide
from tracer.parse.cgroup import parse_proc_cgroup
from tracer.pipeline.assembly import INTERACTIVE, Profile, assemble
from tracer.pipeline.core import Pipeline, Sink, Source, header_parts
from tracer.pipeline.enrich import CgroupNamer, WatchSet
from tracer.pipeline.follow import Follower, ProbeSetup
from tracer.pipeline.sinks import AnalyzerSink, TraceSink
from tracer.pipeline.sources import (
    KernelCounters,
)
from tracer.sources import system
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver
from tracer.spawn import STOP_GRACE_S, STOP_SIGNALS, GatedChild
from tracer.trace.format import SCHEMA_VERSION, TraceFooter, TraceHeader
from tracer.trace.writer import TraceWriter

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
    units: list[str] = field(default_factory=list)  # systemd units, followed like containers
    probes: ProbeSetup | None = None
    supervisor_pids: list[int] = field(default_factory=list)
    redact: bool = False  # keep command lines out of the trace
    # a supervisor's kill after this many failed probes in a row is a probe kill (the analysis
    # reads it from the header: a replay judges alike)
    probe_failures: int = 3
    # a Kubernetes node's CRI socket (--runtime-endpoint); None: tracer.runtimes.cri's default
    runtime_endpoint: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "pids": self.pids,
            "cgroups": self.cgroups,
            "all": self.all,
            "command": ["[redacted]"] if self.redact and self.command else self.command,
            "containers": self.containers,
            "units": self.units,
            "probes": [s.text for s in self.probes.specs] if self.probes else [],
            "supervisor_pids": self.supervisor_pids,
            "probe_failure_threshold": self.probe_failures,
        }


# the stop reason (the start of RecordResult.reason) when --duration ended the recording
DURATION_REACHED = "duration reached"


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
    stop_signal: int | None = None  # the signal that stopped the recording, if one did

    @property
    def exit_code(self) -> int:
        """What record and tail exit with (tracer/spawn.py: the lifecycle policy): the
        command's status; without one, 128+N when signal N stopped the recording, else 0."""
        if self.command_status is not None:
            return self.command_status
        return 128 + self.stop_signal if self.stop_signal is not None else 0


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
    too_old = system.kernel_too_old(system.kernel_release())
    if too_old:
        raise KernelUnsupported(too_old, system.KERNEL_FIX)
    pid_ns = system.pid_namespace_problem()
    if pid_ns:
        raise UsageError(pid_ns, system.PID_NS_FIX)
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
        self.signal: int | None = None  # the first signal that stopped the recording
        self.signals = 0  # how many came (a second one kills the command at once)

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def by_signal(self, signum: int) -> None:
        self.signals += 1
        if self.signal is None:
            self.signal = signum
        self.set(f"interrupted by {signal.Signals(signum).name}")


class Recorder:
    """One recording: the pipeline (tracer.pipeline) assembled from the targets, run until the
    command exits, the duration passes or a signal arrives, then drained and closed.

    ``sources``: more sources to run beside the recorder's own (repro's liveness prober);
    ``sinks``: more sinks to hand the ordered events to (after the trace and the analyzer);
    ``on_ready``: called once, from the recording's thread, when the hooks are attached and
    every source and sink is in place, so that a record the kernel makes from then on is
    judged (the agent's readiness: its ready line, /readyz, sd_notify; tests wait on it
    rather than on sleeps). Before the command starts; not called if the set-up fails.

    It owns a recording's lifecycle end to end (checking the targets, starting the command,
    the loop, the header and footer, signals and the stop: they share one stop state); the
    pipeline is built by tracer/pipeline/assembly.py."""

    def __init__(
        self,
        output: str | None,
        targets: Targets,
        *,
        profile: Profile = INTERACTIVE,
        duration: float | None = None,
        status: Callable[[str, bool], None] | None = None,
        on_event: Callable[[Event | None, list[Verdict]], None] | None = None,
        overwrite: bool = False,
        sources: Sequence[Source] = (),
        sinks: Sequence[Sink] = (),
        reload: Callable[[], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.profile = profile
        self.on_ready = on_ready
        self.overwrite = overwrite
        # SIGHUP: with ``reload`` (the agent), call it from the loop instead of stopping
        self.reload = reload
        self.kernel: hooks.KernelHooks | None = None
        self._reload_pending = False
        self._guard: selfguard.Guard | None = None
        # the run's one cgroup resolver (the agent asks it too) and its follower: set at start
        self.resolver: CgroupResolver | None = None
        self.follower: Follower | None = None
        self.output = output
        self.targets = targets
        self.duration = duration
        self.status = status
        self.on_event = on_event
        self.extra_sources = list(sources)
        self.extra_sinks = list(sinks)
        self.header: TraceHeader | None = None
        self.stop = _StopFlag()
        self._pipeline: Pipeline | None = None
        self.warnings: list[str] = []
        # (a live tail reads every verdict; otherwise only the kept ones are built)
        # (built from what the header's targets will say: a replay builds the same one)
        # (the agent judges an OOM kill once its evidence is in: its counter follows the kill;
        # it keeps no verdicts: its sinks take each one as it comes)
        self.analyzer = Analyzer.from_header(
            targets.describe(),
            every_verdict=on_event is not None,
            early_oom=profile.agent,
            keep_verdicts=not profile.agent,
        )

    # -- set-up -----------------------------------------------------------------------------

    def _validate(self, resolver: CgroupResolver) -> list[int]:
        for pid in self.targets.pids:
            if not psutil.pid_exists(pid):
                raise UsageError(f"no process with pid {pid}", "check the pid with ps")
        ids = [resolver.id_of(path) for path in self.targets.cgroups]
        t = self.targets
        if t.command:
            exe = t.command[0] if "/" in t.command[0] else shutil.which(t.command[0])
            if exe is None or not os.access(exe, os.X_OK):
                raise UsageError(
                    f"cannot run {t.command[0]}: command not found or not executable",
                    "check the command and its PATH",
                )
        if not (t.pids or t.cgroups or t.all or t.command or t.containers or t.units):
            raise UsageError(
                "nothing to record",
                "give a command after --, or --pid, --cgroup, --container, --unit or --all",
            )
        return ids

    def _start_command(self, watch: WatchSet, gpu: GpuSide) -> GatedChild:
        child = GatedChild(
            self.targets.command, before_exec=self._guard.reset_in_child if self._guard else None
        )
        watch.watch_pid(child.pid, command=True)
        child.release()
        watch.samplers.watch_pid(child.pid)
        gpu.watch([child.pid])
        return child

    def run(self) -> RecordResult:
        preflight()
        with selfguard.guarded(apply=self.profile.self_guard) as guard:
            self._guard = guard
            return self._run_guarded()

    def _run_guarded(self) -> RecordResult:
        if self.output is not None:
            _check_output(self.output, self.overwrite)
        system.ensure_tracefs()
        cg_layout = CgroupLayout.from_system()
        resolver = self.resolver = CgroupResolver(cg_layout)
        follower = self.follower = Follower(
            self.targets.containers,
            self.targets.probes,
            resolver.path_of,
            units=self.targets.units,
            id_now=resolver.id_now,
            cri_endpoint=self.targets.runtime_endpoint,
        )
        for path in follower.initial_cgroups():
            self.targets.cgroups.append(path)
        cgroup_ids = self._validate(resolver)
        config = layout.WrConfig(
            filter_all=int(self.targets.all),
            memcg_v1=int(cg_layout.memory_version == 1),
            self_tgid=os.getpid(),
            watch_cgroups=int(bool(cgroup_ids) or follower.following),
            stall_threshold_ns=self.profile.stall_threshold_ns,
            follow_cgroups=int(follower.following),
            hierarchy_id=memory_hierarchy_id(cg_layout),
            agent_filter=int(self.profile.agent),
        )
        kernel = self.kernel = hooks.KernelHooks(config)
        try:
            if self.profile.agent:
                # (the programs a supervisor in a container restarts, seen restarting)
                kernel.supervisor_names(PROCESS_SUPERVISORS)
            return self._run(kernel, resolver, cg_layout, cgroup_ids)
        finally:
            kernel.close()

    def forget_cgroups(self, ids: Iterable[int]) -> None:
        """Forget cgroups that are gone, everywhere the run keeps something per cgroup: the
        analysis, the enrichers that name and sample each cgroup once, the follower (the
        always-on agent's sweep; a recording's cgroups are few)."""
        ids = list(ids)
        self.analyzer.forget_cgroups(ids)
        if self.follower is not None:
            self.follower.forget_cgroups(ids)
        for e in self._pipeline.enrichers if self._pipeline is not None else ():
            if isinstance(e, CgroupNamer | WatchSet):
                e.forget_cgroups(ids)

    def _run(
        self,
        kernel: hooks.KernelHooks,
        resolver: CgroupResolver,
        cg_layout: CgroupLayout,
        cgroup_ids: list[int],
    ) -> RecordResult:
        assert self.follower is not None  # (made by _run_guarded, before the hooks)
        pipeline, watch, gpu, counters = assemble(
            kernel,
            resolver,
            self.follower,
            cg_layout,
            self.targets,
            cgroup_ids,
            self.profile,
            self.extra_sources,
        )
        self._pipeline = pipeline
        try:
            header = self.header = self._header(pipeline, cg_layout)
            writer = (
                TraceWriter.open(self.output, header, overwrite=self.overwrite)
                if self.output is not None
                else None
            )
        except BaseException:
            pipeline.close_sources()
            raise
        if writer is not None:
            pipeline.sinks.append(TraceSink(writer))
        pipeline.sinks.append(AnalyzerSink(self.analyzer, self.on_event))
        pipeline.sinks += self.extra_sinks
        selfguard.trim_heap()  # libbpf's parse of the kernel BTF is freed by now
        child: GatedChild | None = None
        prev_handlers = self._install_signal_handlers()
        started = time.monotonic()
        try:
            try:
                # (the ring keeps what the kernel sends from the attach on, and the loop's
                # first step reads it: ready now, not after a first step)
                if self.on_ready is not None:
                    self.on_ready()
                if self.targets.command:
                    child = self._start_command(watch, gpu)
                self._loop(pipeline, child, watch, writer, counters, started)
                pipeline.drain(FINAL_DRAIN_S)
            finally:
                if child is not None and child.poll() is None:
                    # the recording failed: the command must not outlive it either
                    _end_now(child)
                self._restore_signal_handlers(prev_handlers)
                pipeline.close_sources()
        except BaseException as exc:
            # Whatever went wrong, what was recorded stays replayable and says why it ended.
            reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed: {exc}"
            with contextlib.suppress(Exception):
                footer = self._footer(pipeline, counters, gpu, reason, failed=True)
                pipeline.close_sinks(footer, complete=False)
            raise
        reason = self.stop.reason or "stopped"
        if child is not None and child.stop_signal is not None:
            reason += f"; the command was sent {signal.Signals(child.stop_signal).name}"
            if child.killed:
                reason += ", then SIGKILL"
        footer = self._footer(pipeline, counters, gpu, reason)
        pipeline.close_sinks(footer, complete=True)
        if self.status:
            status = self._status_line(time.monotonic() - started, pipeline, writer, counters)
            self.status(status, True)
        command_status = child.status if child is not None else None
        return RecordResult(
            path=self.output,
            header=header,
            verdicts=list(self.analyzer.verdicts),
            restarts=self.analyzer.restarts,
            restart_counts=self.analyzer.restart_counts(),
            counts=footer.counts,
            lost=footer.lost,
            warnings=list(footer.warnings),
            reason=footer.exit,
            command_status=command_status,
            stop_signal=self.stop.signal,
        )

    def _header(self, pipeline: Pipeline, cg_layout: CgroupLayout) -> TraceHeader:
        """The header: the host, the clock, the targets, and what each source adds."""
        parts = header_parts(pipeline.sources)
        return TraceHeader(
            schema=SCHEMA_VERSION,
            tool_version=__version__,
            host=platform.node(),
            kernel=system.kernel_release(),
            cgroup=dataclasses.asdict(cg_layout),
            clock_offset_ns=realtime_offset_ns(),
            hooks=parts.hooks,
            targets=self.targets.describe(),
            started_ns=boottime_ns(),
            extra={
                **parts.extra,
                "self_protection": self._guard.applied if self._guard else {},
                # (a trace of the agent's filter holds no clean exit of a unit's helpers)
                **({"agent_filter": True} if self.profile.agent else {}),
            },
        )

    def _footer(
        self,
        pipeline: Pipeline,
        counters: KernelCounters,
        gpu: GpuSide,
        reason: str,
        failed: bool = False,
    ) -> TraceFooter:
        """The footer, the one place it is built: on success, and on failure (``reason`` then
        is why the run failed; it is also its last warning)."""
        warnings = [*self.warnings, *pipeline.warnings()]
        return TraceFooter(
            ended_ns=boottime_ns(),
            counts=dict(pipeline.counts),
            lost=counters.lost,
            warnings=[*warnings, reason] if failed else warnings,
            exit=reason,
            # what holding processes for the GPU probes cost and missed (tracer/gpu/holds.py)
            extra={
                **({"gpu_holds": gpu.final_holds} if gpu.final_holds is not None else {}),
                # handled and ignored signals counted in the kernel instead of sent
                "signals_unsent": counters.signals_unsent(),
            },
        )

    def _loop(
        self,
        pipeline: Pipeline,
        child: GatedChild | None,
        watch: WatchSet,
        writer: TraceWriter | None,
        counters: KernelCounters,
        started: float,
    ) -> None:
        """Step the pipeline until a stop reason, and GRACE_S more (the kernel log and the last
        records of the end are on their way)."""
        next_status = started
        grace_until: float | None = None
        next_trim = started + TRIM_S
        while True:
            pipeline.step()
            if self._reload_pending and self.reload is not None:
                self._reload_pending = False
                self.reload()
            now = time.monotonic()
            if now >= next_trim:
                selfguard.trim_heap()
                next_trim = now + TRIM_S
            if self.status and now >= next_status:
                self.status(self._status_line(now - started, pipeline, writer, counters), False)
                next_status = now + 0.5
            if grace_until is None:
                reason = self._should_stop(child, now - started, watch)
                if reason:
                    self.stop.set(reason)
                    # the command is ended by the policy in tracer/spawn.py; recording goes on
                    # until it has ended, so its end is in the trace
                    if not self._end_command(child, now):
                        grace_until = now + GRACE_S
            elif now >= grace_until:
                return

    def _end_command(self, child: GatedChild | None, now: float) -> bool:
        """Pass the stop on to a command still running (SIGTERM at the end of --duration);
        True while it runs."""
        if child is None:
            return False
        sig = self.stop.signal or signal.SIGTERM
        return child.end(sig, now, at_once=self.stop.signals > 1)

    def _should_stop(self, child: GatedChild | None, elapsed: float, watch: WatchSet) -> str | None:
        if self.stop.reason:
            return self.stop.reason
        if child is not None and child.poll() is not None:
            return "command exited"
        if self.duration is not None and elapsed >= self.duration:
            return DURATION_REACHED
        if (
            child is None
            and self.targets.pids
            and not self.targets.all
            and not self.targets.cgroups
            and not watch.alive
        ):
            return "watched processes exited"
        return None

    def _status_line(
        self,
        elapsed: float,
        pipeline: Pipeline,
        writer: TraceWriter | None,
        counters: KernelCounters,
    ) -> str:
        n = sum(pipeline.counts.values())
        lost = counters.lost
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
            if signum == signal.SIGHUP and self.reload is not None:
                self._reload_pending = True
                return
            self.stop.by_signal(signum)

        for sig in STOP_SIGNALS:
            # not the main thread (tests): the caller stops us instead
            with contextlib.suppress(ValueError):
                prev[sig] = signal.signal(sig, handler)
        return prev

    @staticmethod
    def _restore_signal_handlers(prev: dict[int, Any]) -> None:
        for sig, h in prev.items():
            signal.signal(sig, h)


def _end_now(child: GatedChild) -> None:
    """The stop policy without a loop around it: SIGTERM, the grace period, SIGKILL."""
    deadline = time.monotonic() + STOP_GRACE_S + 1.0
    while child.end(signal.SIGTERM, time.monotonic()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child.give_back_terminal()


__all__ = ["RecordResult", "Recorder", "Targets", "preflight"]
