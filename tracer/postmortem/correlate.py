"""Facts read after the fact → one time-ordered event stream for the analyzer. Pure: no files,
no clock; the gatherer passes the clock offsets it read.

Clocks: kernel-log records are on CLOCK_MONOTONIC (``local_clock()``), runtimes stamp exits in
wall-clock time, systemd in CLOCK_MONOTONIC; all are brought onto CLOCK_BOOTTIME through the
offsets taken once, now (``tracer.clock``).

What becomes an exit to judge (an ``Exit`` whose ``rung`` says who reported it):

* the runtime's record of the main process's last exit (``RuntimeExit`` beside it: the
  runtime's word is evidence of its own), its pid taken from the kernel's OOM report of a
  process in the target's cgroup between that run's start and its end, when there is one;
* every other OOM victim the kernel log names in the target's cgroups (killed by SIGKILL:
  the OOM killer's signal cannot be caught), which is how earlier runs of a restarted
  container, whose exit codes no runtime keeps, are judged.

A runtime's code is 128 + n for a process killed by signal n: it becomes a SIGKILL wait status
for the analyzer, whose rules keep "exit 137 alone" ``unknown``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracer.analysis.units import UnitName, from_info, unit_of_cgroup
from tracer.events import (
    CgroupInfo,
    CgroupSample,
    Event,
    Exit,
    KmsgOom,
    OomKillCount,
    RuntimeExit,
    RuntimeSample,
    UnitInfo,
)
from tracer.parse import cgpath
from tracer.parse.kmsg import KmsgRecord, OomAssembler
from tracer.runtimes.base import ContainerInfo

SECOND = 1_000_000_000
# An OOM victim dies within moments of the kill; the runtime stamps the exit when it reaps it.
# The kill of a run's last process is looked for from the run's start to this long after its
# recorded end (clock conversion and the runtime's own delay).
MATCH_AFTER_NS = 1 * SECOND
# ids for cgroups that no longer exist (no inode to name them): far above any inode number
_SYNTHETIC = 1 << 62


@dataclass(frozen=True, slots=True)
class LoggedOom:
    """One OOM victim from the kernel log, with the memcg line of its report when printed."""

    oom: KmsgOom  # ts already on CLOCK_BOOTTIME
    usage_kb: int | None = None  # "memory: usage X kB, limit Y kB, failcnt Z" of oom_memcg
    limit_kb: int | None = None
    failcnt: int | None = None


@dataclass(frozen=True, slots=True)
class KernelLog:
    """What the kernel log ring held when it was read."""

    readable: bool
    error: str = ""  # why it could not be read ("" when it was)
    fix: str = ""  # what would let it be read
    records: int = 0
    first_ts: int | None = None  # CLOCK_BOOTTIME of the oldest record still in the ring
    first_seq: int | None = None  # > 0: older records were overwritten since boot
    ooms: tuple[LoggedOom, ...] = ()


def read_kernel_log(records: Sequence[KmsgRecord], monotonic_offset: int) -> KernelLog:
    """Assemble the OOM reports of a kernel log read from the start of its ring."""
    asm = OomAssembler()
    ooms: list[LoggedOom] = []
    for rec in records:
        ts = rec.ts_us * 1000 - monotonic_offset
        for ev in asm.feed(rec, ts):
            usage = asm.last_memcg_usage if ev.memcg else None
            ooms.append(LoggedOom(ev, *(usage or (None, None, None))))
    first = records[0] if records else None
    return KernelLog(
        readable=True,
        records=len(records),
        first_ts=None if first is None else first.ts_us * 1000 - monotonic_offset,
        first_seq=None if first is None else first.seq,
        ooms=tuple(ooms),
    )


@dataclass(frozen=True, slots=True)
class CgroupNow:
    """A memory cgroup as it is now (``exists`` False: gone; the numbers are then None)."""

    path: str
    cgroup_id: int  # its inode when it exists, else 0
    exists: bool
    limit_bytes: int | None = None
    usage_bytes: int | None = None
    peak_bytes: int | None = None
    failcnt: int | None = None
    events: dict[str, int] = field(default_factory=dict)  # oom, oom_kill, max, high...
    psi_some_total_us: int | None = None  # memory.pressure totals since creation (v2, or
    psi_full_total_us: int | None = None  # the unified twin of a v1 cgroup on a hybrid host)


@dataclass(frozen=True, slots=True)
class Target:
    """What was asked about, and how to recognise it in kernel-log memcg paths."""

    kind: str  # container, unit, pod, cgroup, pid, all
    spec: str  # as given on the command line
    label: str  # what to show
    ids: tuple[str, ...] = ()  # container ids, unit names, pod uids found in memcg paths
    paths: tuple[str, ...] = ()  # cgroup paths: the target is these and everything below
    pid: int | None = None

    def owns(self, entry: dict[str, Any]) -> bool:
        """Whether an agent journal entry (``tracer.agent.journal``) is about this target."""
        unit = str(entry.get("unit") or "")
        verdict = entry.get("verdict")
        limit = str(verdict.get("limit_cgroup") or "") if isinstance(verdict, dict) else ""
        if self.kind == "all":
            return True
        if self.kind == "pid":
            return entry.get("pid") == self.pid
        if self.kind in ("container", "unit"):
            return unit == self.label or any(_names(unit, i) for i in self.ids)
        if self.kind == "pod":
            return unit.startswith(f"pod {self.spec} ") or any(_names(limit, i) for i in self.ids)
        return any(cgpath.is_within(limit, p) for p in self.paths)

    def matches(self, oom: KmsgOom) -> bool:
        if self.kind == "all":
            return True
        if self.kind == "pid":
            return oom.victim_pid == self.pid
        for path in (oom.task_memcg, oom.oom_memcg if not oom.task_memcg else ""):
            if not path:
                continue
            if any(cgpath.is_within(path, p) for p in self.paths):
                return True
            if any(_names(path, ident) for ident in self.ids):
                return True
        return False


def _names(path: str, ident: str) -> bool:
    """``ident`` appears in ``path`` as a whole name: not as part of a longer id or name."""
    return re.search(rf"(?<![0-9A-Za-z_]){re.escape(ident)}(?![0-9A-Za-z])", path) is not None


@dataclass(frozen=True, slots=True)
class RuntimeState:
    """A runtime's record of the target (podman/docker inspect, systemctl show)."""

    info: ContainerInfo
    read_ns: int  # CLOCK_BOOTTIME when it was asked


