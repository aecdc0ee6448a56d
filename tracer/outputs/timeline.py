"""A trace turned into what a timeline shows: one `UnitTimeline` per watched unit plus the
host, each with its memory, limit, pressure, GPU and probe series and its markers. Pure: it
reads events (from a file with `load`, or any iterable with `build`) and returns data; the
HTML report and the Perfetto export both draw from it, so they group and count alike.

Units are the analyzer's (``Verdict.unit`` and ``Analyzer.unit_of_pid``: a container, a
service, a recorded command tree), never grouped a second way here. Each process is put in the
unit its verdict names; a process that had no verdict (still running when the recording ended)
in the unit the analyzer's process table gives it, else (gone from the bounded table) in what
its cgroup path names. A memory cgroup belongs to the unit most of its processes belong to; a
sampled cgroup that held no watched process and has no sampled descendant (a ``--cgroup``
target whose processes never exec'd) is a unit of its own. Ancestors are not units: their
limits (and, where they have one, their usage) are drawn as the nested limits of the units below
them, because a parent's limit is often the one that kills (ARCHITECTURE.md: "Limits nest").

The effective limit of a cgroup is taken from the recorder's ``EffectiveLimit`` events when
the trace has them (they name the cgroup that sets it), else computed as the smallest known
limit along the chain at each moment.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tracer.analysis.analyzer import Analyzer, Restart, Verdict, describe_status
from tracer.analysis.quantities import fmt_bytes
from tracer.analysis.wording import lost_records
from tracer.events import (
    SI_KERNEL,
    CgroupInfo,
    CgroupMkdir,
    CgroupSample,
    EffectiveLimit,
    Event,
    Exec,
    Exit,
    Fork,
    GpuAllocFailure,
    GpuLost,
    GpuOomRecovered,
    GpuProcessSample,
    GpuSample,
    GpuXid,
    HostSample,
    KmsgOom,
    Lost,
    OomKill,
    ProbeSample,
    ReclaimStall,
    ReclaimSummary,
    Signal,
    signal_name,
)
from tracer.outputs.tail import TailLine, feed_of
from tracer.parse import cgpath
from tracer.trace.format import TraceFooter, TraceHeader
from tracer.trace.reader import TraceReader

# Marker kinds, in the order a legend lists them.
OOM, SIGNAL, EXIT, RESTART, GPU_FAIL, GPU_DOWN, LOST = (
    "oom",
    "signal",
    "exit",
    "restart",
    "gpu_alloc_fail",
    "gpu_down",
    "lost",
)
MARKER_KINDS = (OOM, SIGNAL, EXIT, RESTART, GPU_FAIL, GPU_DOWN, LOST)


# the tail's lines that end a warning (tracer/outputs/tail.py: "eta     ...", "thrash  ...")
WARNED = ("eta ", "thrash ")


@dataclass(frozen=True, slots=True)
class Marker:
    """A moment worth a vertical line: an OOM kill, a signal, an exit, a restart..."""

    ts: int
    kind: str  # one of MARKER_KINDS
    label: str  # short, for the chart
    detail: str  # one sentence, for tooltips, tables and Perfetto args
    pid: int | None = None


@dataclass
class CgroupSeries:
    """One memory cgroup's samples, column-wise (``None`` where a sample lacked the value)."""

    cgroup_id: int
    path: str
    info_limit: int | None = None  # the limit CgroupInfo saw when the cgroup was first named
    ts: list[int] = field(default_factory=list)
    usage: list[int | None] = field(default_factory=list)
    limit: list[int | None] = field(default_factory=list)
    high: list[int | None] = field(default_factory=list)
    peak: list[int | None] = field(default_factory=list)
    anon: list[int | None] = field(default_factory=list)
    file: list[int | None] = field(default_factory=list)  # includes shmem (v1 cache, v2 file)
    shmem: list[int | None] = field(default_factory=list)
    psi_some: list[float | None] = field(default_factory=list)
    effective: list[EffectiveLimit] = field(default_factory=list)
    oom_limits: list[tuple[int, int]] = field(default_factory=list)  # (ts, limit) from OomKill
    # what `tail` warned about this cgroup while it was recorded: time-to-limit estimates
    # (TailLine.eta) and page-cache thrash (TailLine.thrash), with the lines that ended them
    warnings: list[TailLine] = field(default_factory=list)

    def add(self, s: CgroupSample) -> None:
        self.ts.append(s.ts)
        self.usage.append(s.usage_bytes)
        self.limit.append(s.limit_bytes)
        self.high.append(s.high_bytes)
        self.peak.append(s.peak_bytes)
        self.anon.append(s.stat.get("anon"))
        self.file.append(s.stat.get("file"))
        self.shmem.append(s.stat.get("shmem"))
        self.psi_some.append(s.psi_some_avg10)

    @property
    def sampled(self) -> bool:
        return bool(self.ts)

    def peak_usage(self) -> int | None:
        values = [v for v in (*self.usage, *self.peak) if v is not None]
        return max(values) if values else None

    def limit_points(self, start_ns: int, end_ns: int) -> list[tuple[int, int | None]]:
        """This cgroup's own limit over time: from its samples, else from what CgroupInfo,
        an OOM kill or an EffectiveLimit naming it said (a constant over the recording)."""
        if self.ts and any(v is not None for v in self.limit):
            return list(zip(self.ts, self.limit, strict=True))
        known = self.info_limit
        if known is None and self.oom_limits:
            known = self.oom_limits[-1][1]
        return [(start_ns, known), (end_ns, known)] if known is not None else []

    def high_points(self) -> list[tuple[int, int | None]]:
        if any(v is not None for v in self.high):
            return list(zip(self.ts, self.high, strict=True))
        return []


