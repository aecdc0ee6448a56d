"""Running a `Plan`: one fresh child memory cgroup per run, the workload moved into it before
its first instruction, each run recorded to its own trace and judged from it; a stop signal
between runs ends the experiment after the run in progress."""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import signal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tracer.analysis.quantities import fmt_bytes, stall_total_ns
from tracer.errors import UsageError
from tracer.repro.compare import Comparison
from tracer.repro.judge import (
    DEGRADED,
    ERROR,
    FAILED,
    KILLED,
    SURVIVED,
    RunResult,
    deciding_verdict,
    degradation,
    judge,
)
from tracer.repro.liveness import Liveness
from tracer.repro.plan import MEMORY_HIGH, MEMORY_MAX, OPTION, PROBE_TIMEOUT, Plan, Setting

if TYPE_CHECKING:
    from tracer.pipeline.record import RecordResult
    from tracer.sources.cgroupfs import CgroupLayout

SAFETY_CAP_FRACTION = 0.8  # of MemAvailable: the cgroup limit when none is given


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_") or "x"


def in_cgroup(procs_file: str, argv: Sequence[str]) -> list[str]:
    """A command line that moves itself into a cgroup (by its ``cgroup.procs``), then execs
    ``argv`` with its standard output sent to standard error: repro's stdout is the table (or
    the JSON), which the workload's chatter must not break."""
    return ["sh", "-c", f'echo $$ > "{procs_file}" && exec "$@" >&2', "sh", *argv]


def safety_cap(meminfo: str = "/proc/meminfo") -> int:
    """80% of MemAvailable: the limit a run gets when no memory limit is given."""
    from tracer.parse.memory import parse_meminfo

    with open(meminfo, encoding="ascii") as f:
        available = parse_meminfo(f.read(), ("MemAvailable",)).get("MemAvailable")
    if available is None:
        raise UsageError("cannot read MemAvailable from /proc/meminfo", fix="give --memory-max")
    return int(available * SAFETY_CAP_FRACTION)


def default_parent(layout: CgroupLayout) -> str:
    """Where run cgroups go: under our own memory cgroup on v1; on v2 beside it, under its
    parent, because v2 forbids a cgroup with processes (ours) from also having children with
    controllers enabled ("no internal processes")."""
    from tracer.sources.cgroupfs import own_memory_cgroup

    own = own_memory_cgroup(layout=layout)
    if layout.memory_version == 2 and own != "/":
        return posixpath.dirname(own)
    return own


