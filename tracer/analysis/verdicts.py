"""Events in, one verdict per process exit out. Pure: no clock, no files, no root.

The same ``Analyzer`` runs live (fed by the recorder) and on replay (fed by the trace reader),
so a recording and its replay give the same verdicts. It keeps only what later verdicts need:
the names of cgroups, the OOM kills and fatal signals not yet matched with an exit.

Rules (DESIGN.md, "Verdicts"): exit status 137 alone is never a memory verdict. An OOM verdict
needs an OOM kill of this very process (from BPF or from the kernel log) *and* a SIGKILL exit;
the OOM killer's own SIGKILL (si_code SI_KERNEL, right after the kill) is part of that OOM, not
a second "signal kill".
"""

from __future__ import annotations

import signal as _signal
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tracer.events import (
    SI_KERNEL,
    CgroupInfo,
    Event,
    Exit,
    KmsgOom,
    OomKill,
    Signal,
    signal_name,
)

CGROUP_OOM = "cgroup_oom"
GLOBAL_OOM = "global_oom"
SIGNAL_KILL = "signal_kill"
APP_EXIT = "app_exit"
UNKNOWN = "unknown"

HIGH, MEDIUM, LOW = "high", "medium", "low"

Evidence = tuple[int, str]  # (timestamp of the event, what it says)

# Bounded memory: pending OOM kills and signals are kept per pid, at most this many pids.
MAX_PENDING = 4096
# A signal or OOM kill this long before an exit is no longer its cause.
MATCH_WINDOW_NS = 60 * 1_000_000_000


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


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
    exit_code: int | None = None
    signal: str | None = None
    sender_pid: int | None = None
    sender_comm: str | None = None
    limit_cgroup: str | None = None
    limit_bytes: int | None = None
    usage_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "pid": self.pid,
            "comm": self.comm,
            "cause": self.cause,
            "confidence": self.confidence,
            "summary": self.summary,
            "advice": self.advice,
            "evidence": [{"ts": ts, "what": what} for ts, what in self.evidence],
            "disagreements": list(self.disagreements),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "sender_pid": self.sender_pid,
            "sender_comm": self.sender_comm,
            "limit_cgroup": self.limit_cgroup,
            "limit_bytes": self.limit_bytes,
            "usage_bytes": self.usage_bytes,
        }


@dataclass
class _Pending:
    ooms: list[OomKill] = field(default_factory=list)
    kmsg: list[KmsgOom] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)


