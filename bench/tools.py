"""The tracers measured (variants) and how each one's output is counted.

whyrestart's trace is read with the project's own reader (`TraceReader`: typed events, the
footer, damage named); the peers print text lines, counted here by their columns.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from bench.helpers import MARKER_PREFIX, STORM_COMM
from bench.options import Options
from bench.records import Run, Work
from tracer.events import Exit, Fork, Lost, ReclaimStall, ReclaimSummary, Signal
from tracer.trace.reader import TraceReader

SIGUSR1 = 10
LOST_RE = re.compile(rb"\blost\s+(\d+)\s+(?:events|samples)", re.IGNORECASE)
BPFTRACE_PROG = 'tracepoint:sched:sched_process_exit { printf("%d %s\\n", pid, comm); }'
# signal tools: "sig target_pid sender_pid sender_comm" for every signal generated
BPFTRACE_SIG_PROG = (
    "tracepoint:signal:signal_generate "
    '{ printf("%d %d %d %s\\n", args->sig, args->pid, pid, comm); }'
)
# reclaim: one line per memcg reclaim (pid, duration, pages reclaimed); markers by their exit
BPFTRACE_RECLAIM_PROG = (
    "tracepoint:vmscan:mm_vmscan_memcg_reclaim_begin { @start[tid] = nsecs; } "
    "tracepoint:vmscan:mm_vmscan_memcg_reclaim_end /@start[tid]/ "
    '{ printf("R %d %d %d\\n", pid, nsecs - @start[tid], args->nr_reclaimed); '
    "delete(@start[tid]); } "
    'tracepoint:sched:sched_process_exit /strncmp(comm, "wrmk", 4) == 0/ '
    '{ printf("M %s\\n", comm); }'
)

Markers = dict[int, int]  # marker index -> its exit's boottime ns (0: the tool has no clock)
# of a peer tool's output line: one of the storm's events?, else the field that may name a marker
Splitter = Callable[[bytes], tuple[bool, bytes | None]]


class Variant:
    name = ""
    marker_args: tuple[str, ...] = ()  # extra arguments for wr-marker ("sig": signal markers)

    def __init__(self, opts: Options, section: str = "storm") -> None:
        self.opts = opts
        self.section = section

    def missing(self) -> str | None:
        """Why this variant cannot run here, or None."""
        return None

    def command(self, tmp: Path) -> list[str]:
        raise NotImplementedError

    def events_file(self, tmp: Path) -> Path:
        return tmp / "tool.stdout"

    def count(self, tmp: Path, work: Work) -> tuple[Run, Markers]:
        """What the tool's output holds of the workload's events, and the markers it caught."""
        raise NotImplementedError

    def version(self) -> str:
        return ""


class Bare(Variant):
    name = "bare"


class Whyrestart(Variant):
    name = "whyrestart"

    def __init__(
        self, opts: Options, section: str = "storm", targets: tuple[str, ...] = ()
    ) -> None:
        super().__init__(opts, section)
        self.targets = targets or ("--all",)
        if section == "signals":
            self.marker_args = ("sig",)

    def exe(self) -> str:
        return self.opts.whyrestart_exe()

    def missing(self) -> str | None:
        if not os.access(self.exe(), os.X_OK):
            return f"not installed ({self.exe()} missing: run scripts/setup)"
        return None

    def command(self, tmp: Path) -> list[str]:
        return [
            self.exe(),
            "record",
            *self.targets,
            "-q",
            "-o",
            str(self.events_file(tmp)),
            "--duration",
            "86400",
        ]

    def events_file(self, tmp: Path) -> Path:
        return tmp / "wr.trace"

    def version(self) -> str:
        r = subprocess.run([self.exe(), "--version"], capture_output=True, text=True)
        return r.stdout.strip()

    def count(self, tmp: Path, work: Work) -> tuple[Run, Markers]:
        """One pass over the trace with TraceReader, counting what every section looks for.
        A damaged trace raises TraceFileError (naming the line): the run is reported failed."""
        wpid = work.get("pid")
        storm_exits = storm_forks = storm_self_exit = signals = stalls = 0
        reclaims: dict[int, int] = {}  # cgroup id -> memcg reclaims in summaries
        markers: Markers = {}
        lost_records = exits_total = 0
        with TraceReader(self.events_file(tmp)) as reader:
            for ev in reader:
                if isinstance(ev, Exit):
                    exits_total += 1
                    if ev.comm == STORM_COMM and ev.pid != wpid:
                        storm_exits += 1
                    elif ev.comm == STORM_COMM:
                        storm_self_exit += 1
                    elif ev.comm.startswith(MARKER_PREFIX):
                        with contextlib.suppress(ValueError):
                            markers.setdefault(int(ev.comm[len(MARKER_PREFIX) :]), ev.ts)
                elif isinstance(ev, Fork):
                    if ev.parent_pid == wpid:
                        storm_forks += 1
                elif isinstance(ev, Signal):
                    if (
                        ev.sig == SIGUSR1
                        and ev.sender_pid == wpid
                        and ev.target_pid == work.get("child")
                    ):
                        signals += 1
                elif isinstance(ev, ReclaimSummary):
                    if ev.kind == "memcg":
                        reclaims[ev.cgroup_id] = reclaims.get(ev.cgroup_id, 0) + ev.count
                elif isinstance(ev, ReclaimStall):
                    stalls += 1
                elif isinstance(ev, Lost):
                    lost_records += ev.count
            footer = reader.footer
            counts = dict(reader.counts)
            warnings = list(reader.warnings)
        # The storm's child handles SIGUSR1: the kernel counts those signals instead of sending
        # records (footer signals_unsent), and the markers' ignored SIGUSR1s (one each, before
        # its exit) with them.
        unsent = footer.extra.get("signals_unsent", {}) if footer else {}
        counted = max(0, int(unsent.get("SIGUSR1", 0)) - len(markers))
        if self.section == "signals":
            seen = signals + counted
        elif self.section == "reclaim":
            seen = reclaims.get(work.get("cgroup_id", -1), 0)
        else:
            seen = storm_exits
        run: Run = {
            "seen": seen,
            "storm_exits_seen": storm_exits,
            "storm_forks_seen": storm_forks,
            "storm_self_exit_seen": storm_self_exit,
            "signals_seen": signals,
            "signals_counted": counted,
            "reclaims_by_cgroup": {str(k): v for k, v in reclaims.items()},
            "stall_records": stalls,
            "lost": footer.lost if footer else lost_records,
            "lost_records_sum": lost_records,
            "footer": footer is not None,
            "footer_counts": footer.counts if footer else None,
            "footer_warnings": list(footer.warnings) if footer else None,
            "trace_warnings": warnings,
            "exit_records": exits_total,
            "records": sum(counts.values()),
        }
        return run, markers


def _text_lost(tmp: Path) -> tuple[int, list[str]]:
    """Lost-event warnings a peer printed: anywhere on stderr, and on stdout only as a line of
    its own (bpftrace prints "Lost N events" there, between the event lines)."""
    total = 0
    lines: list[str] = []
    for name in ("tool.stderr", "tool.stdout"):
        with contextlib.suppress(OSError), open(tmp / name, "rb") as f:
            for line in f:
                if name == "tool.stdout" and not line.lstrip().lower().startswith(b"lost"):
                    continue
                m = LOST_RE.search(line)
                if m:
                    total += int(m.group(1))
                    if len(lines) < 20:
                        lines.append(line.decode(errors="replace").strip())
    return total, lines


def _marker_index(comm: bytes) -> int | None:
    try:
        return int(comm[len(MARKER_PREFIX) :])
    except ValueError:
        return None


def _count_lines(path: Path, split: Splitter) -> tuple[int, Markers]:
    """A peer tool's output counted: ``split`` says of each line whether it is one of the
    storm's events and, where it is not, which field may name a marker process (or None)."""
    seen = 0
    markers: Markers = {}
    with open(path, "rb") as f:
        for line in f:
            hit, comm = split(line)
            if hit:
                seen += 1
            elif comm is not None and comm.startswith(MARKER_PREFIX.encode()):
                k = _marker_index(comm)
                if k is not None:
                    markers.setdefault(k, 0)
    return seen, markers