@dataclass(frozen=True, slots=True)
class ContainerLogs:
    """What the kubelet keeps of one container of a pod in its log directory
    (``/var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log``): the current and the
    previous container's output, numbered by restart."""

    container: str
    restarts: int  # the highest N of N.log: how many times the kubelet restarted it
    previous_log: str  # the previous container's log file ("" when the kubelet kept none)
    previous_ns: int | None  # when that file was last written (CLOCK_BOOTTIME), its end
    last_line: str  # the previous container's last log line (its own words, untrusted)


@dataclass(frozen=True, slots=True)
class Facts:
    target: Target
    now_ns: int  # CLOCK_BOOTTIME when the facts were gathered
    since_ns: int  # only exits after this (CLOCK_BOOTTIME) are judged
    realtime_offset: int  # CLOCK_REALTIME - CLOCK_BOOTTIME now
    monotonic_offset: int  # CLOCK_MONOTONIC - CLOCK_BOOTTIME now
    hierarchy: str  # "memory" (v1) or "unified" (v2): CgroupInfo.hierarchy
    kernel_log: KernelLog
    cgroups: tuple[CgroupNow, ...] = ()  # the target's cgroups and every ancestor, now
    runtime: RuntimeState | None = None
    # --all: the runtimes' records of the containers the kernel log's reports name
    others: tuple[RuntimeState, ...] = ()
    kubelet: tuple[ContainerLogs, ...] = ()  # --pod: the kubelet's log directories
    # the always-on agent's verdict journal (tracer/agent/journal.py), when one is on this
    # host: its entries about the target (verdicts it reached from a recording)
    journal_path: str | None = None
    journal: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Assembled:
    events: list[Event]  # time-ordered, ready for Analyzer.feed_all
    ooms: tuple[LoggedOom, ...]  # the kernel log's OOM reports that name the target
    runtime_exit: RuntimeExit | None  # the runtime's record of the last exit, if judged
    runtime_exit_ns: int | None  # when the runtime says the last exit was, judged or not
    unit: UnitName | None


def _boottime(info: ContainerInfo, ns: int | None, facts: Facts) -> int | None:
    if ns is None:
        return None
    off = facts.monotonic_offset if info.times_clock == "monotonic" else facts.realtime_offset
    return ns - off


def wait_status(code: int) -> int:
    """A runtime's exit code → the kernel's wait status the analyzer reads: 128 + n (n a
    signal number, 1..64) is a death by signal n, as every runtime reports one."""
    if 128 < code <= 128 + 64:
        return code - 128
    return (code & 0xFF) << 8


class _Ids:
    """Cgroup ids for paths: the inode of a cgroup that exists now, else a stable synthetic
    id (the same path gets the same id) so the analyzer can still name a cgroup that is gone."""

    def __init__(self, cgroups: Iterable[CgroupNow]) -> None:
        self._ids = {c.path: c.cgroup_id for c in cgroups if c.exists and c.cgroup_id}

    def __call__(self, path: str) -> int:
        found = self._ids.get(path)
        if found is None:
            found = self._ids[path] = _SYNTHETIC + zlib.crc32(path.encode()) + len(self._ids)
        return found