@dataclass
class LimitLine:
    """A limit that applies to a unit: set on one of its cgroups or on an ancestor."""

    path: str
    points: list[tuple[int, int | None]]  # (ts, bytes); None: no limit from then on
    own: bool  # set on one of the unit's own cgroups (vs an ancestor)
    kind: str = "max"  # "max" (memory.max / limit_in_bytes) or "high" (memory.high)

    def values(self) -> list[int]:
        return [v for _, v in self.points if v is not None]

    @property
    def what(self) -> str:
        """What the line is called in every output: "memory.high" or "limit"."""
        return "memory.high" if self.kind == "high" else "limit"

    def label(self) -> str:
        vals = sorted(set(self.values()))
        what = self.what
        if not vals:
            return f"{what} {self.path}: none"
        if len(vals) == 1:
            return f"{what} {self.path}: {fmt_bytes(vals[0])}"
        return f"{what} {self.path}: {fmt_bytes(vals[0])}..{fmt_bytes(vals[-1])}"


def _value_at(line: LimitLine, t: int) -> int | None:
    """The limit ``line`` set at time ``t`` (None: none yet, or none from then on)."""
    value = None
    for ts, v in line.points:
        if ts > t:
            break
        value = v
    return value


@dataclass
class EffectiveLine:
    """The strictest limit over one cgroup and its ancestors, over time."""

    path: str  # the cgroup it applies to
    points: list[tuple[int, int | None, str | None]]  # (ts, bytes, path of the cgroup setting it)

    def label(self) -> str:
        last = next(((v, by) for _, v, by in reversed(self.points) if v is not None), None)
        if last is None:
            return f"effective limit of {self.path}: none"
        value, by = last
        return f"effective limit {fmt_bytes(value)} (set by {by or '?'})"


@dataclass
class UnitTimeline:
    key: str
    label: str
    first_ts: int
    cgroups: list[CgroupSeries] = field(default_factory=list)  # where its processes lived
    ancestors: list[CgroupSeries] = field(default_factory=list)  # above them, with a limit
    limits: list[LimitLine] = field(default_factory=list)
    effective: list[EffectiveLine] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)
    stalls: list[ReclaimStall] = field(default_factory=list)
    summaries: list[ReclaimSummary] = field(default_factory=list)
    probes: list[ProbeSample] = field(default_factory=list)
    gpu_procs: list[GpuProcessSample] = field(default_factory=list)
    gpu_failures: list[GpuAllocFailure] = field(default_factory=list)
    gpu_recovered: list[GpuOomRecovered] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)

    @property
    def leaves(self) -> list[CgroupSeries]:
        """The unit's cgroups that are not ancestors of another of its cgroups: where its
        memory is charged first (their breakdown is not counted twice)."""
        return [
            c
            for c in self.cgroups
            if not any(o is not c and cgpath.is_ancestor(c.path, o.path) for o in self.cgroups)
        ]


