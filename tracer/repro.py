"""``whyrestart repro``: the one-change-per-run method as a command.

Run the workload again and again, each time in a fresh child memory cgroup, changing exactly
one setting per run (``--memory-max``, ``--memory-high`` or ``--probe-timeout``), with no
restart policy, each run recorded to its own trace; then compare the runs and name the smallest
setting that survived, with its headroom.

This module owns: the experiment plan (`Plan`, built from the
command line by `make_plan`), running it (`Experiment`), judging each run (`RunResult`), and the
comparison (`Comparison`: the table and the ``--json`` shape documented in `tracer.outputs`).

How a run is isolated: the command is wrapped in ``sh -c 'echo $$ > <cgroup>/cgroup.procs &&
exec "$@"'``, so it is inside the run's cgroup before it executes a single instruction of the
workload, and the recorder watches it from its first exec (the idiom of the root tests). The
cgroup always has a memory limit: the varied one, or ``--memory-max``, or a safety cap of 80% of
the host's available memory, so a run can never push the host into a global OOM. When the run
ends (the command exited, ``--duration`` passed, or a liveness kill), whatever is left in the
cgroup is killed and the cgroup removed.

Probes: with ``--probe`` a probe runs beside each run (``tracer.sources.probes.Prober``). Like a
kubelet liveness probe, ``--probe-failures`` consecutive failures (default 3; 0 turns it off)
make repro kill the workload, so varying ``--probe-timeout`` shows which timeout the workload
survives. Every probe result is a source of the run's recording (``ProbeSample`` events), so a
run's trace holds the probes that judged it and replays to the verdicts repro printed; the
run's probe counts are read back from its trace.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracer import safetext
from tracer.analysis.analyzer import (
    APP_EXIT,
    CGROUP_OOM,
    GLOBAL_OOM,
    NUMA_OOM,
    PROBE_KILL,
    USERSPACE_OOM,
    Verdict,
)
from tracer.analysis.quantities import fmt_bytes, stall_total_ns
from tracer.errors import UsageError
from tracer.parse import values

if TYPE_CHECKING:
    from tracer.pipeline.record import RecordResult
    from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup
    from tracer.sources.probes import ProbeResult, ProbeSpec

SCHEMA = 1
MEMORY_MAX, MEMORY_HIGH, PROBE_TIMEOUT = "memory_max", "memory_high", "probe_timeout"
OPTION = {
    MEMORY_MAX: "--memory-max",
    MEMORY_HIGH: "--memory-high",
    PROBE_TIMEOUT: "--probe-timeout",
}
SAFETY_CAP_FRACTION = 0.8  # of MemAvailable: the cgroup limit when none is given
DEFAULT_PROBE_FAILURES = 3  # the kubelet's default failureThreshold
DEFAULT_PROBE_INTERVAL_S = 1.0
DEFAULT_PROBE_TIMEOUT_S = 1.0  # the kubelet's default timeoutSeconds

SURVIVED, KILLED, FAILED, ERROR = "survived", "killed", "failed", "error"
# The causes that say a run ended for memory: only these make a memory setting the answer.
MEMORY_CAUSES = frozenset({CGROUP_OOM, GLOBAL_OOM, NUMA_OOM, USERSPACE_OOM})
# Comparison.conclusion()'s kinds (the "conclusion" of --json)
ALL_SURVIVED, SMALLEST_SURVIVED = "all_survived", "smallest_survived"
NONE_SURVIVED, OTHER_REASONS, INTERRUPTED = "none_survived", "other_reasons", "interrupted"

# ---------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True, slots=True)
class Setting:
    """One value of the varied setting: as written, and as a number (bytes or seconds)."""

    text: str
    value: int | float


def parse_settings(kind: str, text: str) -> list[Setting]:
    """``"32M,256M"`` → settings; a probe timeout takes ``0.5``, ``500ms``, ``2s``."""
    parse_one: Callable[[str], int | float] = (
        values.parse_duration if kind == PROBE_TIMEOUT else values.parse_size
    )
    return [Setting(t, v) for t, v in values.parse_list(OPTION[kind], text, parse_one)]


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class Plan:
    kind: str  # the varied setting: MEMORY_MAX, MEMORY_HIGH or PROBE_TIMEOUT
    settings: list[Setting]
    command: list[str]
    out_dir: str
    repeats: int = 1
    memory_max: int | None = None  # the fixed limit when another setting varies
    probe: ProbeSpec | None = None
    probe_timeout_s: float | None = None  # fixed, when the probe timeout does not vary
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    probe_failures: int = DEFAULT_PROBE_FAILURES
    probe_delay_s: float = 0.0
    duration_s: float | None = None
    parent_cgroup: str | None = None  # None: chosen from this process's own cgroup

    def runs(self) -> list[tuple[Setting, int]]:
        return [(s, r) for s in self.settings for r in range(1, self.repeats + 1)]

    def fixed(self) -> dict[str, Any]:
        return {
            "memory_max_bytes": self.memory_max,
            "probe": str(self.probe) if self.probe else None,
            "probe_timeout_s": self.probe_timeout_s,
            "probe_interval_s": self.probe_interval_s if self.probe else None,
            "probe_failures": self.probe_failures if self.probe else None,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True)
class Options:
    """The ``whyrestart repro`` command line as given (values still text); `make_plan` checks
    it. The defaults are the command line's."""

    command: Sequence[str]
    memory_max: str | None = None
    memory_high: str | None = None
    probe_timeout: str | None = None
    repeats: int = 1
    probe: str | None = None
    probe_interval: str | None = None
    probe_failures: int = 3
    probe_delay: str | None = None
    duration: float | None = None
    out_dir: str | None = None
    parent_cgroup: str | None = None


