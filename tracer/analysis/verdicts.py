"""Events in, one verdict per process exit and one record per restart out. Pure: no clock, no
files, no root.

The same ``Analyzer`` runs live (fed by the recorder) and on replay (fed by the trace reader),
so a recording and its replay give the same verdicts. An exit is judged once the stream has
moved ``SETTLE_NS`` past it (or at ``finish``), so evidence that is stamped at the same instant
but arrives a little later (a kernel-log line, a sample) still counts: the verdict does not
depend on the order of simultaneous events.

Rules (DESIGN.md, "Verdicts"): exit status 137 alone is never a memory verdict. An OOM verdict
needs an OOM kill of this very process (from BPF or the kernel log) *and* a SIGKILL exit; the
OOM killer's own SIGKILL (si_code SI_KERNEL) is part of that OOM, not a second "signal kill".
Confidence is high only when at least two independent sources agree beyond the exit status
itself, medium with one, low with none; disagreements are listed, never hidden.

GPU rules (``gpu_oom``, ``device_reset``, a recovered GPU OOM, Xid 31/43 application faults)
come after the kernel OOM rule and before the signal rule; they live in
``tracer.analysis.gpu``.
"""

from __future__ import annotations

import functools
import operator
import signal as _signal
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tracer.analysis import gpu as gpu_rules
from tracer.analysis import senders, units
from tracer.analysis.evidence import HISTORY_NS, MAX_PIDS, Evidence, PidEvidence, Proc
from tracer.analysis.quantities import fmt_bytes, fmt_duration
from tracer.analysis.senders import IS_PLUMBING
from tracer.analysis.units import CONTAINER_KINDS, UNSET, UnitName, unit_of_cgroup
from tracer.events import (
    SI_KERNEL,
    CgroupInfo,
    CgroupSample,
    Event,
    Exec,
    Exit,
    Fork,
    KmsgOom,
    OomKill,
    ProbeSample,
    Signal,
    UnitInfo,
    signal_name,
)

CGROUP_OOM = "cgroup_oom"
GLOBAL_OOM = "global_oom"
GPU_OOM = "gpu_oom"
PROBE_KILL = "probe_kill"
SIGNAL_KILL = "signal_kill"
DEVICE_RESET = "device_reset"
APP_EXIT = "app_exit"
UNKNOWN = "unknown"

HIGH, MEDIUM, LOW = "high", "medium", "low"

SECOND = 1_000_000_000
MAX_CLEAN_KEPT = 2000
MAX_KEPT = 5000
SETTLE_NS = 1 * SECOND  # how long after an exit late evidence may still arrive
ROUND_NS = SECOND // 20  # exits are judged, and old evidence dropped, in rounds this far apart
ALLOC_FAIL_WINDOW_NS = 10 * SECOND  # "an allocation failure preceded" the exit
HEADROOM = 0.15

