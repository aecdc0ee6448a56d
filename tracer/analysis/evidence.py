"""What the analysis remembers between events: a bounded, time-limited store of evidence per
process, per cgroup and for the host. Pure: fed events, asked questions.

Everything is kept for ``HISTORY_NS`` of stream time (a verdict looks at the minute before an
exit) and capped in count, so a week-long recording of a busy host stays small. Evictions are
counted, never silent.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tracer.analysis import units
from tracer.analysis.gpu_store import GpuStore
from tracer.analysis.quantities import STALL_KINDS, stall_total_ns
from tracer.events import (
    CgroupInfo,
    CgroupSample,
    EffectiveLimit,
    Event,
    HostSample,
    KmsgOom,
    Lost,
    OomKill,
    OomKillCount,
    ProbeSample,
    ReclaimStall,
    ReclaimSummary,
    RuntimeExit,
    RuntimeSample,
    Signal,
    TmpfsFull,
    UnitInfo,
)

HISTORY_NS = 60 * 1_000_000_000
MAX_PIDS = 8192  # pids with evidence (and processes in tracer/analysis/processes.py)
MAX_CGROUPS = 1024
MAX_SIGNALS_PER_PID = 256  # (kept: the newest 256 to 512)
MAX_SAMPLES_PER_CGROUP = 1200  # 60 s at the fast 50 ms interval
# Cgroup samples are kept this much longer than the history window: an OOM kill's window starts
# a minute before the kill, which precedes the exit being judged.
SAMPLE_MARGIN_NS = 10 * 1_000_000_000


@dataclass
class PidEvidence:
    ooms: list[OomKill] = field(default_factory=list)
    kmsg: list[KmsgOom] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)  # fatal signals *to* this pid
    stalls: list[ReclaimStall] = field(default_factory=list)
    tmpfs: list[TmpfsFull] = field(default_factory=list)  # full tmpfs it saw at a SIGBUS


@dataclass
class CgroupEvidence:
    # a list with its timestamps beside it, for bisect (samples arrive in time order);
    # trimmed to the newest MAX_SAMPLES_PER_CGROUP when twice that long
    samples: list[CgroupSample] = field(default_factory=list)
    sample_ts: list[int] = field(default_factory=list)
    summaries: deque[ReclaimSummary] = field(default_factory=lambda: deque(maxlen=600))
    limit: EffectiveLimit | None = None


_T = TypeVar("_T")
_E = TypeVar("_E", bound=Event)


def _since(events: list[_E], horizon: int) -> list[_E]:
    if not events or events[0].ts >= horizon:
        return events
    return [e for e in events if e.ts >= horizon]


class Evidence:
    def __init__(self) -> None:
        self.cgroups: dict[int, CgroupInfo] = {}
        self.by_pid: OrderedDict[int, PidEvidence] = OrderedDict()
        self.by_cgroup: OrderedDict[int, CgroupEvidence] = OrderedDict()
        self.host: deque[HostSample] = deque(maxlen=1200)
        self.units: dict[int, UnitInfo] = {}
        self.ids_by_path: dict[str, int] = {}  # path -> the newest cgroup id there
        # path -> [(ts, id)]: the cgroups a path has named, in order (recreated at a restart)
        self.path_history: dict[str, list[tuple[int, int]]] = {}
        self.lost: deque[Lost] = deque(maxlen=256)
        self.probes: deque[ProbeSample] = deque(maxlen=4096)
        self.runtime: dict[str, list[RuntimeSample]] = {}  # unit label -> samples
        # what post-mortem reads after the fact: a supervisor's record of an exit, per cgroup
        # id, and cumulative oom_kill counters (the newest reading per cgroup id)
        self.runtime_exits: dict[int, list[RuntimeExit]] = {}
        self.oom_counts: dict[int, OomKillCount] = {}
        self.gpu = GpuStore()  # GPU events: tracer/analysis/gpu_store.py
        self.evicted = 0
        # what the store does with each kind of event it keeps (the analyzer calls these)
        self.intake = self._dispatch()

    # -- bounded maps -----------------------------------------------------------------------

    def _get(self, table: OrderedDict[int, _T], key: int, make: type[_T], cap: int) -> _T:
        item = table.get(key)
        if item is None:
            item = table[key] = make()
            if len(table) > cap:
                table.popitem(last=False)
                self.evicted += 1
        else:
            table.move_to_end(key)
        return item

    def pid(self, pid: int) -> PidEvidence:
        return self._get(self.by_pid, pid, PidEvidence, MAX_PIDS)

    def cgroup(self, cgroup_id: int) -> CgroupEvidence:
        return self._get(self.by_cgroup, cgroup_id, CgroupEvidence, MAX_CGROUPS)

    # -- intake -----------------------------------------------------------------------------

    def _dispatch(self) -> dict[type[Event], Callable[[Any], object]]:
        table: dict[type[Event], Callable[[Any], object]] = {
            CgroupInfo: self._cgroup_info,
            OomKill: lambda e: self.pid(e.victim_pid).ooms.append(e),
            KmsgOom: lambda e: self.pid(e.victim_pid).kmsg.append(e),
            Signal: self._signal,
            ReclaimStall: lambda e: self.pid(e.pid).stalls.append(e),
            TmpfsFull: lambda e: self.pid(e.pid).tmpfs.append(e),
            ReclaimSummary: lambda e: self.cgroup(e.cgroup_id).summaries.append(e),
            CgroupSample: self._cgroup_sample,
            EffectiveLimit: self._effective_limit,
            HostSample: self.host.append,
            UnitInfo: lambda e: self.units.__setitem__(e.cgroup_id, e),
            ProbeSample: self.probes.append,
            RuntimeSample: lambda e: self.runtime.setdefault(e.unit, []).append(e),
            RuntimeExit: self._runtime_exit,
            OomKillCount: lambda e: self.oom_counts.__setitem__(e.cgroup_id, e),
            Lost: self.lost.append,
        }
        for kind in GpuStore.KINDS:
            table[kind] = self.gpu.add
        return table

    def _signal(self, ev: Signal) -> None:
        kept = self.pid(ev.target_pid).signals
        kept.append(ev)
        if len(kept) > 2 * MAX_SIGNALS_PER_PID:
            # a signal storm at one process: its newest signals are what a verdict reads
            del kept[:MAX_SIGNALS_PER_PID]
            self.evicted += MAX_SIGNALS_PER_PID

    def _runtime_exit(self, ev: RuntimeExit) -> None:
        kept = self.runtime_exits.setdefault(ev.cgroup_id, [])
        kept.append(ev)
        if len(kept) > MAX_SIGNALS_PER_PID:  # (one per restart: bounded all the same)
            del kept[0]
            self.evicted += 1

    def _cgroup_info(self, ev: CgroupInfo) -> None:
        self.cgroups[ev.cgroup_id] = ev
        self.ids_by_path[ev.path] = ev.cgroup_id
        history = self.path_history.setdefault(ev.path, [])
        if not history or history[-1][1] != ev.cgroup_id:
            history.append((ev.ts, ev.cgroup_id))
            del history[:-8]

    def _cgroup_sample(self, ev: CgroupSample) -> None:
        cg = self.cgroup(ev.cgroup_id)
        if cg.sample_ts and ev.ts < cg.sample_ts[-1]:  # late: keep the list sorted
            i = bisect.bisect_right(cg.sample_ts, ev.ts)
            cg.samples.insert(i, ev)
            cg.sample_ts.insert(i, ev.ts)
        else:
            cg.samples.append(ev)
            cg.sample_ts.append(ev.ts)
        if len(cg.samples) > 2 * MAX_SAMPLES_PER_CGROUP:
            del cg.samples[:MAX_SAMPLES_PER_CGROUP]
            del cg.sample_ts[:MAX_SAMPLES_PER_CGROUP]

    def _effective_limit(self, ev: EffectiveLimit) -> None:
        self.cgroup(ev.cgroup_id).limit = ev

    def forget_pid(self, pid: int, until: int, claimed_until: int | None = None) -> None:
        """Drop a pid's evidence up to ``until`` (its exit): what came later belongs to the
        next process that reuses the pid. ``claimed_until``: the exit's verdict was an OOM
        kill; the OOM reports it used (up to a settle past the exit) go with it."""
        self.gpu.forget_pid(pid, until)
        ev = self.by_pid.get(pid)
        if ev is None:
            return
        oom_until = until if claimed_until is None else claimed_until
        ev.ooms = [e for e in ev.ooms if e.ts > oom_until]
        ev.kmsg = [e for e in ev.kmsg if e.ts > oom_until]
        ev.signals = [e for e in ev.signals if e.ts > until]
        ev.stalls = [e for e in ev.stalls if e.ts > until]
        # (read up to a second after the signal, so maybe after the exit: the exit's own)
        ev.tmpfs = [e for e in ev.tmpfs if e.ts > until + 1_000_000_000]
        if not (ev.ooms or ev.kmsg or ev.signals or ev.stalls or ev.tmpfs):
            del self.by_pid[pid]

    def forget_cgroups(self, ids: Iterable[int]) -> None:
        """Drop what is kept about cgroups that are gone (an always-on agent sees thousands
        made and removed: a name, a path, its samples, each): their ids never come back."""
        for cid in ids:
            info = self.cgroups.pop(cid, None)
            self.units.pop(cid, None)
            self.by_cgroup.pop(cid, None)
            self.runtime_exits.pop(cid, None)
            self.oom_counts.pop(cid, None)
            if info is None:
                continue
            path = info.path
            if self.ids_by_path.get(path) == cid:
                del self.ids_by_path[path]
            history = [h for h in self.path_history.get(path, ()) if h[1] != cid]
            if history:
                self.path_history[path] = history
            else:
                self.path_history.pop(path, None)

    def prune(self, now: int) -> None:
        """Drop per-pid evidence and cgroup samples older than the history window (exits not
        yet judged are all later than ``now``: nothing they look at is dropped). A pid's OOM
        reports and its newest signal stay until its exit (bounded by the pid cap): a victim
        can take minutes to die (stuck in D state), and its verdict needs them."""
        horizon = now - HISTORY_NS
        self.gpu.prune(horizon)
        for cg in self.by_cgroup.values():
            old = bisect.bisect_left(cg.sample_ts, horizon - SAMPLE_MARGIN_NS)
            if old:
                del cg.samples[:old]
                del cg.sample_ts[:old]
        for ev in self.by_pid.values():
            signals = ev.signals
            if signals and signals[0].ts < horizon:
                ev.signals = _since(signals, horizon) or signals[-1:]
            ev.stalls = _since(ev.stalls, horizon)
            ev.tmpfs = _since(ev.tmpfs, horizon)

    # -- questions --------------------------------------------------------------------------

    def path(self, cgroup_id: int) -> str | None:
        info = self.cgroups.get(cgroup_id)
        return info.path if info else None

    def id_of_path(self, path: str, at: int | None = None) -> int | None:
        """The cgroup id at this path: the newest seen, or the one that was there at ``at``
        (a restart may recreate a cgroup at the same path with a new id)."""
        if at is None:
            return self.ids_by_path.get(path)
        history = self.path_history.get(path)
        if not history:
            return None
        best = history[0][1]
        for ts, cid in history:
            if ts <= at:
                best = cid
        return best

    def ancestry(self, cgroup_id: int, at: int | None = None) -> list[int]:
        """The cgroup and its known ancestors (those there at ``at``), innermost first."""
        path = self.path(cgroup_id)
        if path is None:
            return [cgroup_id]
        out = [cgroup_id]
        while path != "/":
            path = path.rsplit("/", 1)[0] or "/"
            cid = self.id_of_path(path, at)
            if cid is not None:
                out.append(cid)
        return out

    def cgroup_label(self, cgroup_id: int, path: str | None) -> str:
        """A cgroup as users know it: the container or service it is, else its path."""
        info = self.units.get(cgroup_id)
        if info is not None:
            return units.from_info(info.kind, info.unit_id, info.name, info.pod).label
        return path or "a memory cgroup"

    def samples_between(self, cgroup_id: int, start: int, end: int) -> list[CgroupSample]:
        ev = self.by_cgroup.get(cgroup_id)
        if ev is None:
            return []
        lo = bisect.bisect_left(ev.sample_ts, start)
        hi = bisect.bisect_right(ev.sample_ts, end)
        return ev.samples[lo:hi]

    def stall_ns(
        self,
        cgroup_ids: Iterable[int],
        start: int,
        end: int,
        kinds: tuple[str, ...] = STALL_KINDS,
    ) -> int:
        """Stall time aggregated in the kernel for these cgroups over [start, end], as
        `quantities.stall_total_ns` defines it."""
        total = 0
        for cid in set(cgroup_ids):
            ev = self.by_cgroup.get(cid)
            if ev is not None:
                total += stall_total_ns(ev.summaries, start, end, kinds)
        return total

    def probes_between(
        self, start: int, end: int, unit: str | None, unlabelled: bool = False
    ) -> list[ProbeSample]:
        """Probes in [start, end] that check this unit; with ``unlabelled``, also the probes
        recorded without a unit (the analyzer says so when this is the only unit there is)."""
        return [
            p
            for p in self.probes
            if start <= p.ts <= end and (p.unit == unit if p.unit else unlabelled)
        ]

    def lost_between(self, start: int, end: int) -> list[Lost]:
        return [x for x in self.lost if start <= x.ts <= end]

    def psi_peak(self, start: int, end: int) -> float | None:
        values = [
            h.psi_some_avg10
            for h in self.host
            if start <= h.ts <= end and h.psi_some_avg10 is not None
        ]
        return max(values) if values else None

    def host_at(self, ts: int) -> HostSample | None:
        best = None
        for h in self.host:
            if h.ts <= ts:
                best = h
            else:
                break
        return best