def _peer_run(tmp: Path, seen: int) -> Run:
    lost, lines = _text_lost(tmp)
    return {"seen": seen, "lost": lost, "lost_lines": lines}


class Bpftrace(Variant):
    name = "bpftrace"
    prog = BPFTRACE_PROG

    def missing(self) -> str | None:
        return None if shutil.which("bpftrace") else "not installed"

    def command(self, tmp: Path) -> list[str]:
        return [shutil.which("bpftrace") or "bpftrace", "-e", self.prog]

    def version(self) -> str:
        r = subprocess.run(["bpftrace", "--version"], capture_output=True, text=True)
        return r.stdout.strip()

    def count(self, tmp: Path, work: Work) -> tuple[Run, Markers]:
        spid = str(work["pid"]).encode()

        def split(line: bytes) -> tuple[bool, bytes | None]:
            pid, _, comm = line.rstrip(b"\n").partition(b" ")
            return comm == STORM_COMM.encode() and pid != spid, comm

        seen, markers = _count_lines(self.events_file(tmp), split)
        return _peer_run(tmp, seen), markers


class BpftraceSignals(Bpftrace):
    prog = BPFTRACE_SIG_PROG
    marker_args = ("sig",)

    def count(self, tmp: Path, work: Work) -> tuple[Run, Markers]:
        want = (str(SIGUSR1).encode(), str(work["child"]).encode(), str(work["pid"]).encode())

        def split(line: bytes) -> tuple[bool, bytes | None]:
            parts = line.split()
            if len(parts) < 4:
                return False, None
            return (parts[0], parts[1], parts[2]) == want, parts[3]

        seen, markers = _count_lines(self.events_file(tmp), split)
        return _peer_run(tmp, seen), markers