Evidence_ = tuple[int, str]  # (timestamp of the event, what it says)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why one process ended."""

    ts: int  # the exit's timestamp (CLOCK_BOOTTIME ns)
    pid: int
    comm: str
    cause: str
    confidence: str
    summary: str  # one line: what happened, with the numbers
    advice: str
    evidence: tuple[tuple[int, str], ...]  # (timestamp, what that event says), in time order
    disagreements: tuple[str, ...] = ()
    unit: str | None = None
    main: bool = True  # the unit's main process (its exit is a restart of the unit)
    exit_code: int | None = None
    signal: str | None = None
    sender_pid: int | None = None
    sender_comm: str | None = None
    sender_role: str | None = None
    limit_cgroup: str | None = None
    limit_scope: str | None = None  # "own" or "ancestor"
    limit_bytes: int | None = None
    usage_bytes: int | None = None
    peak_bytes: int | None = None
    peak_ts: int | None = None
    breakdown: tuple[tuple[str, int], ...] = ()  # anon, file, shmem, file_mapped at the kill
    stall_ns: int | None = None  # reclaim + throttling in the minute before
    host_available: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if name == "evidence":
                value = [{"ts": ts, "what": what} for ts, what in value]
            elif name == "breakdown":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class Restart:
    """A unit's main process exited and a new one started in the same unit."""

    ts: int  # the new main process's start
    unit: str
    old_pid: int
    new_pid: int
    downtime_ns: int
    cause: str  # the old main process's verdict

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class Analyzer:
    """Feed events in time order with ``feed``; call ``finish`` at the end of the stream."""

    def __init__(self, supervisor_pids: Iterable[int] = (), every_verdict: bool = True) -> None:
        """``every_verdict``: ``feed`` returns every verdict it reaches (a live tail needs them).
        Without it, only the kept ones are built: past the caps of ``_keep`` a plain exit is
        counted in ``not_kept`` without building a verdict that nobody would read (a replay of
        a busy host's --all trace is mostly that)."""
        self.every_verdict = every_verdict
        self.ev = Evidence()
        self.supervisor_pids = frozenset(supervisor_pids)
        self.verdicts: list[Verdict] = []
        # exits waiting to be judged, with their unit and whether they were its main process
        # (decided at the exit, before a successor runs)
        self._pending: deque[_Pending] = deque()
        self._pruned = 0
        self._clean_kept = 0
        self.not_kept = 0  # verdicts judged but not kept in self.verdicts (over the caps)
        self._ended: dict[str, tuple[int, int]] = {}  # unit key -> (main pid, exit ts)
        self._links: list[tuple[int, str, int, int, int]] = []  # ts, unit, old, new, downtime
        self._cause: dict[int, str] = {}  # pid -> cause of its last verdict
        self._checks: set[int] = set()  # pids of exec health checks (ProbeSample.pid)
        self._first: dict[int, int] = {}  # container cgroup id -> its main process
        self._cgroup_units: dict[int, UnitName | None] = {}  # cgroup id -> unit_of_cgroup
        # the cgroups among those that name their unit themselves (a container, a systemd
        # unit): every process in one belongs to it, which feed_many looks up inline
        self._named: dict[int, UnitName] = {}
        self._next_round = 0  # stream time of the next round of judging
        self._procs = self.ev.procs
        # one dispatch per event: the evidence store's intake, or a handler of ours that calls
        # it first (a replay feeds a million events; a second lookup and call each is 10%);
        # fork, exec and exit are handled in feed_many itself
        self._store = store = self.ev.intake
        self._on: dict[type[Event], Callable[[Any], object]] = {
            **store,
            UnitInfo: self._on_unit_info,
            ProbeSample: self._on_probe,
            CgroupInfo: self._on_cgroup_info,
        }

    @property
    def restarts(self) -> list[Restart]:
        """Main-process exits followed by a new main process in the same unit."""
        return [
            Restart(
                ts=ts,
                unit=unit,
                old_pid=old,
                new_pid=new,
                downtime_ns=down,
                cause=self._cause.get(old, "pending"),
            )
            for ts, unit, old, new, down in self._links
        ]

    @property
    def cgroups(self) -> dict[int, Any]:
        return self.ev.cgroups

    def cgroup_path(self, cgroup_id: int) -> str | None:
        return self.ev.path(cgroup_id)

    # -- intake -----------------------------------------------------------------------------

    def feed(self, ev: Event) -> list[Verdict]:
        """Take one event; returns the verdicts it made due (see ``every_verdict``)."""
        return self.feed_many((ev,))

    def feed_all(self, events: Iterable[Event]) -> list[Verdict]:
        """``feed`` each event, then ``finish``; returns every verdict they made."""
        return self.feed_many(events) + self.finish()

    def feed_many(self, events: Iterable[Event]) -> list[Verdict]:
        """``feed`` each event; returns the verdicts they made due. The one loop every event
        goes through. Fork, exec and exit events are most of any trace (a replay feeds a
        million of them): the process table is kept up to date here, inline, and exits are
        queued for judging; other events go to their handler."""
        on_get = self._on.get
        out: list[Verdict] = []
        next_round = self._next_round
        procs, new_proc = self._procs, self.ev.new_proc
        pending, first, ended = self._pending, self._first, self._ended
        named, find_unit, is_main = self._named, self._find_unit, self._is_main
        is_plumbing = IS_PLUMBING
        evicted = 0
        ev: Any  # (narrowed by ``cls is ...``, which mypy does not follow)
        for ev in events:
            cls = type(ev)
            if cls is Fork:
                # a new process, even where its pid was used before; its parent was seen now
                ppid = ev.parent_pid
                parent = procs.get(ppid)
                if parent is None:
                    new_proc(Proc(ppid, ev.comm, 0, ev.cgroup_id))
                else:
                    procs.move_to_end(ppid)
                    if not parent.comm:
                        parent.comm, parent.cgroup_id = ev.comm, ev.cgroup_id
                child = ev.child_pid
                procs.pop(child, None)
                procs[child] = Proc(child, ev.comm, ppid, ev.cgroup_id, ev.ts)
                if len(procs) > MAX_PIDS:  # (new_proc, inlined)
                    procs.popitem(last=False)
                    evicted += 1
            elif cls is Exit:
                pid = ev.pid
                proc = procs.get(pid)
                if proc is None:
                    proc = new_proc(Proc(pid, ev.comm, ev.ppid, ev.cgroup_id, ev.start_ns))
                else:  # (not moved up the table: an ended process goes before the live ones)
                    proc.comm, proc.ppid, proc.cgroup_id = ev.comm, ev.ppid, ev.cgroup_id
                    if not proc.start_ts:
                        proc.start_ts = ev.start_ns
                # (a container runtime's own setup processes ending normally are not judged)
                if ev.status != 0 or not is_plumbing[ev.comm]:
                    unit = proc.unit
                    if unit is UNSET:
                        unit = proc.unit = named.get(proc.cgroup_id) or find_unit(proc)
                    main = is_main(pid, proc, unit)
                    pending.append((ev.ts, pid, ev, unit, main))
                    # (a command tree is not restarted by anyone: no need to remember its end)
                    if main and unit is not None and unit.kind != "command":
                        ended[unit.key] = (pid, ev.ts)
                        if first.get(proc.cgroup_id) == pid:
                            del first[proc.cgroup_id]  # the next program there is the new main
            elif cls is Exec:
                # a process starts being what it is (and which unit it belongs to) at exec
                pid = ev.pid
                proc = procs.get(pid)
                if proc is None:
                    proc = new_proc(Proc(pid, ev.comm, 0, ev.cgroup_id, ev.ts, ev.filename))
                else:
                    procs.move_to_end(pid)
                    proc.comm, proc.cgroup_id, proc.filename = ev.comm, ev.cgroup_id, ev.filename
                    proc.unit = UNSET
                    if not proc.start_ts:
                        proc.start_ts = ev.ts
                if not is_plumbing[ev.comm]:
                    first.setdefault(ev.cgroup_id, pid)
                    unit = proc.unit = named.get(proc.cgroup_id) or find_unit(proc)
                    if unit is not None and is_main(pid, proc, unit):
                        self._new_main(ev, unit)
            else:
                on = on_get(cls)
                if on is not None:
                    on(ev)
            # (the stream is in time order, give or take: a round is due once it reaches the
            # next round's time, which is always past every timestamp seen before)
            if ev.ts >= next_round:
                out += self._round(ev.ts)
                next_round = self._next_round
        self.ev.evicted += evicted
        return out

    def _round(self, now: int) -> list[Verdict]:
        """Judge the exits the stream has moved SETTLE_NS past, then forget old evidence: in
        rounds, every ROUND_NS of stream time (a replay judges a busy host's exits by the
        hundred, not one at a time)."""
        self._next_round = now + ROUND_NS
        horizon = now - SETTLE_NS
        pending = self._pending
        out = self._judge_due(horizon) if pending and pending[0][0] <= horizon else []
        if horizon - self._pruned >= SECOND:  # (after judging: what the due exits look at stays)
            self.ev.prune(horizon)
            self._pruned = horizon
        return out

    def _new_main(self, ev: Exec, unit: UnitName) -> None:
        """A unit's new main process started: a restart, when the last one ended."""
        pid = ev.pid
        ended = self._ended.pop(unit.key, None)
        if ended is not None and ended[0] != pid:
            old_pid, old_ts = ended
            self._links.append((ev.ts, unit.label, old_pid, pid, ev.ts - old_ts))

    def _on_unit_info(self, ev: UnitInfo) -> None:
        self._store[UnitInfo](ev)
        self._forget_unit_of(ev.cgroup_id)
        if ev.main_pid:
            self._first.setdefault(ev.cgroup_id, ev.main_pid)

    def _on_probe(self, ev: ProbeSample) -> None:
        self._store[ProbeSample](ev)
        if ev.pid:
            self._checks.add(ev.pid)

    def _on_cgroup_info(self, ev: CgroupInfo) -> None:
        self._store[CgroupInfo](ev)
        self._forget_unit_of(ev.cgroup_id)  # (a path learnt or changed)

    def _forget_unit_of(self, cgroup_id: int) -> None:
        self._cgroup_units.pop(cgroup_id, None)
        self._named.pop(cgroup_id, None)

    def finish(self) -> list[Verdict]:
        return self._judge_due(None)

    def _judge_due(self, horizon: int | None) -> list[Verdict]:
        """Judge the exits up to ``horizon`` (all of them at None), in time order."""
        pending = self._pending
        if horizon is None:
            due = list(pending)
            pending.clear()
        else:
            due = []
            take, popleft = due.append, pending.popleft
            while pending and pending[0][0] <= horizon:
                take(popleft())
        due.sort(key=_exit_order)  # (they arrive nearly in order: linear then)
        out: list[Verdict] = []
        checks, ev, cause = self._checks, self.ev, self._cause
        by_pid, gpu = ev.by_pid, ev.gpu
        # Without every_verdict, verdicts that _keep would not keep are only counted, without
        # being judged (a busy host's --all trace is mostly those, and a replay of one a million
        # events long): past the keep caps and with no GPU evidence in the recording, an exit
        # with status 0 and nothing else known about it (an app_exit); once MAX_KEPT are kept,
        # any exit that no restart will name.
        every, verdicts = self.every_verdict, self.verdicts
        lean = (
            not every
            and (self._clean_kept >= MAX_CLEAN_KEPT or len(verdicts) >= MAX_KEPT)
            and not self._gpu_seen()
        )
        counted = 0
        for _, pid, ex, unit, main in due:
            if pid in checks:
                # a runtime's exec health check: a probe sample already, not a unit's process
                checks.discard(pid)
                continue
            restartable = main and unit is not None and unit.kind != "command"
            if lean and ex.status == 0 and pid not in by_pid:
                if restartable:
                    cause[pid] = APP_EXIT  # a restart may name it
                counted += 1
                continue
            if not every and not restartable and len(verdicts) >= MAX_KEPT:
                counted += 1
            else:
                v = self._judge(ex, unit, main)
                if restartable:
                    cause[pid] = v.cause  # a restart may name it
                self._keep(v)
                out.append(v)
            if pid in by_pid or pid in gpu.by_pid:
                ev.forget_pid(pid, ex.ts)
        self.not_kept += counted
        return out

    def _keep(self, v: Verdict) -> None:
        """Keep verdicts for the end-of-run table, bounded so that a week of --all on a busy
        host stays small: clean exits up to MAX_CLEAN_KEPT, the rest up to MAX_KEPT; beyond,
        they are only counted (every verdict is still returned by feed as it is reached)."""
        clean = v.cause == APP_EXIT and v.exit_code == 0
        if (clean and self._clean_kept >= MAX_CLEAN_KEPT) or len(self.verdicts) >= MAX_KEPT:
            self.not_kept += 1
            return
        self._clean_kept += clean
        self.verdicts.append(v)

    # -- units and restarts -----------------------------------------------------------------

    def _unit(self, proc: Proc, depth: int = 0) -> UnitName | None:
        """``_find_unit``, kept on the process until it execs."""
        unit = proc.unit
        if unit is UNSET:
            unit = proc.unit = self._find_unit(proc, depth)
        return unit

    def _find_unit(self, proc: Proc, depth: int = 0) -> UnitName | None:
        """A container or systemd unit by cgroup; else a program under a process supervisor;
        else whatever its parent belongs to; at the top, the recorded command itself."""
        unit = self._cgroup_units.get(proc.cgroup_id, UNSET)
        if unit is UNSET:
            info = self.ev.units.get(proc.cgroup_id)
            unit = self._cgroup_units[proc.cgroup_id] = (
                units.from_info(info.kind, info.unit_id, info.name, info.pod)
                if info
                else unit_of_cgroup(self.ev.path(proc.cgroup_id))
            )
            if unit is not None and unit.kind != "cgroup":
                self._named[proc.cgroup_id] = unit
        if unit is None or unit.kind == "cgroup":
            parent = self._procs.get(proc.ppid)
            if parent is not None and proc.filename and senders.is_process_supervisor(parent.comm):
                # a program run by supervisord & co.: its own unit, restarted by the supervisor
                unit = units.supervised(parent.comm, parent.pid, proc.filename)
            elif parent is not None and parent.pid != proc.pid and depth < 64:
                unit = self._unit(parent, depth + 1)
            else:
                pid = proc.pid
                unit = UnitName("command", str(pid), f"{proc.comm or '?'} (pid {pid})")
        return unit

    def _is_main(self, pid: int, proc: Proc, unit: UnitName | None) -> bool:
        if unit is None:
            return True
        if unit.kind in CONTAINER_KINDS and proc.cgroup_id in self._first:
            # a container's main process is the first program started in its cgroup; later
            # ones came in through `exec` (health checks, debugging shells)
            return self._first[proc.cgroup_id] == pid
        procs = self._procs
        parent = procs.get(proc.ppid)
        if parent is None:
            return True
        if IS_PLUMBING[parent.comm]:
            # look through the runtime's setup processes to whoever started the container
            seen = {pid}
            while parent is not None and IS_PLUMBING[parent.comm] and (parent.pid not in seen):
                seen.add(parent.pid)
                parent = procs.get(parent.ppid)
            if parent is None:
                return True
        theirs = parent.unit  # (_unit, inlined: hot)
        if theirs is unit:
            return False
        if theirs is UNSET:
            theirs = parent.unit = self._find_unit(parent)
        return theirs != unit

    # -- judging ----------------------------------------------------------------------------

    def _judge(self, ex: Exit, unit: UnitName | None, main: bool) -> Verdict:
        """The verdict on one exit."""
        pe = self.ev.by_pid.get(ex.pid) or PidEvidence()
        since = max(ex.start_ns, ex.ts - HISTORY_NS)
        end = ex.ts + SETTLE_NS
        ooms = [o for o in pe.ooms if since <= o.ts <= end]
        kmsg = [k for k in pe.kmsg if since - SECOND <= k.ts <= end]
        signals = [s for s in pe.signals if since <= s.ts <= ex.ts]
        ws = ex.wait
        exit_ev = (ex.ts, describe_status(ex))

        if (ooms or kmsg) and ws.signal == _signal.SIGKILL:
            v = self._oom_verdict(ex, ooms, kmsg, signals, exit_ev)
        elif (gpu_v := self._gpu_verdict(ex, since, signals, exit_ev)) is not None:
            v = gpu_v
        elif ws.signal is not None:
            v = self._signal_verdict(
                ex, signals, bool(ooms or kmsg), exit_ev, unit.label if unit else None
            )
        else:
            v = self._app_exit(ex, pe, bool(ooms or kmsg), exit_ev)
        return _replace(v, unit=unit.label if unit else None, main=main)

    def _gpu_seen(self) -> bool:
        store = self.ev.gpu
        return bool(store.by_pid or store.xids or store.lost)

    def _gpu_verdict(
        self, ex: Exit, since: int, signals: list[Signal], exit_ev: Evidence_
    ) -> Verdict | None:
        """gpu_oom, device_reset, or an app_exit that GPU evidence explains (a recovered GPU
        OOM, an Xid 31/43 fault): the rules are in tracer/analysis/gpu.py."""
        if not self._gpu_seen():
            return None  # no GPU evidence in this recording at all (the common case: cheap)
        f = gpu_rules.facts(self.ev.gpu, ex, since)
        if not (f.user or f.device_down):
            return None
        ws = ex.wait
        crash = None
        own_doing = ws.signal is None
        if ws.signal is not None:
            name = signal_name(ws.signal)
            match = [s for s in signals if s.sig == ws.signal]
            # abort() and faults are raised by the process itself (sender == the process); the
            # OOM killer's and other processes' signals are not its own doing
            own_doing = match[-1].sender_pid == ex.pid if match else ws.signal in _SELF_INFLICTED
            crash = f"aborted ({name})" if ws.signal == _signal.SIGABRT else f"died of {name}"
        finding = gpu_rules.judge(f, ex, exit_ev, own_doing=own_doing, crash=crash)
        if finding is None:
            return None
        evidence = finding.evidence
        raised = [s for s in signals if s.sig == ws.signal and s.sender_pid == ex.pid]
        if raised:
            what = f"{signal_name(raised[-1].sig)} raised by the process itself"
            evidence = tuple(sorted([*evidence, (raised[-1].ts, what)]))
        return Verdict(
            ts=ex.ts,
            pid=ex.pid,
            comm=ex.comm,
            cause=finding.cause,
            confidence=finding.confidence,
            summary=finding.summary,
            advice=finding.advice,
            evidence=evidence,
            disagreements=finding.disagreements,
            exit_code=ws.code,
            signal=signal_name(ws.signal) if ws.signal is not None else None,
            limit_bytes=finding.limit_bytes,
            usage_bytes=finding.usage_bytes,
            peak_bytes=finding.peak_bytes,
        )

    def _app_exit(self, ex: Exit, pe: PidEvidence, had_oom: bool, exit_ev: Evidence_) -> Verdict:
        code = ex.wait.code if ex.wait.code is not None else -1
        disagree: tuple[str, ...] = ()
        if had_oom:
            disagree = ("an OOM kill was reported for this pid, yet it exited on its own",)
        evidence = [exit_ev]
        failures = self._alloc_failures(ex, pe) if code != 0 else []
        if failures:
            evidence = sorted([*failures, exit_ev])
        summary, advice = _app_exit_text(code, bool(failures))
        return Verdict(
            ts=ex.ts,
            pid=ex.pid,
            comm=ex.comm,
            cause=APP_EXIT,
            confidence=HIGH,
            summary=summary,
            advice=advice,
            evidence=tuple(evidence),
            disagreements=disagree,
            exit_code=code,
        )

    def _alloc_failures(self, ex: Exit, pe: PidEvidence) -> list[Evidence_]:
        """Signs that memory ran out shortly before an exit the process chose: the cgroup's
        charge-failure counters rose, or the process stalled in reclaim."""
        start = ex.ts - ALLOC_FAIL_WINDOW_NS
        out: list[Evidence_] = []
        if not self.ev.by_cgroup and not pe.stalls:
            return out
        for cid in self._ancestry(ex.cgroup_id):
            samples = self.ev.samples_between(cid, start, ex.ts + SETTLE_NS)
            if len(samples) < 2:
                continue
            first, last = samples[0], samples[-1]
            path = last.path
            if (
                first.failcnt is not None
                and last.failcnt is not None
                and (last.failcnt > first.failcnt)
            ):
                out.append(
                    (
                        last.ts,
                        f"memory.failcnt of {path} rose by "
                        f"{last.failcnt - first.failcnt}: charges failed",
                    )
                )
            for key in ("max", "oom"):
                a, b = first.events.get(key), last.events.get(key)
                if a is not None and b is not None and b > a:
                    out.append((last.ts, f"memory.events {key} of {path} rose by {b - a}"))
        stalls = [s for s in pe.stalls if start <= s.ts <= ex.ts]
        if stalls:
            total = sum(s.duration_ns for s in stalls)
            out.append(
                (
                    stalls[-1].ts,
                    f"{len(stalls)} long reclaim stalls ({total / 1e6:.0f} ms) of this process",
                )
            )
        return out

    def _ancestry(self, cgroup_id: int) -> list[int]:
        path = self.ev.path(cgroup_id)
        if path is None:
            return [cgroup_id]
        out = []
        while True:
            cid = self.ev.id_of_path(path)
            if cid is not None:
                out.append(cid)
            if path == "/":
                return out
            path = path.rsplit("/", 1)[0] or "/"

    def _oom_verdict(
        self,
        ex: Exit,
        ooms: list[OomKill],
        kmsg: list[KmsgOom],
        signals: list[Signal],
        exit_ev: Evidence_,
    ) -> Verdict:
        evidence: list[Evidence_] = []
        disagree: list[str] = []
        bpf = ooms[-1] if ooms else None
        km = kmsg[-1] if kmsg else None
        votes: list[bool] = []
        limit_path: str | None = None
        limit_id = 0
        limit_bytes = usage = None
        if bpf is not None:
            votes.append(bpf.memcg)
            limit_id = bpf.limit_cgroup_id if bpf.memcg else 0
            limit_path = self.ev.path(limit_id) if limit_id else None
            if bpf.memcg:
                limit_bytes, usage = bpf.limit_bytes or None, bpf.usage_bytes or None
            where = f" in {limit_path}" if limit_path else ""
            evidence.append(
                (
                    bpf.ts,
                    f"[{bpf.rung}] OOM killer chose pid {bpf.victim_pid}, "
                    f"{'memcg' if bpf.memcg else 'global'}{where}",
                )
            )
        if km is not None:
            votes.append(km.memcg)
            if km.memcg and km.oom_memcg:
                if limit_path is None:
                    limit_path = km.oom_memcg
                    limit_id = self.ev.id_of_path(km.oom_memcg) or 0
                elif limit_path != km.oom_memcg:
                    disagree.append(
                        f"kernel log names {km.oom_memcg} as the OOM cgroup, "
                        f"BPF found {limit_path} at its limit"
                    )
            rss = f", anon-rss {km.anon_rss_kb} kB" if km.anon_rss_kb is not None else ""
            evidence.append(
                (
                    km.ts,
                    f"kernel log: {km.constraint or 'OOM report'}"
                    + (f", oom_memcg={km.oom_memcg}" if km.oom_memcg else "")
                    + rss,
                )
            )
        oom_ts = min([o.ts for o in ooms] + [k.ts for k in kmsg])
        for s in signals:
            # __oom_kill_process() sends the SIGKILL just before mark_oom_victim(): the signal
            # may precede the OOM event by microseconds.
            if s.sig == _signal.SIGKILL and s.si_code == SI_KERNEL and abs(s.ts - oom_ts) < SECOND:
                evidence.append(
                    (s.ts, f"SIGKILL from the kernel (the OOM killer, running in {s.sender_comm})")
                )
        memcg = any(votes)
        if len(set(votes)) > 1:
            disagree.append("BPF and the kernel log disagree on memcg vs global constraint")
        sources = int(bpf is not None) + int(km is not None)

        counter = self._oom_counter(limit_id or ex.cgroup_id, oom_ts) if memcg else None
        if counter is not None:
            evidence.append(counter)
            sources += 1
        evidence.append(exit_ev)
        if limit_bytes is None and limit_id:
            info = self.ev.cgroups.get(limit_id)
            limit_bytes = info.limit_bytes if info else None

        # the picture around the kill
        window = oom_ts - HISTORY_NS
        peak = peak_ts = None
        for smp in self.ev.samples_between(limit_id, window, oom_ts) if limit_id else []:
            if smp.usage_bytes is not None and (peak is None or smp.usage_bytes > peak):
                peak, peak_ts = smp.usage_bytes, smp.ts
        if usage is not None and (peak is None or usage >= peak):
            peak, peak_ts = usage, oom_ts
        breakdown = self._breakdown(ex, km, oom_ts)
        ancestry = self._ancestry(ex.cgroup_id)
        stall = self.ev.stall_ns([*ancestry, limit_id], window, oom_ts) or None
        host = self.ev.host_at(oom_ts)
        host_avail = host.mem_available if host else None
        scope = None
        if limit_id:
            scope = "own" if limit_id == ex.cgroup_id else "ancestor"

        confidence = HIGH if sources >= 2 and not disagree else MEDIUM if sources >= 1 else LOW
        if disagree and confidence == HIGH:
            confidence = MEDIUM
        evidence.sort()
        if memcg:
            where = self._cgroup_words(limit_id, limit_path)
            whose = {"own": "its own cgroup", "ancestor": "the ancestor"}.get(scope or "", "")
            summary = f"OOM-killed: {where} hit its limit {fmt_bytes(limit_bytes)}" + (
                f" ({whose})" if whose else ""
            )
            if host_avail is not None:
                summary += f"; the host had {fmt_bytes(host_avail)} available"
            if stall:
                summary += f"; {fmt_duration(stall)} of reclaim stalls in the minute before"
            target = int((peak or limit_bytes or 0) * (1 + HEADROOM))
            advice = (
                f"peak {fmt_bytes(peak)} vs effective limit {fmt_bytes(limit_bytes)} set "
                f"on {where}: keep >= 15% headroom (>= {fmt_bytes(target)}) or raise "
                f"{'the parent' if scope == 'ancestor' else 'that'} limit"
            )
            cause = CGROUP_OOM
        else:
            summary = "OOM-killed by the host's OOM killer: the whole machine ran out of memory"
            advice = (
                "the host itself was exhausted: find the largest consumers, add memory, "
                "or set per-service limits so one service cannot starve the rest"
            )
            cause = GLOBAL_OOM
        return Verdict(
            ts=ex.ts,
            pid=ex.pid,
            comm=ex.comm,
            cause=cause,
            confidence=confidence,
            summary=summary,
            advice=advice,
            evidence=tuple(evidence),
            disagreements=tuple(disagree),
            signal="SIGKILL",
            limit_cgroup=limit_path if memcg else None,
            limit_scope=scope if memcg else None,
            limit_bytes=limit_bytes if memcg else None,
            usage_bytes=usage if memcg else None,
            peak_bytes=peak if memcg else None,
            peak_ts=peak_ts if memcg else None,
            breakdown=breakdown,
            stall_ns=stall,
            host_available=host_avail,
        )

    def _cgroup_words(self, cgroup_id: int, path: str | None) -> str:
        """A cgroup as users know it: the container or service it is, else its path."""
        info = self.ev.units.get(cgroup_id)
        if info is not None:
            return units.from_info(info.kind, info.unit_id, info.name, info.pod).label
        return path or "a memory cgroup"

    def _oom_counter(self, cgroup_id: int, oom_ts: int) -> Evidence_ | None:
        """memory.events oom_kill (v2) / memory.oom_control oom_kill (v1) rising across the
        kill: a third, independent source."""
        samples = self.ev.samples_between(cgroup_id, oom_ts - HISTORY_NS, oom_ts + SETTLE_NS)
        before = [s for s in samples if s.ts < oom_ts and "oom_kill" in s.events]
        after = [s for s in samples if s.ts >= oom_ts and "oom_kill" in s.events]
        if before and after and after[-1].events["oom_kill"] > before[-1].events["oom_kill"]:
            n = after[-1].events["oom_kill"] - before[-1].events["oom_kill"]
            return (after[-1].ts, f"oom_kill counter of {after[-1].path} rose by {n}")
        return None

    def _breakdown(self, ex: Exit, km: KmsgOom | None, oom_ts: int) -> tuple[tuple[str, int], ...]:
        last: CgroupSample | None = None
        for s in self.ev.samples_between(ex.cgroup_id, oom_ts - 5 * SECOND, oom_ts):
            last = s
        fresh = last is not None and (
            km is None
            or km.anon_rss_kb is None
            or (last.usage_bytes or 0) * 2 >= km.anon_rss_kb * 1024
        )
        if last is not None and last.stat and fresh:
            keys = ("anon", "file", "shmem", "file_mapped")
            return tuple((k, last.stat[k]) for k in keys if k in last.stat)
        if km is not None:
            pairs = (("anon", km.anon_rss_kb), ("file", km.file_rss_kb), ("shmem", km.shmem_rss_kb))
            return tuple((k, v * 1024) for k, v in pairs if v is not None)
        return ()

    def _probe_kill(
        self,
        ex: Exit,
        last: Signal,
        who: senders.Sender,
        how: str,
        unit: str | None,
        evidence: list[Evidence_],
        disagree: tuple[str, ...],
    ) -> Verdict | None:
        start = last.ts - PROBE_WINDOW_NS
        probes = self.ev.probes_between(max(start, ex.start_ns), last.ts, unit)
        if not probes:
            return None
        recent = probes[-3:]
        failing = [p for p in recent if not p.ok or p.timed_out]
        if not failing:
            return None
        lat = ", ".join(
            f"{p.latency_ns / 1e6:.0f} ms{' (timed out)' if p.timed_out else ''}"
            f"{'' if p.ok else ' failed'}"
            for p in recent
        )
        stall = self.ev.stall_ns(self._ancestry(ex.cgroup_id), start, last.ts)
        psi = self.ev.psi_peak(start, last.ts)
        ev = [
            *evidence,
            *(
                (
                    p.ts,
                    f"probe {p.target}: {p.latency_ns / 1e6:.0f} ms, "
                    + (
                        "timed out"
                        if p.timed_out
                        else "ok"
                        if p.ok
                        else f"failed ({p.error or p.status})"
                    ),
                )
                for p in recent
            ),
        ]
        context = ""
        if stall:
            context += f"; {fmt_duration(stall)} of reclaim stalls in the minute before"
        if psi is not None:
            context += f"; memory PSI some peaked at {psi:.1f}%"
        summary = (
            f"killed by {who.description} with {how} after failing health probes "
            f"(last: {lat}){context}"
        )
        if stall:
            advice = (
                f"the probe failed during {fmt_duration(stall)} of reclaim stalls: give the "
                "service memory headroom and raise the probe timeout; don't hide real "
                "hangs"
            )
        else:
            advice = (
                "the health probe failed and the supervisor killed it: find why the "
                "service stopped answering (its log, a deadlock, CPU starvation) before "
                "loosening the probe"
            )
        return Verdict(
            ts=ex.ts,
            pid=ex.pid,
            comm=ex.comm,
            cause=PROBE_KILL,
            confidence=HIGH if len(failing) >= 2 else MEDIUM,
            summary=summary,
            advice=advice,
            evidence=tuple(sorted(ev)),
            disagreements=disagree,
            signal=signal_name(last.sig),
            sender_pid=last.sender_pid,
            sender_comm=last.sender_comm,
            sender_role=who.role,
            stall_ns=stall or None,
        )

    # -- supervisors' own counts -------------------------------------------------------------

    def restart_counts(self) -> list[tuple[str, int, int | None, str]]:
        """Per unit: (unit, restarts whyrestart linked, restarts the supervisor counted over
        the same recording, its name). A mismatch is worth a look: a restart we could not see,
        or one the supervisor does not count."""
        ours: dict[str, int] = {}
        for r in self.restarts:
            ours[r.unit] = ours.get(r.unit, 0) + 1
        out = []
        for unit in sorted(set(ours) | set(self.ev.runtime)):
            samples = [x for x in self.ev.runtime.get(unit, []) if x.restart_count is not None]
            theirs = None
            source = ""
            if samples:
                first, lastx = samples[0], samples[-1]
                assert first.restart_count is not None and lastx.restart_count is not None
                # the supervisor's count before the recording: its first reading, less the
                # restarts we saw before that reading
                before = sum(1 for r in self.restarts if r.unit == unit and r.ts <= first.ts)
                theirs = lastx.restart_count - (first.restart_count - before)
                source = lastx.source
            out.append((unit, ours.get(unit, 0), theirs, source))
        return out

    def _signal_verdict(
        self,
        ex: Exit,
        signals: list[Signal],
        had_oom: bool,
        exit_ev: Evidence_,
        unit: str | None = None,
    ) -> Verdict:
        ws = ex.wait
        assert ws.signal is not None
        name = signal_name(ws.signal)
        core = " (core dumped)" if ws.core_dumped else ""
        match = [s for s in signals if s.sig == ws.signal]
        disagree: tuple[str, ...] = ()
        if had_oom:
            disagree = (f"an OOM kill was reported for this pid, yet it died of {name}",)
        if not match:
            return Verdict(
                ts=ex.ts,
                pid=ex.pid,
                comm=ex.comm,
                cause=UNKNOWN,
                confidence=LOW,
                summary=f"killed by {name}{core}, but neither its sender nor an OOM kill was seen",
                advice="record from before the exit with the signal hook attached "
                "(whyrestart doctor); exit status alone does not tell who killed it",
                evidence=(exit_ev,),
                disagreements=(*disagree, "no signal event for this exit"),
                signal=name,
            )
        last = match[-1]
        who = senders.classify(
            last.sender_comm,
            last.sender_pid,
            ex.pid,
            kernel=last.si_code == SI_KERNEL,
            supervisor_pids=self.supervisor_pids,
        )
        if who.role == senders.ROLE_KERNEL and not ws.core_dumped and last.si_code == SI_KERNEL:
            return Verdict(
                ts=ex.ts,
                pid=ex.pid,
                comm=ex.comm,
                cause=SIGNAL_KILL,
                confidence=MEDIUM,
                summary=f"killed by the kernel with {name} (not an OOM kill: e.g. the init "
                "process of its container or PID namespace exited and took it down)",
                advice="look at why its container's main process ended: this process went "
                "down with it",
                evidence=((last.ts, f"{name} sent by the kernel"), exit_ev),
                disagreements=disagree,
                signal=name,
                sender_role=who.role,
            )
        if who.role in (senders.ROLE_SELF, senders.ROLE_KERNEL):
            # A fault the process raised itself (si_code > 0: SIGSEGV, SIGBUS, SIGFPE...) or
            # abort(): the application crashed.
            fault = last.si_code > 0 or who.role == senders.ROLE_KERNEL
            return Verdict(
                ts=ex.ts,
                pid=ex.pid,
                comm=ex.comm,
                cause=APP_EXIT,
                confidence=HIGH,
                summary=(
                    f"crashed with {name}{core}"
                    if fault
                    else f"killed itself with {name}{core} (e.g. abort())"
                ),
                advice=(
                    "the process faulted: look at its core dump or stack trace"
                    if fault
                    else "the application aborted: read its own log for the reason"
                ),
                evidence=((last.ts, f"{name} raised by the process itself"), exit_ev),
                disagreements=disagree,
                signal=name,
                sender_role=who.role,
            )
        evidence: list[Evidence_] = [
            (s.ts, f"{signal_name(s.sig)} from pid {s.sender_pid} ({s.sender_comm})")
            for s in signals
            if s.sender_pid != ex.pid
        ]
        evidence.append(exit_ev)
        # A stop: SIGTERM first, then SIGKILL from the same sender after the grace period.
        # (runtimes send each signal from a new `runc kill` process: match the sender by name)
        term = [
            s for s in signals if s.sig == _signal.SIGTERM and s.sender_comm == last.sender_comm
        ]
        if ws.signal == _signal.SIGKILL and term:
            grace = (last.ts - term[0].ts) / 1e9
            how = f"SIGTERM, then SIGKILL {grace:.1f} s later (the stop grace period ran out)"
        else:
            how = f"{name}{core}"
        if who.role in (senders.ROLE_SUPERVISOR, senders.ROLE_KUBELET):
            probe = self._probe_kill(ex, last, who, how, unit, evidence, disagree)
            if probe is not None:
                return probe
        if who.role == senders.ROLE_OOM_DAEMON:
            summary = f"killed by {who.description} with {how}: memory pressure"
            advice = (
                "a user-space OOM killer acted on memory pressure before the kernel "
                "would have: check its thresholds (PSI, free memory) and this "
                "service's memory use"
            )
        elif who.role == senders.ROLE_KUBELET:
            summary = f"killed by the kubelet with {how}"
            advice = (
                "the kubelet killed it: a failing liveness probe, an eviction or a pod "
                "deletion; check `kubectl describe pod` events for which"
            )
        elif who.role == senders.ROLE_SUPERVISOR:
            summary = f"stopped by {who.description} with {how}"
            advice = (
                "the supervisor stopped it (a stop, redeploy or restart policy): check "
                "the supervisor's log for why"
            )
        else:
            summary = f"killed by {how} from {who.description}"
            advice = (
                f"{last.sender_comm} (pid {last.sender_pid}) stopped it: check why that "
                "sender acted (a redeploy, a stop, a manual kill, a watchdog)"
            )
        return Verdict(
            ts=ex.ts,
            pid=ex.pid,
            comm=ex.comm,
            cause=SIGNAL_KILL,
            confidence=HIGH,
            summary=summary,
            advice=advice,
            evidence=tuple(sorted(evidence)),
            disagreements=disagree,
            signal=name,
            sender_pid=last.sender_pid,
            sender_comm=last.sender_comm,
            sender_role=who.role,
        )


