"""A unit's crash loop, from the agent's journal: `whyrestart history --restarts`.

A *run* is one main process of a unit, from its start to its end. The journal holds two kinds
of entry about runs: a verdict (a notable end: its cause, the limiting cgroup's peak and usage,
the memory breakdown at the kill, the process's start) and a restart (the old main process's
end linked to the new one's start, the downtime between them: the runtime's back-off). A clean
exit has no verdict entry but its restart still names it, so runs are built from both.

What a loop says beyond the list: whether memory survives the restarts — each run's peak higher
than the last's under the same limit, the shared memory (tmpfs) at the kill growing, or each run
lasting less than the last (the next run starts with memory already charged) — and the shape of
the back-off (steady, doubling, capped). Each trend needs ``MIN_RUNS`` runs in a row: two points
make no trend. Pure: entries in, summaries out; every workload-chosen value through safetext in
the text.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from tracer import safetext
from tracer.agent.history import _table
from tracer.analysis.quantities import fmt_bytes

MIN_RUNS = 3  # runs in a row before a trend is called one
PEAK_STEP = 1.01  # a run's peak "higher" than the last: by more than 1% (sampling noise)
SHORTER_STEP = 0.95  # a run "shorter" than the last: by more than 5%
STEADY = (0.8, 1.25)  # consecutive back-off gaps this close are the same delay
DOUBLING = (1.5, 2.5)  # ... and this far apart, an exponential back-off


@dataclass(slots=True)
class Run:
    boot_id: str
    pid: int
    start_ns: int | None = None
    end_ns: int | None = None
    time: str | None = None  # the end's wall time (ISO), else the start's
    cause: str | None = None
    confidence: str | None = None
    peak_bytes: int | None = None
    usage_bytes: int | None = None
    limit_bytes: int | None = None
    shmem_bytes: int | None = None
    incident: str | None = None
    backoff_ns: int | None = None  # from this run's end to the next run's start
    next_pid: int | None = None

    @property
    def lived_ns(self) -> int | None:
        if self.start_ns is None or self.end_ns is None or self.end_ns < self.start_ns:
            return None
        return self.end_ns - self.start_ns

    @property
    def memory(self) -> int | None:
        """The run's peak, else its usage at the kill."""
        return self.peak_bytes if self.peak_bytes is not None else self.usage_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "boot_id": self.boot_id,
            "pid": self.pid,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "time": self.time,
            "lived_ns": self.lived_ns,
            "cause": self.cause,
            "confidence": self.confidence,
            "peak_bytes": self.peak_bytes,
            "usage_bytes": self.usage_bytes,
            "limit_bytes": self.limit_bytes,
            "shmem_bytes": self.shmem_bytes,
            "incident": self.incident,
            "backoff_ns": self.backoff_ns,
        }


@dataclass(slots=True)
class Loop:
    unit: str
    runs: list[Run]
    restarts: int
    causes: dict[str, int] = field(default_factory=dict)
    backoff_ns: list[int] = field(default_factory=list)
    backoff: str | None = None  # "steady", "doubling", "doubling, capped", "growing", ...
    peaks_grow: bool = False
    shmem_grows: bool = False
    runs_shorten: bool = False
    limit_changed: bool = False
    findings: list[str] = field(default_factory=list)

    @property
    def leak(self) -> bool:
        return self.peaks_grow or self.shmem_grows or self.runs_shorten

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "restarts": self.restarts,
            "causes": dict(self.causes),
            "runs": [r.to_json() for r in self.runs],
            "backoff_ns": list(self.backoff_ns),
            "backoff": self.backoff,
            "peaks_grow": self.peaks_grow,
            "shmem_grows": self.shmem_grows,
            "runs_shorten": self.runs_shorten,
            "limit_changed": self.limit_changed,
            "leak": self.leak,
            "findings": list(self.findings),
        }


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _wall(text: str | None) -> float:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return 0.0


def restart_loops(entries: list[dict[str, Any]]) -> list[Loop]:
    """One loop per unit that has a main process's end or a restart in ``entries`` (the
    journal's, any kind), in the order the units first appear; runs oldest first."""
    units: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for e in entries:
        unit = e.get("unit")
        if not isinstance(unit, str) or not unit:
            continue
        if e.get("kind") == "verdict" and (e.get("verdict") or {}).get("main", True):
            units.setdefault(unit, ([], []))[0].append(e)
        elif e.get("kind") == "restart" and isinstance(e.get("restart"), dict):
            units.setdefault(unit, ([], []))[1].append(e)
    return [_loop(unit, v, r) for unit, (v, r) in units.items()]