def make_plan(o: Options, *, memory_version: int | None) -> Plan:
    """Check the options and decide which one setting varies (long: one short check per
    option, in the order a user should meet the errors).

    Exactly one of the three may list several values; the one with several values (or the only
    one given) varies, the others are held fixed. ``--memory-high`` needs cgroup v2;
    ``--probe-timeout`` needs ``--probe``.
    """
    given = {
        k: v
        for k, v in (
            (MEMORY_MAX, o.memory_max),
            (MEMORY_HIGH, o.memory_high),
            (PROBE_TIMEOUT, o.probe_timeout),
        )
        if v is not None
    }
    if not given:
        raise UsageError(
            "nothing to vary",
            fix="give --memory-max A,B,... (or --memory-high A,B, or --probe-timeout A,B "
            "with --probe)",
        )
    if not o.command:
        raise UsageError(
            "no command to run", fix="put the workload after --, e.g. -- python serve.py"
        )
    if o.repeats < 1:
        raise UsageError("--runs must be at least 1")
    if o.duration is not None and o.duration <= 0:
        raise UsageError("--duration must be positive")
    if o.probe_failures < 0:
        raise UsageError("--probe-failures must be 0 (never kill) or more")
    if o.memory_high is not None and memory_version == 1:
        raise UsageError(
            "--memory-high needs cgroup v2: this host's memory controller is on cgroup v1, "
            "which has no memory.high",
            fix="vary --memory-max instead, or run on a cgroup v2 host",
        )
    if memory_version is None:
        raise UsageError(
            "no cgroup hierarchy with the memory controller is mounted",
            fix="repro needs the memory controller (cgroup v1 memory or cgroup v2)",
        )
    multi = [k for k, v in given.items() if "," in v]
    if len(multi) > 1:
        raise UsageError(
            f"{' and '.join(OPTION[k] for k in multi)} both list several values",
            fix="change exactly one setting per experiment: give the others one value",
        )
    if multi:
        kind = multi[0]
    elif len(given) == 1:
        kind = next(iter(given))
    else:
        raise UsageError(
            f"{' and '.join(OPTION[k] for k in given)} are all single values: which one varies?",
            fix="list two or more values (A,B) for the one setting to vary",
        )
    spec = None
    if o.probe is not None:
        from tracer.sources.probes import parse_probe

        spec = parse_probe(o.probe)
    if PROBE_TIMEOUT in given and spec is None:
        raise UsageError(
            "--probe-timeout needs --probe", fix="say what to probe: --probe http://HOST:PORT/PATH"
        )
    settings = parse_settings(kind, given[kind])
    plan = Plan(
        kind=kind,
        settings=settings,
        command=list(o.command),
        out_dir=o.out_dir or time.strftime("repro-%Y%m%d-%H%M%S"),
        repeats=o.repeats,
        probe=spec,
        probe_failures=o.probe_failures,
        duration_s=o.duration,
        parent_cgroup=o.parent_cgroup,
    )
    if kind != MEMORY_MAX and o.memory_max is not None:
        plan.memory_max = values.parse_size(o.memory_max)
    if spec is not None:
        if kind != PROBE_TIMEOUT:
            plan.probe_timeout_s = (
                values.parse_duration(o.probe_timeout)
                if o.probe_timeout
                else DEFAULT_PROBE_TIMEOUT_S
            )
        if o.probe_interval is not None:
            plan.probe_interval_s = values.parse_duration(o.probe_interval)
        if o.probe_delay is not None:
            plan.probe_delay_s = values.parse_duration(o.probe_delay)
    elif o.probe_interval is not None or o.probe_delay is not None:
        raise UsageError("--probe-interval and --probe-delay need --probe")
    return plan


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class RunResult:
    run: int
    setting: Setting
    repeat: int
    trace: str
    outcome: str = ERROR
    exit_status: int | None = None
    verdict: Verdict | None = None
    peak_bytes: int | None = None
    time_to_kill_s: float | None = None
    duration_s: float = 0.0
    stall_ns: int = 0
    probes: int = 0
    probe_failures: int = 0
    max_probe_latency_s: float | None = None
    liveness_kill: bool = False  # repro killed it after failing probes
    error: str | None = None
    stop_signal: int | None = None  # a signal to repro interrupted this run

    @property
    def survived(self) -> bool:
        return self.outcome == SURVIVED

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "run": self.run,
            "setting": self.setting.text,
            "value": self.setting.value,
            "repeat": self.repeat,
            "trace": self.trace,
            "outcome": self.outcome,
            "survived": self.survived,
            "exit_status": self.exit_status,
            "cause": v.cause if v else None,
            "verdict": (
                {
                    "pid": v.pid,
                    "comm": v.comm,
                    "cause": v.cause,
                    "confidence": v.confidence,
                    "summary": v.summary,
                    "advice": v.advice,
                }
                if v
                else None
            ),
            "peak_bytes": self.peak_bytes,
            "time_to_kill_s": self.time_to_kill_s,
            "duration_s": round(self.duration_s, 3),
            "stall_s": round(self.stall_ns / 1e9, 3),
            "probes": self.probes,
            "probe_failures": self.probe_failures,
            "max_probe_latency_s": self.max_probe_latency_s,
            "liveness_kill": self.liveness_kill,
            "error": self.error,
        }