def assemble(facts: Facts) -> Assembled:
    """The facts as one time-ordered stream for ``Analyzer.feed_all``: the cgroups, the
    runtimes' records, the kernel log's kills and the deaths they caused, the counters."""
    rt = facts.runtime
    ids = _Ids(facts.cgroups)
    ooms = tuple(o for o in facts.kernel_log.ooms if facts.target.matches(o.oom))
    first_ts = min([o.oom.ts for o in ooms] + [facts.since_ns, facts.now_ns])
    events: list[Event] = _cgroup_events(facts, ooms, ids, first_ts)

    # the units the runtimes name, on the cgroups their processes were killed in, and their
    # record of the last exit with the kernel's report of that run's kill
    unit = None
    matched: set[int] = set()  # (ids of the LoggedOom that a runtime's exit stands for)
    rexit: RuntimeExit | None = None
    finished = None
    for i, state in enumerate(((rt,) if rt is not None else ()) + facts.others):
        info = state.info
        mine = (
            ooms
            if i == 0 and rt is not None
            else tuple(o for o in ooms if _names(o.oom.task_memcg or o.oom.oom_memcg, info.id))
        )
        evs, m, r, fin, u = _runtime_events(state, mine, ids, facts, first_ts)
        events += evs
        if m is not None:
            matched.add(id(m))
        if i == 0 and rt is not None:
            unit, rexit, finished = u, r, fin
    if unit is None and ooms and rt is None and facts.target.kind != "all":
        unit = unit_of_cgroup(ooms[-1].oom.task_memcg or ooms[-1].oom.oom_memcg)

    events += _kill_events(facts, ooms, ids, matched)
    events += _counter_events(facts, ooms, ids)
    events.sort(key=lambda e: e.ts)
    return Assembled(
        events=events,
        ooms=ooms,
        runtime_exit=rexit,
        runtime_exit_ns=finished,
        unit=unit,
    )


def _cgroup_events(
    facts: Facts, ooms: Sequence[LoggedOom], ids: _Ids, first_ts: int
) -> list[Event]:
    """The cgroups: those the kernel log names (with the limit that fired, when it printed
    it) and the target's own and their ancestors, as they are now."""
    limits: dict[str, int] = {}
    for o in ooms:
        if o.oom.oom_memcg and o.limit_kb is not None:
            limits[o.oom.oom_memcg] = o.limit_kb * 1024
    paths: dict[str, int | None] = {c.path: c.limit_bytes for c in facts.cgroups}
    for o in ooms:
        for p in (o.oom.task_memcg, o.oom.oom_memcg):
            if p:
                paths.setdefault(p, None)
    return [
        CgroupInfo(
            ts=first_ts,
            cgroup_id=ids(path),
            path=path,
            hierarchy=facts.hierarchy,
            limit_bytes=limits.get(path, limit),
        )
        for path, limit in paths.items()
    ]


def _kill_events(
    facts: Facts, ooms: Sequence[LoggedOom], ids: _Ids, matched: set[int]
) -> list[Event]:
    """Every OOM report naming the target: the kernel's word, its reading of the limiting
    cgroup, and the death it caused (unless a runtime's record of the exit stands for it)."""
    events: list[Event] = []
    for o in ooms:
        k = o.oom
        cg = ids(k.task_memcg or k.oom_memcg) if (k.task_memcg or k.oom_memcg) else 0
        events.append(k)
        if k.oom_memcg and o.usage_kb is not None:
            # what the kernel printed about the limiting cgroup at the kill: a reading
            events.append(
                CgroupSample(
                    ts=k.ts,
                    cgroup_id=ids(k.oom_memcg),
                    path=k.oom_memcg,
                    usage_bytes=o.usage_kb * 1024,
                    limit_bytes=None if o.limit_kb is None else o.limit_kb * 1024,
                    high_bytes=None,
                    peak_bytes=None,
                    failcnt=o.failcnt,
                    events={},
                    stat={},
                    psi_some_avg10=None,
                    psi_full_avg10=None,
                    psi_some_total_us=None,
                    psi_full_total_us=None,
                )
            )
        if id(o) in matched or k.ts < facts.since_ns:
            continue
        events.append(
            Exit(
                ts=k.ts,
                pid=k.victim_pid,
                ppid=0,
                comm=k.victim_comm,
                cgroup_id=cg,
                status=9,  # SIGKILL: what the OOM killer sends
                start_ns=0,
                rung="kmsg",
            )
        )
    return events