class BpftraceReclaim(Bpftrace):
    prog = BPFTRACE_RECLAIM_PROG

    def count(self, tmp: Path, work: Work) -> tuple[Run, Markers]:
        seen = 0
        total_ns = 0
        markers: Markers = {}
        wpid = str(work["pid"]).encode()
        with open(self.events_file(tmp), "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[0] == b"R" and parts[1] == wpid:
                    seen += 1
                    with contextlib.suppress(ValueError):
                        total_ns += int(parts[2])
                elif len(parts) == 2 and parts[0] == b"M":
                    k = _marker_index(parts[1])
                    if k is not None:
                        markers.setdefault(k, 0)
        run = _peer_run(tmp, seen)
        run["reclaim_ns"] = total_ns
        return run, markers


class Libbpftool(Variant):
    """A libbpf-tools program from /usr/sbin (Debian package libbpf-tools)."""

    tool = ""

    def exe(self) -> str | None:
        path = f"/usr/sbin/{self.tool}"
        return shutil.which(self.tool) or (path if os.access(path, os.X_OK) else None)

    def missing(self) -> str | None:
        return None if self.exe() else "not installed"

    def command(self, tmp: Path) -> list[str]:
        return [self.exe() or self.tool]

    def version(self) -> str:
        r = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "libbpf-tools"], capture_output=True, text=True
        )
        return f"libbpf-tools {r.stdout.strip()}" if r.returncode == 0 else ""


class Exitsnoop(Libbpftool):
    name = tool = "exitsnoop"

    def count(self, tmp: Path, work: Work) -> tuple[Run, Markers]:
        # PCOMM PID PPID TID AGE(s) EXIT_CODE
        spid = str(work["pid"]).encode()

        def split(line: bytes) -> tuple[bool, bytes | None]:
            parts = line.split()
            if len(parts) < 2:
                return False, None
            return parts[0] == STORM_COMM.encode() and parts[1] != spid, parts[0]

        seen, markers = _count_lines(self.events_file(tmp), split)
        return _peer_run(tmp, seen), markers


class Sigsnoop(Libbpftool):
    name = tool = "sigsnoop"
    marker_args = ("sig",)

    def count(self, tmp: Path, work: Work) -> tuple[Run, Markers]:
        # TIME PID COMM SIG TPID RESULT
        want = (str(work["pid"]).encode(), str(SIGUSR1).encode(), str(work["child"]).encode())

        def split(line: bytes) -> tuple[bool, bytes | None]:
            parts = line.split()
            if len(parts) < 6:
                return False, None
            return (parts[1], parts[3], parts[4]) == want, parts[2]

        seen, markers = _count_lines(self.events_file(tmp), split)
        return _peer_run(tmp, seen), markers


def make_variant(name: str, section: str, opts: Options) -> Variant:
    if name == "bare":
        return Bare(opts, section)
    if name == "whyrestart":
        return Whyrestart(opts, section)
    if name == "bpftrace":
        if section == "signals":
            return BpftraceSignals(opts, section)
        if section == "reclaim":
            return BpftraceReclaim(opts, section)
        return Bpftrace(opts, section)
    if name == "exitsnoop":
        return Exitsnoop(opts, section)
    if name == "sigsnoop":
        return Sigsnoop(opts, section)
    raise ValueError(name)