@dataclass
class HostTimeline:
    samples: list[HostSample] = field(default_factory=list)
    kswapd: list[ReclaimSummary] = field(default_factory=list)
    reclaim: list[ReclaimSummary] = field(default_factory=list)  # host-wide (cgroup id 0)
    gpus: dict[int, list[GpuSample]] = field(default_factory=dict)  # device index -> samples
    gpu_names: dict[int, str] = field(default_factory=dict)
    probes: list[ProbeSample] = field(default_factory=list)  # probes no unit claimed
    markers: list[Marker] = field(default_factory=list)


@dataclass
class Timeline:
    header: TraceHeader
    footer: TraceFooter | None
    warnings: list[str]
    start_ns: int
    end_ns: int
    units: list[UnitTimeline]
    host: HostTimeline
    verdicts: list[Verdict]
    restarts: list[Restart]
    restart_counts: list[tuple[str, int, int | None, str]]
    cgroup_paths: dict[int, str]
    counts: dict[str, int]  # events per kind
    # cgroup id -> its first record in the trace (its creation, or when it was first named)
    cgroup_first_ns: dict[int, int] = field(default_factory=dict)

    def rel_s(self, ts: int) -> float:
        """Seconds since the start of the recording."""
        return (ts - self.start_ns) / 1e9

    def stall_span(self, s: ReclaimSummary) -> tuple[int, int]:
        """When a reclaim summary's stalls can have happened: its interval, from no earlier
        than its cgroup's first record (a cgroup made during the recording stalled nothing
        before it existed; the chart's band must not start before it)."""
        start = max(s.ts - s.interval_ns, self.cgroup_first_ns.get(s.cgroup_id, 0))
        return min(start, s.ts), s.ts