PROBE_WINDOW_NS = 60 * SECOND


# Signals a process raises on itself (abort(), faults): without a signal event for the exit,
# these are taken as its own doing.
_SELF_INFLICTED = frozenset(
    {_signal.SIGABRT, _signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL}
)


# an exit waiting to be judged: its time and pid (the order exits are judged in), the exit, its
# unit and whether it was the unit's main process (decided at the exit, before a successor ran)
_Pending = tuple[int, int, Exit, UnitName | None, bool]
_exit_order = operator.itemgetter(0, 1)


def _replace(v: Verdict, **changes: Any) -> Verdict:
    # v was built a moment ago by the caller and is not shared yet: setting its fields in
    # place is safe, and under exit storms much cheaper than building a second Verdict.
    for name, value in changes.items():
        object.__setattr__(v, name, value)
    return v


@functools.lru_cache(maxsize=1024)
def _app_exit_text(code: int, alloc_failures: bool) -> tuple[str, str]:
    """An app_exit verdict's summary and advice: one shared copy per exit code (thousands of
    kept verdicts of a crash-looping program would each hold their own otherwise)."""
    note = "; memory allocation failures preceded it" if alloc_failures else ""
    advice = ""
    if code != 0:
        advice = f"the application chose to exit: read its own log for why it returned {code}"
        if note:
            advice += (
                "; it ran out of memory it was allowed and handled it itself: raise "
                "the limit or lower its memory use"
            )
    return f"exited on its own with code {code}{note}", advice


def describe_status(ex: Exit) -> str:
    ws = ex.wait
    if ws.signal is not None:
        return f"pid {ex.pid} ({ex.comm}) killed by {signal_name(ws.signal)}" + (
            " (core dumped)" if ws.core_dumped else ""
        )
    return f"pid {ex.pid} ({ex.comm}) exited with code {ws.code}"