def deciding_verdict(verdicts: Sequence[Verdict]) -> Verdict | None:
    """The verdict that says how a run ended: the first process that did not end on its own
    (a kill anywhere in the workload decides), else the main process's, else the last."""
    for v in verdicts:
        if v.cause != APP_EXIT:
            return v
    mains = [v for v in verdicts if v.main] or list(verdicts)
    return mains[-1] if mains else None


def judge(
    verdicts: Sequence[Verdict], command_status: int | None, liveness_kill: bool
) -> tuple[str, Verdict | None]:
    """The outcome of one run: killed (by a limit, a signal, a liveness check), failed (the
    workload exited non-zero or crashed on its own), or survived (exit 0, or still running
    when ``--duration`` ended the run)."""
    v = deciding_verdict(verdicts)
    if liveness_kill:
        return KILLED, v
    if v is not None and v.cause != APP_EXIT:
        return KILLED, v
    if v is not None and (v.exit_code not in (0, None) or v.signal is not None):
        return FAILED, v
    if command_status not in (0, None):
        return FAILED, v
    return SURVIVED, v


@dataclass
class Comparison:
    plan: Plan
    runs: list[RunResult]
    cgroup_version: int
    parent_cgroup: str
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)
    stop_signal: int | None = None  # the signal that interrupted the experiment

    def setting_decided(self, r: RunResult) -> bool:
        """Whether a run that did not survive ended for a reason the varied setting governs:
        a memory kill for a memory setting, a liveness or probe kill for the probe timeout."""
        if self.plan.kind == PROBE_TIMEOUT:
            return r.liveness_kill or (r.verdict is not None and r.verdict.cause == PROBE_KILL)
        return r.outcome == KILLED and r.verdict is not None and r.verdict.cause in MEMORY_CAUSES

    def conclusion(self) -> tuple[str, str]:
        """(kind, text): what the runs show, derived from their verdicts. Advice to try larger
        values only when runs ended for the reason the setting governs; runs that ended for
        other reasons are named as such."""
        name = self._setting_name()
        reason = "the probe timeout" if self.plan.kind == PROBE_TIMEOUT else "memory"
        if self.interrupted:
            sig = signal.Signals(self.stop_signal).name if self.stop_signal else "a signal"
            return INTERRUPTED, (
                f"interrupted by {sig} after {len(self.runs)} of "
                f"{len(self.plan.runs())} runs: no conclusion"
            )
        failed = [r for r in self.runs if not r.survived]
        other = [r for r in failed if not self.setting_decided(r)]
        best = self.smallest_surviving()
        other_text = ", ".join(f"run {r.run} ({self._row_verdict(r)})" for r in other)
        if best is not None:
            s, runs = best
            text = f"{'all runs survived: the smallest' if not failed else 'smallest'} {name}"
            text += f" {'tried is' if not failed else 'that survived:'} {s.text}"
            text += self._headroom_text(s, runs)
            if other:
                text += f"; failed for reasons other than {reason}: {other_text}"
            return (ALL_SURVIVED if not failed else SMALLEST_SURVIVED), text
        if other and len(other) == len(failed):
            return OTHER_REASONS, (
                f"every run failed for reasons other than {reason}: {other_text}; the {name} "
                "did not decide these runs: fix that failure first"
            )
        decided = sorted({self._row_verdict(r) for r in failed if self.setting_decided(r)})
        text = f"no {name} survived every run ({', '.join(decided)}): try larger values"
        if other:
            text += f"; failed for reasons other than {reason}: {other_text}"
        return NONE_SURVIVED, text

    def _headroom_text(self, s: Setting, runs: Sequence[RunResult]) -> str:
        room = self.headroom(s, runs)
        if room is None:
            return ""
        if self.plan.kind == PROBE_TIMEOUT:
            return (
                f" (slowest probe {s.value - room[0]:.3f} s, headroom {room[0]:.3f} s = "
                f"{room[1]:.0f}%)"
            )
        return (
            f" (peak {fmt_bytes(s.value - room[0])}, headroom {fmt_bytes(room[0])} = "
            f"{room[1]:.0f}% of the limit)"
        )

    def by_setting(self) -> list[tuple[Setting, list[RunResult]]]:
        out: dict[str, tuple[Setting, list[RunResult]]] = {}
        for r in self.runs:
            out.setdefault(r.setting.text, (r.setting, []))[1].append(r)
        return list(out.values())

    def smallest_surviving(self) -> tuple[Setting, list[RunResult]] | None:
        """The smallest setting whose every run survived (all ``--runs`` repeats)."""
        ok = [
            (s, runs)
            for s, runs in self.by_setting()
            if len(runs) == self.plan.repeats and all(r.survived for r in runs)
        ]
        return min(ok, key=lambda x: x[0].value) if ok else None

    def headroom(self, setting: Setting, runs: Sequence[RunResult]) -> tuple[float, float] | None:
        """How far the runs stayed from the setting: bytes below a memory setting, seconds
        below a probe timeout; and that as a percentage of the setting."""
        if self.plan.kind == PROBE_TIMEOUT:
            lat = [r.max_probe_latency_s for r in runs if r.max_probe_latency_s is not None]
            if not lat:
                return None
            room: float = setting.value - max(lat)
        else:
            peaks = [r.peak_bytes for r in runs if r.peak_bytes is not None]
            if not peaks:
                return None
            room = setting.value - max(peaks)
        return room, room / setting.value * 100 if setting.value else 0.0

    def check_monotonic(self) -> None:
        """A larger setting that fails where a smaller one survived means the runs are noisy
        (or the setting is not what limits the workload): say so rather than trust one run."""
        ordered = sorted(self.by_setting(), key=lambda x: x[0].value)
        survived_below: Setting | None = None
        for s, runs in ordered:
            if all(r.survived for r in runs):
                survived_below = survived_below or s
            elif survived_below is not None:
                self.warnings.append(
                    f"{s.text} did not survive although {survived_below.text} did: the runs "
                    "disagree (try --runs 3) or this setting is not what limits the workload"
                )

    def to_json(self) -> dict[str, Any]:
        best = self.smallest_surviving()
        smallest = None
        if best is not None:
            room = self.headroom(*best)
            smallest = {
                "setting": best[0].text,
                "value": best[0].value,
                "headroom": room[0] if room else None,
                "headroom_pct": round(room[1], 1) if room else None,
            }
        return {
            "schema": SCHEMA,
            "kind": "repro",
            "setting": self.plan.kind,
            "fixed": self.plan.fixed(),
            "command": self.plan.command,
            "cgroup_version": self.cgroup_version,
            "parent_cgroup": self.parent_cgroup,
            "out_dir": self.plan.out_dir,
            "interrupted": self.interrupted,
            "runs": [r.to_json() for r in self.runs],
            "smallest_surviving": smallest,
            "conclusion": dict(zip(("kind", "text"), self.conclusion(), strict=True)),
            "warnings": self.warnings,
        }

    # -- text ----------------------------------------------------------------------------------

    def _setting_name(self) -> str:
        if self.plan.kind == PROBE_TIMEOUT:
            return "probe timeout"
        from tracer.parse.cgroup import MEMORY_FILES, MEMORY_V2

        if self.plan.kind == MEMORY_HIGH:
            return MEMORY_V2.high
        return MEMORY_FILES[self.cgroup_version].limit

    @staticmethod
    def _row_verdict(r: RunResult) -> str:
        """The verdict column: the cause, and what qualifies it."""
        v = r.verdict
        if r.outcome == ERROR:
            return safetext.field(r.error or "error")
        if r.outcome == SURVIVED and v is None:
            return "still running at the end"
        text = v.cause if v else "-"
        if r.liveness_kill:
            text += " (liveness kill)"
        if r.outcome == FAILED and v is not None and v.exit_code not in (None, 0):
            text += f" (exit {v.exit_code})"
        elif r.outcome == FAILED and v is not None and v.signal is not None:
            text += f" ({v.signal})"
        elif r.outcome == FAILED and r.exit_status is not None:
            text += f" (exit status {r.exit_status})"
        return text

    def _value_text(self, s: Setting) -> str:
        if self.plan.kind == PROBE_TIMEOUT:
            return s.text
        # bytes written as a bare number are hard to read: show them in MiB/GiB too
        return f"{s.text} ({fmt_bytes(s.value)})" if s.text.isdigit() else s.text

    def table(self) -> str:
        header = (
            self._setting_name(),
            "run",
            "outcome",
            "verdict",
            "peak usage",
            "time to kill",
            "stall",
            "probe failures",
        )
        rows = [header]
        for r in self.runs:
            rows.append(
                (
                    self._value_text(r.setting),
                    f"{r.repeat}/{self.plan.repeats}",
                    r.outcome,
                    self._row_verdict(r),
                    fmt_bytes(r.peak_bytes) if r.peak_bytes is not None else "-",
                    f"{r.time_to_kill_s:.2f} s" if r.time_to_kill_s is not None else "-",
                    f"{r.stall_ns / 1e6:.0f} ms",
                    f"{r.probe_failures}/{r.probes}" if self.plan.probe else "-",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        out = "\n".join(lines) + "\n\n"
        out += self.conclusion()[1] + "\n"
        for w in self.warnings:
            out += f"warning: {w}\n"
        out += f"traces in {self.plan.out_dir}\n"
        return out


# ---------------------------------------------------------------------------------------------
# Running


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


@dataclass
class _Liveness:
    """Runs the probe beside a run and, like a kubelet liveness probe, kills the workload after
    ``failures`` consecutive failures (never when ``failures`` is 0). It is a source of the
    run's recording: it starts when the recording does (``delay_s`` counts from then) and its
    results go into the run's trace."""

    spec: ProbeSpec
    interval_s: float
    timeout_s: float
    failures: int
    delay_s: float
    cgroup: ChildCgroup
    results: list[ProbeResult] = field(default_factory=list)
    killed_at_ns: int | None = None

    def __post_init__(self) -> None:
        from tracer.pipeline.sources import ProbeResultsSource

        # the recording's view of the results: each goes into the run's trace
        self.source = ProbeResultsSource(self.spec.text, on_start=self.start, on_stop=self.stop)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="repro-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout_s + 10)

    def _run(self) -> None:
        from tracer.sources.probes import Prober

        if self._stop.wait(self.delay_s):
            return
        consecutive = 0
        with Prober(self.spec, self.interval_s, self.timeout_s) as prober:
            while not self._stop.wait(0.05):
                for r in prober.poll():
                    self._take(r)
                    consecutive = 0 if r.ok else consecutive + 1
                    if self.failures and consecutive >= self.failures and self.killed_at_ns is None:
                        self._kill()
            for r in prober.poll():
                self._take(r)

    def _take(self, r: ProbeResult) -> None:
        self.results.append(r)
        self.source.put(r)

    def _kill(self) -> None:
        self.killed_at_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        for pid in self.cgroup.procs():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


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
        live: _Liveness | None = None
        with ChildCgroup(parent, name, limit, high_bytes=high, layout=layout) as cg:
            procs = cg.procs_file
            if plan.probe is not None:
                timeout = setting.value if plan.kind == PROBE_TIMEOUT else plan.probe_timeout_s
                assert timeout is not None
                live = _Liveness(
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
        self._fill(result, rec_result, cgroup_id, live)
        self.progress(f"repro: run {n}/{total}: {what} -> {self._describe(result)}")
        return result

    def _fill(
        self,
        result: RunResult,
        rec: RecordResult,
        cgroup_id: int,
        live: _Liveness | None,
    ) -> None:
        from tracer.events import CgroupSample, ProbeSample, ReclaimSummary
        from tracer.trace.reader import TraceReader

        result.exit_status = rec.command_status
        start = rec.header.started_ns
        end = start
        peak_seen: int | None = None
        trace_probes: list[ProbeSample] = []
        summaries: list[ReclaimSummary] = []
        with TraceReader(result.trace) as reader:
            for ev in reader:
                end = max(end, ev.ts)
                if isinstance(ev, ReclaimSummary) and ev.cgroup_id == cgroup_id:
                    summaries.append(ev)
                elif isinstance(ev, CgroupSample) and ev.cgroup_id == cgroup_id:
                    for v in (ev.usage_bytes, ev.peak_bytes):
                        if v is not None and (peak_seen is None or v > peak_seen):
                            peak_seen = v
                elif isinstance(ev, ProbeSample):
                    trace_probes.append(ev)
            footer = reader.footer
        if footer is not None:
            end = max(end, footer.ended_ns)
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
        result.outcome, result.verdict = judge(
            rec.verdicts, rec.command_status, result.liveness_kill
        )
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


__all__ = [
    "SCHEMA",
    "Comparison",
    "Experiment",
    "Options",
    "Plan",
    "RunResult",
    "Setting",
    "deciding_verdict",
    "in_cgroup",
    "judge",
    "make_plan",
    "parse_settings",
]