def _loop(unit: str, verdicts: list[dict[str, Any]], restarts: list[dict[str, Any]]) -> Loop:
    # a run is known by its end: (boot, pid, exit time). The restart's old end is exactly the
    # verdict's exit time (downtime = new start - old exit), so the two meet on that key.
    ends: dict[tuple[str, int, int], Run] = {}
    open_runs: list[Run] = []

    def run_at(boot: str, pid: int, end: int) -> Run:
        run = ends.get((boot, pid, end))
        if run is None:
            run = ends[boot, pid, end] = Run(boot, pid, end_ns=end)
        return run

    for e in verdicts:
        v = e.get("verdict") or {}
        pid, ts = _int(e.get("pid")), _int(e.get("ts_ns"))
        if pid is None or ts is None:
            continue
        run = run_at(str(e.get("boot_id", "")), pid, ts)
        run.time = str(e.get("time")) if e.get("time") else None
        run.cause = str(e.get("cause")) if e.get("cause") else run.cause
        run.confidence = str(e.get("confidence")) if e.get("confidence") else None
        run.start_ns = _int(v.get("start_ns"))
        run.peak_bytes = _int(v.get("peak_bytes"))
        run.usage_bytes = _int(v.get("usage_bytes"))
        run.limit_bytes = _int(v.get("limit_bytes"))
        breakdown = v.get("breakdown")
        run.shmem_bytes = _int(breakdown.get("shmem")) if isinstance(breakdown, dict) else None
        run.incident = str(e.get("incident")) if e.get("incident") else None
    starts: list[tuple[str, int, int, str | None]] = []
    for e in restarts:
        r = e["restart"]
        ts, down = _int(r.get("ts")), _int(r.get("downtime_ns"))
        old, new = _int(r.get("old_pid")), _int(r.get("new_pid"))
        if ts is None or down is None or old is None or new is None:
            continue
        boot = str(e.get("boot_id", ""))
        run = run_at(boot, old, ts - down)
        if run.cause is None and r.get("cause"):
            run.cause = str(r["cause"])
        run.backoff_ns, run.next_pid = down, new
        if run.time is None and e.get("time"):
            # (a clean end has no verdict: its wall time is the restart's less the downtime)
            with contextlib.suppress(ValueError):
                end = datetime.fromisoformat(str(e["time"])) - timedelta(microseconds=down / 1e3)
                run.time = end.isoformat()
        starts.append((boot, new, ts, str(e.get("time")) if e.get("time") else None))
    for boot, pid, ts, when in starts:
        # the new main process's run: its first end at or after this start
        later = [r for (b, p, end), r in ends.items() if b == boot and p == pid and end >= ts]
        if later:
            run = min(later, key=lambda r: r.end_ns or 0)
            if run.start_ns is None:  # (the verdict's own start, where journaled, wins)
                run.start_ns = ts
        else:
            open_runs.append(Run(boot, pid, start_ns=ts, time=when))
    runs = [*ends.values(), *open_runs]
    runs.sort(key=lambda r: (_wall(r.time), r.end_ns if r.end_ns is not None else 1 << 62))
    loop = Loop(unit, runs, restarts=len(starts))
    for run in runs:
        if run.cause is not None and run.end_ns is not None:
            loop.causes[run.cause] = loop.causes.get(run.cause, 0) + 1
    loop.backoff_ns = [r.backoff_ns for r in runs if r.backoff_ns is not None]
    loop.backoff = backoff_shape(loop.backoff_ns)
    _trends(loop)
    return loop


def backoff_shape(gaps: list[int]) -> str | None:
    """The runtime's delay between a death and the next start, in words: "steady" (systemd's
    RestartSec), "doubling" (Docker's and the kubelet's CrashLoopBackOff), "doubling, capped"
    (the kubelet's 5 min ceiling reached), "growing", "irregular"; None under two gaps."""
    if len(gaps) < 2 or min(gaps) <= 0:
        return None
    ratios = [b / a for a, b in pairwise(gaps)]
    steady = [STEADY[0] <= q <= STEADY[1] for q in ratios]
    doubling = [DOUBLING[0] <= q <= DOUBLING[1] for q in ratios]
    if all(steady):
        return "steady"
    if all(doubling):
        return "doubling"
    n = next((i for i, d in enumerate(doubling) if not d), len(ratios))
    if n and all(steady[n:]):
        return "doubling, capped"
    if all(q >= 1 for q in ratios):
        return "growing"
    return "irregular"


def _rising(values: list[int], step: float) -> bool:
    return len(values) >= MIN_RUNS and all(b > a * step for a, b in pairwise(values))


def _tail(runs: list[Run], get: Any) -> list[Run]:
    """The last unbroken stretch of runs that have a value for ``get``."""
    out: list[Run] = []
    for run in runs:
        if get(run) is None:
            out = []
        else:
            out.append(run)
    return out