class Experiment:
    """Runs a `Plan`; ``progress`` gets one line per step (the CLI prints them on stderr)."""

    def __init__(
        self,
        plan: Plan,
        progress: Callable[[str], None] = lambda line: None,
        *,
        layout: CgroupLayout | None = None,
    ) -> None:
        self.plan = plan
        self.progress = progress
        self._layout = layout
        self.warnings: list[str] = []  # what a run's teardown could not do

    def run(self) -> Comparison:
        from tracer.pipeline.record import preflight
        from tracer.sources.cgroupfs import CgroupLayout

        preflight()
        layout = self._layout or CgroupLayout.from_system()
        if layout.memory_version is None:
            raise UsageError("no cgroup hierarchy with the memory controller is mounted")
        exe = self.plan.command[0]
        if ("/" in exe and not os.access(exe, os.X_OK)) or (
            "/" not in exe and shutil.which(exe) is None
        ):
            raise UsageError(
                f"cannot run {exe}: command not found or not executable",
                fix="check the command and its PATH",
            )
        parent = self.plan.parent_cgroup or default_parent(layout)
        # before anything is made: a missing parent cgroup leaves no empty directory behind
        parent_abs = (layout.memory_root or "").rstrip("/") + ("" if parent == "/" else parent)
        if not os.path.isdir(parent_abs):
            raise UsageError(
                f"--parent-cgroup {parent}: no such memory cgroup ({parent_abs})",
                fix=f"give an existing one (ls {layout.memory_root}), or leave the option out",
            )
        _make_out_dir(self.plan.out_dir)
        cap = None
        if self.plan.kind != MEMORY_MAX and self.plan.memory_max is None:
            cap = safety_cap()
            self.progress(
                f"repro: no --memory-max: each run's cgroup is capped at {fmt_bytes(cap)} "
                "(80% of the host's available memory) so that no run can exhaust the host"
            )
        comparison = Comparison(self.plan, [], int(layout.memory_version), parent)
        todo = self.plan.runs()
        # Between runs a stop signal ends the experiment after the run in progress (during a
        # run the recorder handles it: tracer/spawn.py's policy ends the workload).
        stopped: list[int] = []
        prev = _catch_stop_signals(stopped.append)
        try:
            for n, (setting, repeat) in enumerate(todo, start=1):
                if stopped:
                    break
                result = self._one(n, len(todo), setting, repeat, layout, parent, cap)
                comparison.runs.append(result)
                if result.stop_signal is not None:
                    stopped.append(result.stop_signal)
        finally:
            for sig, handler in prev.items():
                signal.signal(sig, handler)
        if stopped:
            comparison.interrupted = True
            comparison.stop_signal = stopped[0]
        comparison.warnings += self.warnings
        comparison.check_monotonic()
        return comparison

    def _limits(self, setting: Setting, cap: int | None) -> tuple[int | None, int | None]:
        """(memory.max / limit_in_bytes, memory.high) for one run."""
        if self.plan.kind == MEMORY_MAX:
            return int(setting.value), None
        limit = self.plan.memory_max if self.plan.memory_max is not None else cap
        if self.plan.kind == MEMORY_HIGH:
            return limit, int(setting.value)
        return limit, None

    def _one(
        self,
        n: int,
        total: int,
        setting: Setting,
        repeat: int,
        layout: CgroupLayout,
        parent: str,
        cap: int | None,
    ) -> RunResult:
        from tracer.pipeline.record import Recorder, Targets
        from tracer.sources.cgroupfs import ChildCgroup

        plan = self.plan
        trace = os.path.join(
            plan.out_dir,
            f"run{n:02d}-{plan.kind}-{_slug(setting.text)}"
            + (f"-{repeat}" if plan.repeats > 1 else "")
            + ".trace",
        )
        result = RunResult(run=n, setting=setting, repeat=repeat, trace=trace)
        limit, high = self._limits(setting, cap)
        what = f"{OPTION[plan.kind].lstrip('-')}={setting.text}"
        self.progress(f"repro: run {n}/{total}: {what} ... recording to {trace}")
        name = f"whyrestart-repro-{os.getpid()}-{n}"
        live: Liveness | None = None
        # drop_cache: each run reads its files itself, not finding the last run's page cache
        cg = ChildCgroup(parent, name, limit, high_bytes=high, layout=layout, drop_cache=True)
        with cg:
            procs = cg.procs_file
            if plan.probe is not None:
                timeout = setting.value if plan.kind == PROBE_TIMEOUT else plan.probe_timeout_s
                assert timeout is not None
                live = Liveness(
                    plan.probe,
                    plan.probe_interval_s,
                    float(timeout),
                    plan.probe_failures,
                    plan.probe_delay_s,
                    cg,
                )
            rec = Recorder(
                trace,
                Targets(command=in_cgroup(procs, plan.command)),
                duration=plan.duration_s,
                sources=[live.source] if live is not None else (),
            )
            try:
                rec_result = rec.run()
            finally:
                if live is not None:
                    live.stop()
            result.peak_bytes = cg.peak()
            cgroup_id = cg.cgroup_id
        if cg.drop_error is not None:
            self.warnings.append(
                f"run {n}: its page cache could not be dropped ({cg.drop_error}): the next run "
                "may find its files already cached, charged to this run's cgroup"
            )
        self._fill(result, rec_result, cgroup_id, live)
        self.progress(f"repro: run {n}/{total}: {what} -> {self._describe(result)}")
        return result

    def _fill(
        self,
        result: RunResult,
        rec: RecordResult,
        cgroup_id: int,
        live: Liveness | None,
    ) -> None:
        from tracer.analysis.analyzer import Analyzer
        from tracer.events import CgroupSample, Exec, Exit, ProbeSample, ReclaimSummary
        from tracer.pipeline.record import DURATION_REACHED
        from tracer.trace.reader import TraceReader

        result.exit_status = rec.command_status
        start = rec.header.started_ns
        end = start
        peak_seen: int | None = None
        trace_probes: list[ProbeSample] = []
        summaries: list[ReclaimSummary] = []
        command_pid: int | None = None  # the first exec is the command's (sh, then exec)
        command_exit: int | None = None
        with TraceReader(result.trace) as reader:
            # the thrash the run's trace shows, as replay --tail shows it: the one analyzer
            analyzer = Analyzer.from_header(reader.header.targets)
            for ev in reader:
                analyzer.feed(ev)
                end = max(end, ev.ts)
                if isinstance(ev, ReclaimSummary) and ev.cgroup_id == cgroup_id:
                    summaries.append(ev)
                elif isinstance(ev, CgroupSample) and ev.cgroup_id == cgroup_id:
                    for v in (ev.usage_bytes, ev.peak_bytes):
                        if v is not None and (peak_seen is None or v > peak_seen):
                            peak_seen = v
                    t = analyzer.thrash(cgroup_id)
                    if t is not None and (result.thrash is None or t.rate > result.thrash.rate):
                        result.thrash = t
                elif isinstance(ev, ProbeSample):
                    trace_probes.append(ev)
                elif isinstance(ev, Exec) and command_pid is None:
                    command_pid = ev.pid
                elif isinstance(ev, Exit) and ev.pid == command_pid and command_exit is None:
                    command_exit = ev.ts
            footer = reader.footer
        if footer is not None:
            end = max(end, footer.ended_ns)
        # the workload's own end: it exited, or --duration told it to stop
        work_end = min(
            end,
            command_exit if command_exit is not None else end,
            start + int(self.plan.duration_s * 1e9) if self.plan.duration_s else end,
        )
        result.stall_ns = stall_total_ns(summaries, start, end)
        result.duration_s = (end - start) / 1e9
        if result.peak_bytes is None:
            result.peak_bytes = peak_seen
        # Probes: all of them are in the trace (the liveness prober is one of its sources).
        latencies = [p.latency_ns for p in trace_probes]
        result.probes = len(trace_probes)
        result.probe_failures = sum(1 for p in trace_probes if not p.ok or p.timed_out)
        if live is not None:
            result.liveness_kill = live.killed_at_ns is not None
        result.max_probe_latency_s = max(latencies) / 1e9 if latencies else None
        if rec.stop_signal is not None:
            result.stop_signal = rec.stop_signal
            result.outcome = ERROR
            result.error = f"interrupted by {signal.Signals(rec.stop_signal).name}"
            result.verdict = deciding_verdict(rec.verdicts)
            return
        # a memory setting that left the workload serving badly did not let it survive; a
        # varied probe timeout is judged by its liveness kills alone, as a kubelet's would be
        degraded = (
            degradation(trace_probes, work_end, result.thrash)
            if self.plan.kind != PROBE_TIMEOUT
            else None
        )
        # the end of --duration is our own SIGTERM to the workload, not a kill
        stopped_by = os.getpid() if rec.reason.startswith(DURATION_REACHED) else None
        result.outcome, result.verdict = judge(
            rec.verdicts, rec.command_status, result.liveness_kill, degraded, stopped_by
        )
        if result.outcome == DEGRADED:
            result.degraded = degraded
        if result.outcome == KILLED and result.verdict is not None:
            result.time_to_kill_s = round((result.verdict.ts - start) / 1e9, 3)

    @staticmethod
    def _describe(r: RunResult) -> str:
        v = r.verdict
        peak = f", peak {fmt_bytes(r.peak_bytes)}" if r.peak_bytes is not None else ""
        if r.outcome == KILLED:
            return f"killed ({v.cause if v else '?'}) after {r.time_to_kill_s} s{peak}"
        if r.outcome == SURVIVED:
            return f"survived{peak}"
        if r.outcome == DEGRADED and r.degraded is not None:
            return f"degraded: {'; '.join(r.degraded.reasons())}{peak}"
        if r.outcome == FAILED:
            return f"failed (exit status {r.exit_status}){peak}"
        return r.error or "error"


def _make_out_dir(path: str) -> None:
    """Make --out-dir (only its last component: its parent must exist, as record's -o
    directory must), or reuse an existing directory that holds no run traces yet."""
    from tracer.errors import OutputError
    from tracer.options import check_output_dir

    check_output_dir(path)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise OutputError(
            f"--out-dir {path}: cannot make the directory: {exc.strerror}",
            fix="choose a directory on a writable, ordinary file system",
        ) from None
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise OutputError(f"--out-dir {path}: cannot list it: {exc.strerror}") from None
    if any(n.startswith("run") and n.endswith(".trace") for n in names):
        raise UsageError(
            f"--out-dir {path} already holds run traces",
            fix="choose another --out-dir (the default is a new timestamped one)",
        )


def _catch_stop_signals(note: Callable[[int], None]) -> dict[int, Any]:
    """Route SIGINT/SIGTERM/SIGHUP to ``note``; returns the handlers to put back. Not in the
    main thread (tests): nothing is installed."""
    from tracer.spawn import STOP_SIGNALS

    prev: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError):
            prev[sig] = signal.signal(sig, lambda signum, _frame: note(signum))
    return prev