def thin(points: list[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """At most about ``max_points`` points, keeping each bucket's lowest and highest value in
    time order: a long recording's chart keeps its peaks (what met the limit) and dips."""
    if len(points) <= max_points or max_points < 4:
        return points
    buckets = max_points // 2
    size = len(points) / buckets
    out: list[tuple[int, float]] = []
    for b in range(buckets):
        chunk = points[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


# ---------------------------------------------------------------------------------------------
# Building


def load(path: str | os.PathLike[str]) -> Timeline:
    """Read a trace file (plain or zstd) into a `Timeline`. Raises `TraceFileError` as the
    reader does; a trace cut short gives what it holds, with the reader's warning."""
    with TraceReader(path) as reader:
        timeline = build(reader.header, reader)
        timeline.footer = reader.footer
        timeline.warnings = [*reader.warnings, *timeline.warnings]
    return timeline


def build(header: TraceHeader, events: Iterable[Event]) -> Timeline:
    """One pass over the events: analysis (the verdicts) and the series together."""
    b = _Builder(header)
    for ev in events:
        b.add(ev)
    return b.finish()


class _Builder:
    def __init__(self, header: TraceHeader) -> None:
        self.header = header
        self.analyzer = Analyzer.from_header(header.targets)
        # the tail's own feed on the same analyzer: the report shows what tail warned
        self.tail = feed_of(lambda: self.analyzer)
        self.counts: Counter[str] = Counter()
        self.end_ns = header.started_ns
        self.cgroups: dict[int, CgroupSeries] = {}
        # pid -> the memory cgroup it was last seen in: processes move into a cgroup (the
        # `echo $$ > cgroup.procs && exec` idiom), rarely out, so the last one is theirs.
        self.pid_cgroup: dict[int, int] = {}
        self.first_seen: dict[int, int] = {}  # pid -> first ts
        self.exits: list[Exit] = []
        self.signals: list[Signal] = []
        self.ooms: list[OomKill] = []
        self.kmsg: list[KmsgOom] = []
        self.stalls: list[ReclaimStall] = []
        self.summaries: list[ReclaimSummary] = []
        self.probes: list[ProbeSample] = []
        self.gpu_procs: list[GpuProcessSample] = []
        self.gpu_failures: list[GpuAllocFailure] = []
        self.gpu_recovered: list[GpuOomRecovered] = []
        self.host = HostTimeline()
        self.cgroup_first_ns: dict[int, int] = {}

    def _cg(self, cgroup_id: int, path: str | None = None) -> CgroupSeries:
        cg = self.cgroups.get(cgroup_id)
        if cg is None:
            cg = self.cgroups[cgroup_id] = CgroupSeries(cgroup_id, path or "")
        elif path and not cg.path:
            cg.path = path
        return cg

    def _seen(self, pid: int, cgroup_id: int, ts: int) -> None:
        if pid <= 0:
            return
        self.first_seen.setdefault(pid, ts)
        if cgroup_id:
            self.pid_cgroup[pid] = cgroup_id
            self._cg(cgroup_id)

    def add(self, ev: Event) -> None:
        self.analyzer.feed(ev)
        self.counts[ev.KIND] += 1
        self.end_ns = max(self.end_ns, ev.ts)
        if isinstance(ev, CgroupSample):
            cg = self._cg(ev.cgroup_id, ev.path)
            cg.add(ev)
            cg.warnings += [
                ln
                for ln in self.tail.feed(ev)
                if ln.eta is not None or ln.thrash is not None or ln.text.startswith(WARNED)
            ]
        elif isinstance(ev, CgroupInfo | CgroupMkdir):
            self.cgroup_first_ns.setdefault(ev.cgroup_id, ev.ts)
            cg = self._cg(ev.cgroup_id, ev.path)
            if isinstance(ev, CgroupInfo):
                cg.info_limit = ev.limit_bytes
        elif isinstance(ev, EffectiveLimit):
            self._cg(ev.cgroup_id, ev.path).effective.append(ev)
        elif isinstance(ev, Exec):
            self._seen(ev.pid, ev.cgroup_id, ev.ts)
        elif isinstance(ev, Fork):
            self._seen(ev.parent_pid, ev.cgroup_id, ev.ts)
            self._seen(ev.child_pid, ev.cgroup_id, ev.ts)
        elif isinstance(ev, Exit):
            self.exits.append(ev)
            self._seen(ev.pid, ev.cgroup_id, ev.ts)
        elif isinstance(ev, Signal):
            self.signals.append(ev)
        elif isinstance(ev, OomKill):
            self.ooms.append(ev)
            self._seen(ev.victim_pid, ev.victim_cgroup_id, ev.ts)
            if ev.limit_cgroup_id and ev.limit_bytes:
                self._cg(ev.limit_cgroup_id).oom_limits.append((ev.ts, ev.limit_bytes))
        elif isinstance(ev, KmsgOom):
            self.kmsg.append(ev)
        elif isinstance(ev, ReclaimStall):
            self.stalls.append(ev)
            self._seen(ev.pid, ev.task_cgroup_id, ev.ts)
        elif isinstance(ev, ReclaimSummary):
            if ev.kind == "kswapd":
                self.host.kswapd.append(ev)
            elif ev.cgroup_id == 0:
                self.host.reclaim.append(ev)
            else:
                self.summaries.append(ev)
        elif isinstance(ev, HostSample):
            self.host.samples.append(ev)
        elif isinstance(ev, ProbeSample):
            self.probes.append(ev)
        elif isinstance(ev, GpuSample):
            self.host.gpus.setdefault(ev.index, []).append(ev)
            self.host.gpu_names[ev.index] = ev.name
        elif isinstance(ev, GpuProcessSample):
            self.gpu_procs.append(ev)
        elif isinstance(ev, GpuAllocFailure):
            self.gpu_failures.append(ev)
            self._seen(ev.pid, ev.cgroup_id, ev.ts)
        elif isinstance(ev, GpuOomRecovered):
            self.gpu_recovered.append(ev)
        elif isinstance(ev, GpuXid):
            who = f" (pid {ev.pid}, {ev.proc_name})" if ev.pid else ""
            self.host.markers.append(
                Marker(ev.ts, GPU_DOWN, f"Xid {ev.xid}", f"GPU Xid {ev.xid}{who}: {ev.message}")
            )
        elif isinstance(ev, GpuLost):
            self.host.markers.append(
                Marker(ev.ts, GPU_DOWN, "GPU lost", f"GPU {ev.device} lost: {ev.reason}")
            )
        elif isinstance(ev, Lost):
            self.host.markers.append(
                Marker(ev.ts, LOST, f"lost {ev.count}", lost_records(ev.count))
            )

    # -- grouping ------------------------------------------------------------------------------

    def _path(self, cgroup_id: int) -> str:
        cg = self.cgroups.get(cgroup_id)
        if cg is not None and cg.path:
            return cg.path
        return self.analyzer.cgroup_path(cgroup_id) or f"cgroup id {cgroup_id}"

    def _cgroup_unit(self, cgroup_id: int) -> tuple[str, str] | None:
        """(key, label) of what a cgroup itself names, as the analyzer names it: a runtime's
        unit, a service, a path."""
        named = self.analyzer.unit_of_cgroup(cgroup_id, self._path(cgroup_id))
        if named is None:
            return None
        return named.key, (named.label if named.kind != "cgroup" else f"cgroup {named.label}")

    def finish(self) -> Timeline:
        self.analyzer.finish()
        verdicts = list(self.analyzer.verdicts)
        restarts = self.analyzer.restarts
        start = self.header.started_ns
        end = self.end_ns
        for cg in self.cgroups.values():
            if not cg.path:
                cg.path = self._path(cg.cgroup_id)
        units = self._units(verdicts, end)
        for u in units.values():
            self._limits(u, start, end)
        self._assign_events(units, verdicts, restarts)
        ordered = sorted(units.values(), key=lambda u: (u.first_ts, u.label))
        return Timeline(
            header=self.header,
            footer=None,
            warnings=list(self.analyzer.warnings),
            start_ns=start,
            end_ns=max(end, start),
            units=ordered,
            host=self.host,
            verdicts=verdicts,
            restarts=restarts,
            restart_counts=self.analyzer.restart_counts(),
            cgroup_paths={cid: cg.path for cid, cg in self.cgroups.items()},
            counts=dict(self.counts),
            cgroup_first_ns=dict(self.cgroup_first_ns),
        )

    def _units(self, verdicts: list[Verdict], end: int) -> dict[str, UnitTimeline]:
        """The units, each with its processes and cgroups (without limits and events yet)."""
        # pid -> unit label: the verdict's, else the analyzer's (its process table names the
        # unit of a process still running at the end), else the cgroup's (a process the
        # bounded table no longer holds)
        pid_unit: dict[int, str] = {}
        for v in verdicts:
            if v.unit:
                pid_unit.setdefault(v.pid, v.unit)
        labels: dict[str, str] = {u: u for u in pid_unit.values()}  # key -> label

        def unit_of_pid(pid: int) -> str | None:
            label = pid_unit.get(pid) or self.analyzer.unit_of_pid(pid)
            if label is not None:
                labels.setdefault(label, label)
                return label
            cid = self.pid_cgroup.get(pid)
            if cid is not None:
                named = self._cgroup_unit(cid)
                if named is not None:
                    labels.setdefault(named[0], named[1])
                    return named[0]
            return None

        pids_by_unit: dict[str, set[int]] = {}
        for pid in sorted(self.first_seen, key=lambda p: self.first_seen[p]):
            key = unit_of_pid(pid)
            if key is not None:
                pids_by_unit.setdefault(key, set()).add(pid)
        for v in verdicts:  # verdicts of pids seen nowhere else (an exit alone)
            if v.unit:
                pids_by_unit.setdefault(v.unit, set()).add(v.pid)

        # cgroup -> unit: where most of its processes belong
        votes: dict[int, Counter[str]] = {}
        for key, pids in pids_by_unit.items():
            for pid in pids:
                if pid in self.pid_cgroup:
                    votes.setdefault(self.pid_cgroup[pid], Counter())[key] += 1
        cgroup_unit: dict[int, str] = {cid: c.most_common(1)[0][0] for cid, c in votes.items()}

        # sampled cgroups that held no watched process and have nothing sampled below them
        held = set(cgroup_unit)
        for cg in self.cgroups.values():
            if cg.cgroup_id in held or not cg.sampled or cg.path == "/":
                continue
            below = any(
                cgpath.is_ancestor(cg.path, o.path) and (o.sampled or o.cgroup_id in held)
                for o in self.cgroups.values()
            )
            if below:
                continue
            named = self._cgroup_unit(cg.cgroup_id)
            if named is not None:
                labels.setdefault(named[0], named[1])
                cgroup_unit[cg.cgroup_id] = named[0]
                pids_by_unit.setdefault(named[0], set())

        units: dict[str, UnitTimeline] = {}
        for key, pids in pids_by_unit.items():
            first = min((self.first_seen.get(p, end) for p in pids), default=end)
            units[key] = UnitTimeline(key=key, label=labels.get(key, key), first_ts=first)
            units[key].pids = set(pids)
        for cid, key in cgroup_unit.items():
            units[key].cgroups.append(self.cgroups[cid])
        for u in units.values():
            u.cgroups.sort(key=lambda c: c.path)
            first_cg = min((c.ts[0] for c in u.cgroups if c.ts), default=u.first_ts)
            u.first_ts = min(u.first_ts, first_cg)
        return units

    def _limits(self, u: UnitTimeline, start: int, end: int) -> None:
        """The unit's nested limits, its limited ancestors, and each leaf's effective limit."""
        own_ids = {c.cgroup_id for c in u.cgroups}
        chain: dict[str, CgroupSeries] = {}
        for c in u.cgroups:
            chain[c.path] = c
            for other in self.cgroups.values():
                if cgpath.is_ancestor(other.path, c.path):
                    chain.setdefault(other.path, other)
        for path in sorted(chain, key=lambda p: (-p.count("/"), p)):
            cg = chain[path]
            points = cg.limit_points(start, end)
            own = cg.cgroup_id in own_ids
            if any(v is not None for _, v in points):
                u.limits.append(LimitLine(path, points, own))
                if not own:
                    u.ancestors.append(cg)
            high = cg.high_points()
            if any(v is not None for _, v in high):
                u.limits.append(LimitLine(path, high, own, kind="high"))
        for leaf in u.leaves:
            if leaf.effective:
                pts = [(e.ts, e.limit_bytes, e.set_by) for e in leaf.effective]
            else:
                pts = self._computed_effective(leaf, u.limits)
            if any(v is not None for _, v, _ in pts):
                # carry the last value to the end, so the line spans the chart
                pts.append((max(end, pts[-1][0]), pts[-1][1], pts[-1][2]))
                u.effective.append(EffectiveLine(leaf.path, pts))

    @staticmethod
    def _computed_effective(
        leaf: CgroupSeries, limits: list[LimitLine]
    ) -> list[tuple[int, int | None, str | None]]:
        lines = [
            ln
            for ln in limits
            if ln.kind == "max" and (ln.path == leaf.path or cgpath.is_ancestor(ln.path, leaf.path))
        ]
        times = sorted({ts for ln in lines for ts, _ in ln.points})
        out: list[tuple[int, int | None, str | None]] = []
        for t in times:
            limit, where = cgpath.effective_limit((ln.path, _value_at(ln, t)) for ln in lines)
            out.append((t, limit, where))
        return out

    def _assign_events(
        self, units: dict[str, UnitTimeline], verdicts: list[Verdict], restarts: list[Restart]
    ) -> None:
        by_pid: dict[int, UnitTimeline] = {}
        by_cgroup: dict[int, UnitTimeline] = {}
        for unit in units.values():
            for pid in unit.pids:
                by_pid.setdefault(pid, unit)
            for c in unit.cgroups:
                by_cgroup[c.cgroup_id] = unit
            chain_ids = {c.cgroup_id for c in (*unit.cgroups, *unit.ancestors)}
            unit.summaries = [s for s in self.summaries if s.cgroup_id in chain_ids]
        by_label = {u.label: u for u in units.values()}

        def unit_for(pid: int, cgroup_id: int = 0) -> UnitTimeline | None:
            return by_pid.get(pid) or by_cgroup.get(cgroup_id)

        u: UnitTimeline | None
        for v in verdicts:
            u = by_label.get(v.unit or "") or by_pid.get(v.pid)
            if u is not None:
                u.verdicts.append(v)
        for r in restarts:
            u = by_label.get(r.unit)
            (u.markers if u is not None else self.host.markers).append(_restart_marker(r))
        oom_victims = {o.victim_pid for o in self.ooms}
        for o in self.ooms:
            m = _oom_marker(o, self._path(o.limit_cgroup_id))
            u = unit_for(o.victim_pid, o.victim_cgroup_id)
            (u.markers if u is not None else self.host.markers).append(m)
            if not o.memcg and u is not None:
                self.host.markers.append(m)
        for k in self.kmsg:
            if k.victim_pid in oom_victims:
                continue  # the BPF event already marks it; the kernel log agrees or not
            u = by_pid.get(k.victim_pid)
            (u.markers if u is not None else self.host.markers).append(_kmsg_marker(k))
        for s in self.signals:
            u = by_pid.get(s.target_pid)
            if u is not None:
                u.markers.append(_signal_marker(s))
        for ex in self.exits:
            u = unit_for(ex.pid, ex.cgroup_id)
            if u is not None:
                u.markers.append(_exit_marker(ex))
        for st in self.stalls:
            u = unit_for(st.pid, st.task_cgroup_id)
            if u is not None:
                u.stalls.append(st)
        for gp in self.gpu_procs:
            u = by_pid.get(gp.pid)
            if u is not None:
                u.gpu_procs.append(gp)
        for gf in self.gpu_failures:
            u = unit_for(gf.pid, gf.cgroup_id)
            m = _gpu_failure_marker(gf)
            if u is not None:
                u.gpu_failures.append(gf)
                u.markers.append(m)
            else:
                self.host.markers.append(m)
        for gr in self.gpu_recovered:
            u = unit_for(gr.pid, gr.cgroup_id)
            if u is not None:
                u.gpu_recovered.append(gr)
        for p in self.probes:
            u = by_label.get(p.unit) if p.unit else None
            if u is None and len(units) == 1:
                u = next(iter(units.values()))  # one unit: the probe can only check it
            (u.probes if u is not None else self.host.probes).append(p)
        for unit in units.values():
            unit.markers.sort(key=lambda m: (m.ts, MARKER_KINDS.index(m.kind)))
            unit.restarts = [r for r in restarts if r.unit == unit.label]
        self.host.markers.sort(key=lambda m: (m.ts, MARKER_KINDS.index(m.kind)))


# -- the marks events leave on a unit's (or the host's) timeline ---------------------------------


def _restart_marker(r: Restart) -> Marker:
    return Marker(
        r.ts,
        RESTART,
        f"restart → pid {r.new_pid}",
        f"{r.unit} restarted: pid {r.old_pid} -> pid {r.new_pid} after "
        f"{r.downtime_ns / 1e9:.1f} s down ({r.cause})",
        r.new_pid,
    )


def _oom_marker(o: OomKill, limit_path: str) -> Marker:
    where = (
        f"{limit_path} at {fmt_bytes(o.usage_bytes)} of {fmt_bytes(o.limit_bytes)}"
        if o.memcg
        else "the host (global OOM)"
    )
    return Marker(
        o.ts,
        OOM,
        f"OOM kill pid {o.victim_pid}",
        f"OOM killer chose pid {o.victim_pid} ({o.victim_comm}): {where}",
        o.victim_pid,
    )


def _kmsg_marker(k: KmsgOom) -> Marker:
    return Marker(
        k.ts,
        OOM,
        f"OOM kill pid {k.victim_pid}",
        f"kernel log: OOM killed pid {k.victim_pid} ({k.victim_comm}), "
        f"{k.constraint or 'no constraint line'}"
        + (f", oom_memcg={k.oom_memcg}" if k.oom_memcg else ""),
        k.victim_pid,
    )


def _signal_marker(s: Signal) -> Marker:
    name = signal_name(s.sig)
    sender = (
        f"the kernel (in {s.sender_comm})"
        if s.si_code == SI_KERNEL
        else f"pid {s.sender_pid} ({s.sender_comm})"
    )
    return Marker(
        s.ts,
        SIGNAL,
        f"{name} → pid {s.target_pid}",
        f"{name} from {sender} to pid {s.target_pid} ({s.target_comm})",
        s.target_pid,
    )


def _exit_marker(ex: Exit) -> Marker:
    ws = ex.wait
    short = (
        f"exit pid {ex.pid}: {signal_name(ws.signal)}"
        if ws.signal is not None
        else f"exit pid {ex.pid}: code {ws.code}"
    )
    return Marker(ex.ts, EXIT, short, describe_status(ex), ex.pid)


def _gpu_failure_marker(gf: GpuAllocFailure) -> Marker:
    return Marker(
        gf.ts,
        GPU_FAIL,
        f"GPU alloc fail pid {gf.pid}",
        f"{gf.function}({fmt_bytes(gf.requested_bytes)}) failed with out of memory in "
        f"pid {gf.pid} ({gf.comm}), holding {fmt_bytes(gf.held_bytes)}",
        gf.pid,
    )


__all__ = [
    "MARKER_KINDS",
    "CgroupSeries",
    "EffectiveLine",
    "HostTimeline",
    "LimitLine",
    "Marker",
    "Timeline",
    "UnitTimeline",
    "build",
    "load",
    "thin",
]
