"""The analyzer: events in, one verdict per process exit and one record per restart out. Pure:
no clock, no files, no root.

It wires the parts of the analysis together and owns *when* an exit is judged:

* the evidence store (tracer/analysis/evidence.py) keeps what was seen, bounded;
* the process and unit table (tracer/analysis/processes.py) knows processes, units, main
  processes and restarts;
* the rules (tracer/analysis/rules/) turn one exit and its evidence
  view into a finding, worded by tracer/analysis/wording.py;
* the verdict factory (tracer/analysis/findings.py) makes the verdict;
* retention (tracer/analysis/retention.py) decides which verdicts are kept.

The same ``Analyzer`` runs live (fed by the recorder) and on replay (fed by the trace reader),
built from the trace header by ``from_header`` in both, so a recording and every output of its
replay give the same verdicts. An exit is judged once the stream has moved ``SETTLE_NS`` past
it (or at ``finish``), so evidence that is stamped at the same instant but arrives a little
later (a kernel-log line, a sample) still counts: the verdict does not depend on the order of
simultaneous events.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from signal import SIGKILL
from typing import Any

from tracer.analysis import rules
from tracer.analysis.eta import Eta, Forecasts
from tracer.analysis.evidence import Evidence
from tracer.analysis.findings import (
    APP_EXIT,
    CGROUP_OOM,
    DEVICE_RESET,
    GLOBAL_OOM,
    GPU_OOM,
    HIGH,
    LOW,
    MEDIUM,
    NUMA_OOM,
    PROBE_KILL,
    SIGNAL_KILL,
    UNKNOWN,
    USERSPACE_OOM,
    Restart,
    Verdict,
    verdict,
)
from tracer.analysis.processes import Pending, ProcessTable
from tracer.analysis.retention import MAX_CLEAN_KEPT, MAX_KEPT, Retention
from tracer.analysis.rules import SETTLE_NS
from tracer.analysis.thrash import Thrash, Thrashing
from tracer.analysis.units import UnitName
from tracer.analysis.wording import describe_status
from tracer.events import (
    CgroupInfo,
    CgroupSample,
    EffectiveLimit,
    Event,
    Exec,
    Exit,
    Fork,
    ProbeSample,
    UnitInfo,
)

__all__ = [
    "APP_EXIT",
    "CGROUP_OOM",
    "DEVICE_RESET",
    "GLOBAL_OOM",
    "GPU_OOM",
    "HIGH",
    "LOW",
    "MAX_CLEAN_KEPT",
    "MAX_KEPT",
    "MEDIUM",
    "NUMA_OOM",
    "PROBE_KILL",
    "ROUND_NS",
    "SETTLE_NS",
    "SIGNAL_KILL",
    "UNKNOWN",
    "USERSPACE_OOM",
    "Analyzer",
    "Restart",
    "Verdict",
    "describe_status",
]

SECOND = 1_000_000_000
ROUND_NS = SECOND // 20  # exits are judged, and old evidence dropped, in rounds this far apart
JUMP_NS = 600 * SECOND  # a record this far ahead of the stream is not trusted on its own
UNJUDGED_NS = 60 * SECOND  # an exit not judged this long after it ended never will be


class Analyzer:
    """Feed events in time order with ``feed``; call ``finish`` at the end of the stream.

    The rules, words, process table (with each process's and unit's lifecycle) and retention
    live in their own modules; what stays here is when each exit is judged: the settle window,
    the rounds, early OOM judging, the restarts handed on."""

    def __init__(
        self,
        supervisor_pids: Iterable[int] = (),
        every_verdict: bool = True,
        probe_failures: int = rules.PROBE_FAILURES,
        early_oom: bool = False,
        keep_verdicts: bool = True,
    ) -> None:
        """``every_verdict``: ``feed`` returns every verdict it reaches (a live tail needs them).
        Without it, only the kept ones are built: past the caps of retention a plain exit is
        counted in ``not_kept`` without building a verdict that nobody would read (a replay of
        a busy host's --all trace is mostly that). ``probe_failures``: consecutive failed
        health probes up to a supervisor's kill that make it a probe kill. ``early_oom``: an
        OOM-killed exit is judged as soon as its evidence is complete
        (``rules.oom_evidence_complete``), not SETTLE_NS later: the always-on agent's counter
        and journal follow a kill within a round. (Replays keep the settle horizon: the same
        verdicts, in the order they always came.) ``keep_verdicts=False``: ``verdicts`` stays
        empty (the agent's sinks take each verdict as it comes; see ``Retention``)."""
        self.every_verdict = every_verdict
        self.early_oom = early_oom
        self.probe_failures = probe_failures
        self.warnings: list[str] = []  # what was set aside (absurd timestamps)
        self._held: Event | None = None  # a record far ahead of the stream, not yet trusted
        self.set_aside = 0  # records set aside for an absurd timestamp
        self._now = 0  # stream time of the last round
        self.ev = Evidence()
        self.table = ProcessTable(self.ev)
        self.kept = Retention() if keep_verdicts else Retention(0, 0)
        self.supervisor_pids = frozenset(supervisor_pids)
        # exits waiting to be judged, with their unit and whether they were its main process
        # (decided at the exit, before a successor runs)
        self._pending: deque[Pending] = deque()
        self._pruned = 0
        self._next_round = 0  # stream time of the next round of judging
        # one dispatch per event: the evidence store's intake, or a handler of ours that calls
        # it first (a replay feeds a million events; a second lookup and call each is 10%);
        # fork, exec and exit are handled in feed_many itself
        self._store = store = self.ev.intake
        self._on: dict[type[Event], Callable[[Any], object]] = {
            **store,
            UnitInfo: self._on_unit_info,
            ProbeSample: self._on_probe,
            CgroupInfo: self._on_cgroup_info,
            CgroupSample: self._on_cgroup_sample,
            EffectiveLimit: self._on_effective_limit,
        }
        # time to the next limit of each watched cgroup, from the samples kept above
        # (tracer/analysis/eta.py): here once, so tail, the agent and replay warn alike
        self.eta = Forecasts(self.ev.samples_between)
        # page cache re-read from disk, per watched cgroup (tracer/analysis/thrash.py)
        self.thrashing = Thrashing(self.ev.samples_between)

    @classmethod
    def from_header(
        cls,
        targets: Mapping[str, Any] | Any,
        every_verdict: bool = False,
        early_oom: bool = False,
        keep_verdicts: bool = True,
    ) -> Analyzer:
        """The analyzer for a recording: the settings its header's targets carry (supervisor
        pids). The one place an analyzer is built for a trace, live or replayed, so that every
        output judges alike."""
        if not isinstance(targets, Mapping):
            targets = {}
        pids = targets.get("supervisor_pids", [])
        threshold = targets.get("probe_failure_threshold")
        return cls(
            supervisor_pids=[p for p in pids if isinstance(p, int)]
            if isinstance(pids, list)
            else [],
            every_verdict=every_verdict,
            probe_failures=threshold
            if isinstance(threshold, int) and threshold > 0
            else rules.PROBE_FAILURES,
            early_oom=early_oom,
            keep_verdicts=keep_verdicts,
        )

    # -- what it has concluded ---------------------------------------------------------------

    @property
    def verdicts(self) -> list[Verdict]:
        """The kept verdicts, in the order they were reached."""
        return self.kept.verdicts

    @property
    def not_kept(self) -> int:
        """Verdicts reached (or counted) but not kept (over retention's caps)."""
        return self.kept.not_kept

    @property
    def restarts(self) -> list[Restart]:
        """Main-process exits followed by a new main process in the same unit."""
        return self.table.restarts()

    def take_restarts(self, final: bool = False) -> list[Restart]:
        """``ProcessTable.take_restarts``: a restart whose old exit is a minute of stream time
        behind and still not judged (its process was evicted unjudged) goes as "unknown"."""
        return self.table.take_restarts(None if final else self._now - UNJUDGED_NS)

    def restart_counts(self) -> list[tuple[str, int, int | None, str]]:
        return self.table.restart_counts()

    def known_cgroups(self) -> dict[int, str]:
        """The cgroups the analysis keeps something about: id -> path."""
        return {cid: info.path for cid, info in self.ev.cgroups.items()}

    def forget_cgroups(self, ids: Iterable[int]) -> None:
        """Forget cgroups that are gone (the agent's sweep): evidence, paths and units."""
        ids = list(ids)
        self.ev.forget_cgroups(ids)
        self.table.forget_cgroups(ids)
        self.eta.forget(ids)
        self.thrashing.forget(ids)

    def unit_of_pid(self, pid: int) -> str | None:
        """The label of the unit a process belongs to, while the process table holds it."""
        proc = self.table.procs.get(pid)
        if proc is None:
            return None
        unit = self.table.unit(proc)
        return unit.label if unit is not None else None

    def unit_of_cgroup(self, cgroup_id: int, path: str | None = None) -> UnitName | None:
        """The unit a cgroup names by itself (a runtime's name, a container or service path,
        else the path), as the process table names it; ``path`` where the trace gave the
        cgroup's path only in its samples."""
        return self.table.cgroup_unit(cgroup_id, path)

    @property
    def evicted(self) -> int:
        """Processes and evidence dropped to stay bounded."""
        return self.ev.evicted + self.table.evicted

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
        goes through: fork, exec and exit (most of any trace: a replay feeds a million) go to
        the process table, an exit is then queued for judging, other events go to their
        handler, and a round of judging runs when the stream has moved on."""
        on_get = self._on.get
        out: list[Verdict] = []
        next_round = self._next_round
        table = self.table
        fork, execd, exited = table.fork, table.exec, table.exit
        pending = self._pending
        ev: Any  # (narrowed by ``cls is ...``, which mypy does not follow)
        for ev in events:
            ts = ev.ts
            # (the stream is in time order, give or take: a round is due once it reaches the
            # next round's time, which is always past every timestamp seen before)
            due = ts >= next_round
            if due and (self._held is not None or (ts - self._now > JUMP_NS and self._now)):
                held = self._hold(ev)
                if held is None:
                    next_round = 0  # (the next record says whether to trust it)
                    continue
                out += self.feed_many(held)  # (it was trusted: in order, before this one)
                next_round = self._next_round
            cls = type(ev)
            if cls is Fork:
                fork(ev)
            elif cls is Exit:
                judged = exited(ev)
                if judged is not None:
                    pending.append(judged)
            elif cls is Exec:
                execd(ev)
            else:
                on = on_get(cls)
                if on is not None:
                    on(ev)
            if due:
                out += self._round(ts)
                next_round = self._next_round
        return out

    def _hold(self, ev: Event) -> list[Event] | None:
        """A record more than JUMP_NS ahead of the stream: one bad timestamp (a sample stamped
        2^62) must not judge and prune everything before it. It is held until the next record
        shows whether the stream really moved on (a quiet hour, then life): then it is handed
        back (with the held one first), else set aside with a warning. Returns the records to
        feed now, or None to hold this one."""
        held = self._held
        self._held = None
        if held is None:
            self._held = ev
            return None
        if ev.ts >= held.ts - JUMP_NS:
            self._now = held.ts  # the stream moved on: both records are real
            return [held]
        self._set_aside(held)
        if ev.ts - self._now > JUMP_NS:  # (another one far ahead, of a different time)
            self._held = ev
            return None
        return []

    def _set_aside(self, ev: Event) -> None:
        self.set_aside += 1
        if len(self.warnings) >= 100:
            return  # (counted in set_aside)
        self.warnings.append(
            f"a {ev.KIND} record stamped {(ev.ts - self._now) / 1e9:.0f} s ahead of the stream "
            "was set aside (a bad timestamp): not used for any verdict"
        )

    def _round(self, now: int) -> list[Verdict]:
        """Judge the exits the stream has moved SETTLE_NS past, then forget old evidence: in
        rounds, every ROUND_NS of stream time (a replay judges a busy host's exits by the
        hundred, not one at a time)."""
        self._next_round = now + ROUND_NS
        self._now = now
        horizon = now - SETTLE_NS
        pending = self._pending
        out = self._judge_due(horizon) if pending and pending[0][0] <= horizon else []
        if self.early_oom and pending:
            out += self._judge_complete_ooms()
        if horizon - self._pruned >= SECOND:  # (after judging: what the due exits look at stays)
            self.ev.prune(horizon)
            self._pruned = horizon
        return out

    def _on_unit_info(self, ev: UnitInfo) -> None:
        self._store[UnitInfo](ev)
        self.table.named_by(ev.cgroup_id)
        if ev.main_pid:
            self.table.first.setdefault(ev.cgroup_id, ev.main_pid)

    def _on_probe(self, ev: ProbeSample) -> None:
        self._store[ProbeSample](ev)
        if ev.pid:
            self.table.checks.add(ev.pid)

    def _on_cgroup_info(self, ev: CgroupInfo) -> None:
        self._store[CgroupInfo](ev)
        self.table.named_by(ev.cgroup_id)  # (a path learnt or changed)

    def _on_cgroup_sample(self, ev: CgroupSample) -> None:
        self._store[CgroupSample](ev)
        self.eta.sample(ev)
        self.thrashing.sample(ev)

    def _on_effective_limit(self, ev: EffectiveLimit) -> None:
        self._store[EffectiveLimit](ev)
        self.eta.limit(ev)
        self.thrashing.limit(ev)

    def forecast(self, cgroup_id: int) -> Eta | None:
        """The watched cgroup's time-to-limit warning now, if any (tracer/analysis/eta.py)."""
        return self.eta.current(cgroup_id)

    def thrash(self, cgroup_id: int) -> Thrash | None:
        """Whether the watched cgroup re-reads its page cache from disk now, and how fast
        (tracer/analysis/thrash.py)."""
        return self.thrashing.current(cgroup_id)

    def finish(self) -> list[Verdict]:
        if self._held is not None:  # (nothing came after it to vouch for it)
            self._set_aside(self._held)
            self._held = None
        return self._judge_due(None)

    # -- judging ----------------------------------------------------------------------------

    def _judge_complete_ooms(self) -> list[Verdict]:
        """Judge now the pending OOM-killed exits whose evidence is complete (``early_oom``)."""
        ev, complete = self.ev, rules.oom_evidence_complete
        by_pid = ev.by_pid
        # (every round, over a second of pending exits, thousands in an exit storm: the raw
        # status and the pid's evidence first, cheap tests that nearly every one fails)
        done = [
            p
            for p in self._pending
            if p[2].status & 0x7F == SIGKILL and p[1] in by_pid and complete(p[2], ev)
        ]
        if not done:
            return []
        judged = {id(p) for p in done}
        pending = self._pending  # (in place: feed_many holds it)
        keep = [p for p in pending if id(p) not in judged]
        pending.clear()
        pending.extend(keep)
        return self._judge_list(done)

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
        return self._judge_list(due)

    def _judge_list(self, due: list[Pending]) -> list[Verdict]:
        """Judge these exits, in time order."""
        due.sort(key=_exit_order)  # (they arrive nearly in order: linear then)
        out: list[Verdict] = []
        ev, kept = self.ev, self.kept
        checks, note_cause = self.table.checks, self.table.note_cause
        related = self.table.related
        by_pid, gpu = ev.by_pid, ev.gpu
        # Without every_verdict, verdicts that retention would not keep are only counted,
        # without being judged (a busy host's --all trace is mostly those, and a replay of one
        # a million events long): an exit with a plain exit code and no evidence about it (an
        # app_exit, the verdict retention gives way first) once no more of those are kept;
        # any exit no restart will name once retention is full of kills.
        every = self.every_verdict
        lean = not every and not gpu.seen()
        drop_clean, drop_any = kept.drops_routine(True), kept.drops_routine(False)
        counted = 0
        for _, pid, ex, unit, main in due:
            if pid in checks:
                # a runtime's exec health check: a probe sample already, not a unit's process
                checks.discard(pid)
                continue
            restartable = main and unit is not None and unit.kind != "command"
            status = ex.status
            if (
                lean
                and not status & 0x7F
                and pid not in by_pid
                and not (restartable and status >> 8 > 128)  # (an init passing a death on)
                and (drop_any or (drop_clean and status == 0))
                # (nor a main process's exit a death in its unit may explain: related_exit)
                and not (status and main and unit is not None and unit.key in related)
            ):
                if restartable:
                    note_cause(pid, ex.ts, APP_EXIT)  # a restart may name it
                counted += 1
                continue
            if not every and not restartable and kept.full_of_kills():
                counted += 1
                # (not judged: one that may be a kill is counted as one)
                kept.kills_not_kept += bool(status & 0x7F) or pid in by_pid
            else:
                v = self._judge(ex, unit, main)
                if restartable:
                    note_cause(pid, ex.ts, v.cause)  # a restart may name it
                kept.keep(v)
                drop_clean, drop_any = kept.drops_routine(True), kept.drops_routine(False)
                out.append(v)
                if v.cause in _OOM_CAUSES:
                    # the OOM reports this verdict used are its own: a later process with the
                    # pid must not inherit one that arrived after this exit
                    ev.forget_pid(pid, ex.ts, ex.ts + SETTLE_NS)
                    continue
            if pid in by_pid or pid in gpu.by_pid:
                ev.forget_pid(pid, ex.ts)
        kept.not_kept += counted
        return out

    def _judge(self, ex: Exit, unit: UnitName | None, main: bool) -> Verdict:
        """The verdict on one exit."""
        table = self.table
        label = key = None
        if unit is not None:
            label, key = unit.label, unit.key
        view = rules.view_of(
            ex,
            self.ev,
            label,
            supervisor_pids=self.supervisor_pids,
            probe_failures=self.probe_failures,
            unlabelled_probes=label is not None and table.sole_unit() == label,
            main=main,
            init_exit=table.main_exits.get(key) if key else None,
            child_death=table.deaths.get(key) if key and main else None,
            related_deaths=tuple(table.related.get(key, ())) if key and main else (),
            # (who started it, and what it runs: only a death by a signal asks)
            ancestors=table.ancestors(ex.pid, ex.ppid) if ex.status & 0x7F else frozenset(),
            exe_of=table.exe_of,
        )
        v = verdict(ex, rules.decide(view), label, main)
        if key is not None and not main and v.signal is not None:
            table.note_death(key, v, ex.ppid)
        return v


_OOM_CAUSES = frozenset((CGROUP_OOM, GLOBAL_OOM, NUMA_OOM))

_exit_order = operator.itemgetter(0, 1)