class Analyzer:
    """Feed events in time order with ``feed``; each Exit returns its verdict."""

    def __init__(self) -> None:
        self.cgroups: dict[int, CgroupInfo] = {}
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self.evicted = 0
        self.verdicts: list[Verdict] = []

    def _slot(self, pid: int) -> _Pending:
        slot = self._pending.get(pid)
        if slot is None:
            slot = self._pending[pid] = _Pending()
            if len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
                self.evicted += 1
        return slot

    def feed(self, ev: Event) -> Verdict | None:
        if isinstance(ev, CgroupInfo):
            self.cgroups[ev.cgroup_id] = ev
        elif isinstance(ev, OomKill):
            self._slot(ev.victim_pid).ooms.append(ev)
        elif isinstance(ev, KmsgOom):
            self._slot(ev.victim_pid).kmsg.append(ev)
        elif isinstance(ev, Signal):
            self._slot(ev.target_pid).signals.append(ev)
        elif isinstance(ev, Exit):
            verdict = self._judge(ev, self._pending.pop(ev.pid, _Pending()))
            self.verdicts.append(verdict)
            return verdict
        return None

    def feed_all(self, events: Iterable[Event]) -> list[Verdict]:
        out = []
        for ev in events:
            v = self.feed(ev)
            if v is not None:
                out.append(v)
        return out

    # -- judging ---------------------------------------------------------------------------

    def cgroup_path(self, cgroup_id: int) -> str | None:
        info = self.cgroups.get(cgroup_id)
        return info.path if info else None

    def _judge(self, ex: Exit, p: _Pending) -> Verdict:
        since = max(ex.start_ns, ex.ts - MATCH_WINDOW_NS)
        ooms = [o for o in p.ooms if since <= o.ts <= ex.ts]
        kmsg = [k for k in p.kmsg if since - 1_000_000_000 <= k.ts]
        signals = [s for s in p.signals if since <= s.ts <= ex.ts]
        ws = ex.wait
        exit_ev = (ex.ts, describe_status(ex))

        if (ooms or kmsg) and ws.signal == _signal.SIGKILL:
            return self._oom_verdict(ex, ooms, kmsg, signals, exit_ev)
        if ws.signal is not None:
            return self._signal_verdict(ex, signals, ooms or kmsg, exit_ev)
        code = ws.code if ws.code is not None else -1
        disagree: tuple[str, ...] = ()
        if ooms or kmsg:
            disagree = ("an OOM kill was reported for this pid, yet it exited on its own",)
        return Verdict(
            ts=ex.ts,
            pid=ex.pid,
            comm=ex.comm,
            cause=APP_EXIT,
            confidence=HIGH,
            summary=f"exited on its own with code {code}",
            advice=""
            if code == 0
            else f"the application chose to exit: read its own log for why it returned {code}",
            evidence=(exit_ev,),
            disagreements=disagree,
            exit_code=code,
        )

    def _oom_verdict(
        self,
        ex: Exit,
        ooms: list[OomKill],
        kmsg: list[KmsgOom],
        signals: list[Signal],
        exit_ev: Evidence,
    ) -> Verdict:
        evidence: list[tuple[int, str]] = []
        disagree: list[str] = []
        bpf = ooms[-1] if ooms else None
        km = kmsg[-1] if kmsg else None
        memcg_votes = []
        limit_path = None
        limit_bytes = usage = None
        if bpf is not None:
            memcg_votes.append(bpf.memcg)
            limit_path = self.cgroup_path(bpf.limit_cgroup_id) if bpf.limit_cgroup_id else None
            if bpf.memcg:
                limit_bytes, usage = bpf.limit_bytes or None, bpf.usage_bytes or None
            where = f" in {limit_path}" if limit_path and bpf.memcg else ""
            evidence.append(
                (
                    bpf.ts,
                    f"[{bpf.rung}] OOM killer chose pid "
                    f"{bpf.victim_pid}, {'memcg' if bpf.memcg else 'global'}{where}",
                )
            )
        if km is not None:
            memcg_votes.append(km.memcg)
            if km.memcg and km.oom_memcg:
                if limit_path is None:
                    limit_path = km.oom_memcg
                elif limit_path != km.oom_memcg:
                    disagree.append(
                        f"kernel log names {km.oom_memcg} as the OOM cgroup, "
                        f"BPF found {limit_path} at its limit"
                    )
            evidence.append(
                (
                    km.ts,
                    f"kernel log: {km.constraint or 'OOM report'}"
                    + (f", oom_memcg={km.oom_memcg}" if km.oom_memcg else "")
                    + (f", anon-rss {km.anon_rss_kb} kB" if km.anon_rss_kb else ""),
                )
            )
        oom_ts = min((o.ts for o in ooms), default=km.ts if km else ex.ts)
        for s in signals:
            # __oom_kill_process() sends the SIGKILL just before mark_oom_victim(), so the
            # signal may precede the OOM event by microseconds.
            if s.sig == _signal.SIGKILL and s.si_code == SI_KERNEL and abs(s.ts - oom_ts) < 1e9:
                evidence.append(
                    (s.ts, f"SIGKILL from the kernel (the OOM killer, running in {s.sender_comm})")
                )
        evidence.append(exit_ev)
        memcg = any(memcg_votes)
        if len(set(memcg_votes)) > 1:
            disagree.append("BPF and the kernel log disagree on memcg vs global constraint")
        if limit_bytes is None and limit_path is not None:
            info = next((c for c in self.cgroups.values() if c.path == limit_path), None)
            limit_bytes = info.limit_bytes if info else None
        sources = int(bpf is not None) + int(km is not None) + 1  # + the SIGKILL exit status
        confidence = HIGH if sources >= 3 and not disagree else MEDIUM if sources >= 2 else LOW
        evidence.sort()
        if memcg:
            where = limit_path or "a memory cgroup"
            summary = f"OOM-killed: {where} hit its limit {fmt_bytes(limit_bytes)}" + (
                f" (usage {fmt_bytes(usage)})" if usage else ""
            )
            advice = (
                f"the limit on {where} ({fmt_bytes(limit_bytes)}) is too small for this "
                "workload: raise it, or keep >= 15% headroom above the peak"
            )
            cause = CGROUP_OOM
        else:
            summary = "OOM-killed by the host's OOM killer: the whole machine ran out of memory"
            advice = (
                "the host itself was exhausted: find the largest consumers, add memory, or "
                "set per-service limits so one service cannot starve the rest"
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
            limit_bytes=limit_bytes if memcg else None,
            usage_bytes=usage if memcg else None,
        )

    def _signal_verdict(
        self, ex: Exit, signals: list[Signal], had_oom: object, exit_ev: Evidence
    ) -> Verdict:
        ws = ex.wait
        assert ws.signal is not None
        name = signal_name(ws.signal)
        core = " (core dumped)" if ws.core_dumped else ""
        match = [s for s in signals if s.sig == ws.signal]
        disagree: tuple[str, ...] = ()
        if had_oom:
            disagree = (f"an OOM kill was reported for this pid, yet it died of {name}",)
        sender = match[-1] if match else None
        if sender is not None and sender.sender_pid == ex.pid and sender.si_code > 0:
            # A fault the process raised itself (SIGSEGV, SIGBUS, SIGFPE...: si_code > 0 means
            # the kernel generated it for a fault) or abort(): the application crashed.
            return Verdict(
                ts=ex.ts,
                pid=ex.pid,
                comm=ex.comm,
                cause=APP_EXIT,
                confidence=HIGH,
                summary=f"crashed with {name}{core}",
                advice="the process faulted: look at its core dump or stack trace",
                evidence=((sender.ts, f"{name} raised by the process itself"), exit_ev),
                disagreements=disagree,
                signal=name,
            )
        if sender is not None and sender.sender_pid == ex.pid:
            return Verdict(
                ts=ex.ts,
                pid=ex.pid,
                comm=ex.comm,
                cause=APP_EXIT,
                confidence=HIGH,
                summary=f"killed itself with {name}{core} (e.g. abort())",
                advice="the application aborted: read its own log for the reason",
                evidence=((sender.ts, f"{name} sent by the process to itself"), exit_ev),
                disagreements=disagree,
                signal=name,
            )
        if sender is not None:
            return Verdict(
                ts=ex.ts,
                pid=ex.pid,
                comm=ex.comm,
                cause=SIGNAL_KILL,
                confidence=HIGH,
                summary=f"killed by {name}{core} from pid {sender.sender_pid} "
                f"({sender.sender_comm})",
                advice=f"{sender.sender_comm} (pid {sender.sender_pid}) stopped it: check why "
                "that sender acted (a redeploy, a stop, a manual kill, a watchdog)",
                evidence=(
                    (
                        sender.ts,
                        f"{name} from pid {sender.sender_pid} "
                        f"({sender.sender_comm}) to pid {sender.target_pid}",
                    ),
                    exit_ev,
                ),
                disagreements=disagree,
                signal=name,
                sender_pid=sender.sender_pid,
                sender_comm=sender.sender_comm,
            )
        return Verdict(
            ts=ex.ts,
            pid=ex.pid,
            comm=ex.comm,
            cause=SIGNAL_KILL,
            confidence=LOW,
            summary=f"killed by {name}{core}; the sender was not seen",
            advice="the signal's sender was not recorded (it was sent before recording began, "
            "or the signal hook did not attach): record from before the restart",
            evidence=(exit_ev,),
            disagreements=(*disagree, "no signal event for this exit"),
            signal=name,
        )


def describe_status(ex: Exit) -> str:
    ws = ex.wait
    if ws.signal is not None:
        return f"pid {ex.pid} ({ex.comm}) killed by {signal_name(ws.signal)}" + (
            " (core dumped)" if ws.core_dumped else ""
        )
    return f"pid {ex.pid} ({ex.comm}) exited with code {ws.code}"