def _trends(loop: Loop) -> None:
    ended = [r for r in loop.runs if r.end_ns is not None]
    mem = _tail(ended, lambda r: r.memory)
    limits = {r.limit_bytes for r in mem if r.limit_bytes is not None}
    loop.limit_changed = len(limits) > 1
    values = [r.memory or 0 for r in mem]
    if _rising(values, PEAK_STEP):
        if loop.limit_changed:
            # a raised limit lets each run grow further: no evidence of a leak on its own
            loop.findings.append(
                "each run's peak was higher than the last, but the limit changed between runs ("
                + " → ".join(fmt_bytes(x) for x in sorted(limits))
                + ")"
            )
        else:
            loop.peaks_grow = True
            loop.findings.append(
                "memory that survives restarts: each run's peak was higher than the last ("
                + " → ".join(fmt_bytes(x) for x in values)
                + ")"
            )
    shm = _tail(ended, lambda r: r.shmem_bytes)
    shm_values = [r.shmem_bytes or 0 for r in shm]
    if _rising(shm_values, PEAK_STEP):
        loop.shmem_grows = True
        loop.findings.append(
            "shared memory (tmpfs, /dev/shm) at the kill grew from run to run ("
            + " → ".join(fmt_bytes(x) for x in shm_values)
            + "): files in a memory-backed filesystem stay charged after the process dies"
        )
    lived = [r.lived_ns or 0 for r in _tail(ended, lambda r: r.lived_ns)]
    if len(lived) >= MIN_RUNS and all(b < a * SHORTER_STEP for a, b in pairwise(lived)):
        loop.runs_shorten = True
        loop.findings.append(
            "each run lasted less than the last ("
            + " → ".join(_secs(x) for x in lived)
            + "): the next run starts with memory already used (tmpfs, shared memory,"
            " the previous run's page cache or a leak outside the process)"
        )


def _when(iso: str | None) -> str:
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:23]
    except ValueError:
        return safetext.cell(str(iso))


def _n(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _secs(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e9:.1f}s"


def _causes(loop: Loop) -> str:
    return ", ".join(f"{safetext.field(c)} {n}x" for c, n in loop.causes.items()) or "no verdict"


def loop_line(loop: Loop) -> str:
    """One line per unit: its runs, restarts, causes, and the trends."""
    parts = [
        f"{safetext.field(loop.unit)}: {_n(len(loop.runs), 'run')}, {_n(loop.restarts, 'restart')}",
        _causes(loop),
    ]
    lived = [r.lived_ns for r in loop.runs if r.lived_ns is not None]
    if lived:
        parts.append("lived " + (" → ".join(_secs(x) for x in lived[-MIN_RUNS - 1 :])))
    if loop.backoff_ns:
        shape = f" ({loop.backoff})" if loop.backoff else ""
        parts.append("back-off " + ", ".join(_secs(x) for x in loop.backoff_ns[-4:]) + shape)
    if loop.leak:
        parts.append(
            "LEAK ACROSS RESTARTS"
            if loop.peaks_grow or loop.shmem_grows
            else "runs get shorter (memory left charged?)"
        )
    return "; ".join(parts)


def loop_text(loop: Loop) -> str:
    """One unit's loop in full: the summary line, one row per run, the findings."""
    rows: list[tuple[str, ...]] = [
        ("run", "pid", "ended", "lived", "cause", "peak", "at kill", "limit", "shmem", "back-off")
    ]
    for i, r in enumerate(loop.runs, 1):
        rows.append(
            (
                str(i),
                str(r.pid),
                _when(r.time) if r.end_ns is not None else "(running)",
                _secs(r.lived_ns),
                safetext.cell(r.cause or "-"),
                fmt_bytes(r.peak_bytes) if r.peak_bytes is not None else "-",
                fmt_bytes(r.usage_bytes) if r.usage_bytes is not None else "-",
                fmt_bytes(r.limit_bytes) if r.limit_bytes is not None else "-",
                fmt_bytes(r.shmem_bytes) if r.shmem_bytes is not None else "-",
                _secs(r.backoff_ns) if r.backoff_ns is not None else "-",
            )
        )
    out = [loop_line(loop), "", *_table(rows)]
    if loop.findings:
        out.append("")
        out += [f"  {safetext.field(f)}" for f in loop.findings]
    if loop.backoff:
        out.append(f"  back-off: {loop.backoff}")
    incidents = [r.incident for r in loop.runs if r.incident]
    if incidents:
        out.append(f"  evidence: whyrestart explain {safetext.field(incidents[-1])} (the last run)")
    return "\n".join(out) + "\n"


def loops_text(entries: list[dict[str, Any]], detailed: bool) -> str:
    """``history --restarts``: without a unit, each unit's loop in one line (units restarted
    at least once); with one, each matching unit's loop in full."""
    loops = restart_loops(entries)
    if not detailed:
        loops = [lp for lp in loops if lp.restarts]
        if not loops:
            return "no restarts in the journal\n"
        return "".join(loop_line(lp) + "\n" for lp in loops)
    if not loops:
        return "no runs of that unit in the journal\n"
    return "\n".join(loop_text(lp) for lp in loops)


def loops_json(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [lp.to_json() for lp in restart_loops(entries)]