def _counter_events(facts: Facts, ooms: Sequence[LoggedOom], ids: _Ids) -> list[Event]:
    """Cumulative oom_kill counters of the cgroups that exist now: each counts the kills since
    its creation, so it vouches for the newest logged kills in it, as many as it counts."""
    rt, now = facts.runtime, facts.now_ns
    events: list[Event] = []
    for c in facts.cgroups:
        count = c.events.get("oom_kill")
        if not c.exists or count is None:
            continue
        inside = sorted(o.oom.ts for o in ooms if cgpath.is_within(o.oom.task_memcg, c.path))
        if count == 0:
            since = (inside[-1] + 1) if inside else now
        elif inside:
            since = inside[max(0, len(inside) - count)]
        else:
            # kills the log no longer holds: this incarnation's age is not known; the runtime's
            # start of its current run is the one bound there is
            started = _boottime(rt.info, rt.info.started_ns, facts) if rt else None
            since = started if started is not None else now
        events.append(
            OomKillCount(
                ts=min(since, now), cgroup_id=ids(c.path), path=c.path, count=count, read_ns=now
            )
        )
    return events


def _runtime_events(
    rt: RuntimeState, ooms: Sequence[LoggedOom], ids: _Ids, facts: Facts, first_ts: int
) -> tuple[list[Event], LoggedOom | None, RuntimeExit | None, int | None, UnitName]:
    """One runtime's record as events: its unit on the cgroups its processes were killed in;
    its last exit (a ``RuntimeExit`` and the ``Exit`` it stands for, with the pid of the
    kernel's report of that run's kill, when there is one); its restart count."""
    info = rt.info
    events: list[Event] = []
    unit = from_info(info.runtime, info.id, info.name, _pod(info))
    cg_paths = {o.oom.task_memcg for o in ooms if o.oom.task_memcg}
    if info.cgroup_path:
        cg_paths.add(info.cgroup_path)
    unit_cgroup = ids(info.cgroup_path or min(cg_paths, default=f"{info.runtime}:{info.id}"))
    # (nothing names its cgroup: a unit all the same, on an id of its own)
    for cid in sorted({ids(p) for p in cg_paths} or {unit_cgroup}):
        events.append(
            UnitInfo(
                ts=first_ts,
                cgroup_id=cid,
                kind=info.runtime,
                unit_id=info.id,
                name=info.name,
                pod=_pod(info),
            )
        )
    events.append(
        RuntimeSample(
            ts=rt.read_ns,
            unit=unit.label,
            source=info.runtime,
            restart_count=info.restart_count,
            state=info.state,
            exit_code=info.exit_code,
            oom_killed=info.oom_killed,
        )
    )
    code = info.exit_code
    finished = _boottime(info, info.finished_ns, facts)
    if code is None or finished is None:
        return events, None, None, None, unit
    started = _boottime(info, info.started_ns, facts)
    if started is not None:
        # podman stamps the start after the fact: a process that exits at once has its
        # finish a few ms before its start
        started = min(started, finished)
    if finished < facts.since_ns:
        return events, None, None, finished, unit
    matched = _kill_of_run(ooms, started, finished, info.exit_pid)
    if matched is not None and started is not None:
        # (the process was running when it was killed: podman's StartedAt can come after an
        # immediate OOM kill, and the rules take no evidence from before a process's start)
        started = min(started, matched.oom.ts)
    pid = info.exit_pid or (matched.oom.victim_pid if matched else 0)
    cg = ids(matched.oom.task_memcg) if matched and matched.oom.task_memcg else unit_cgroup
    rexit = RuntimeExit(
        ts=finished,
        cgroup_id=cg,
        unit=unit.label,
        source=info.runtime,
        exit_code=code,
        pid=pid,
        oom_killed=info.oom_killed,
    )
    events.append(rexit)
    events.append(
        Exit(
            ts=finished,
            pid=pid,
            ppid=0,
            comm=matched.oom.victim_comm if matched else info.command,
            cgroup_id=cg,
            status=wait_status(code),
            start_ns=started or 0,
            rung=info.runtime,
        )
    )
    return events, matched, rexit, finished, unit


def _kill_of_run(
    ooms: Sequence[LoggedOom], started: int | None, finished: int, exit_pid: int
) -> LoggedOom | None:
    """The kernel log's last OOM kill within the run that ended at ``finished`` (of its exit
    pid, where the runtime knows it); without a start, the minute before the end."""
    lo = started if started is not None else finished - 60 * SECOND
    run = [o for o in ooms if lo - SECOND <= o.oom.ts <= finished + MATCH_AFTER_NS]
    if exit_pid:
        run = [o for o in run if o.oom.victim_pid == exit_pid]
    return run[-1] if run else None


def _pod(info: ContainerInfo) -> str:
    if info.pod and info.namespace:
        return f"{info.namespace}/{info.pod}"
    return ""
