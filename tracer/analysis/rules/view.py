"""What a rule sees of one exit (``ExitView``, built by ``view_of`` out of the evidence store),
and the small helpers every rule family shares."""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tracer.analysis import senders
from tracer.analysis import wording as say
from tracer.analysis.evidence import HISTORY_NS, Evidence
from tracer.analysis.findings import (
    HIGH,
    SIGNAL_KILL,
    Evidence_,
    Finding,
    Verdict,
)
from tracer.events import (
    SI_KERNEL,
    Exit,
    KmsgOom,
    OomKill,
    ReclaimStall,
    Signal,
    TmpfsFull,
    signal_name,
)

SECOND = 1_000_000_000


PROBE_FAILURES = 3  # consecutive failed probes before a kill that make it a probe kill
SETTLE_NS = 1 * SECOND  # how long after an exit late evidence may still arrive


@dataclass(frozen=True, slots=True)
class ExitView:
    """What the rules may know about one exit: the evidence of this process incarnation (from
    its start, or the history window, to a settle past its exit), what the process table says
    around it, and the store to ask about its cgroups, the host and the probes."""

    ex: Exit
    since: int  # the earliest time-windowed evidence (samples, GPU) that can be about it
    ooms: list[OomKill]
    kmsg: list[KmsgOom]
    signals: list[Signal]  # signals to it, from its start up to its exit
    stalls: list[ReclaimStall]
    ev: Evidence
    unit: str | None = None
    supervisor_pids: frozenset[int] = field(default_factory=frozenset)
    probe_failures: int = PROBE_FAILURES  # the consecutive-failure threshold of a probe kill
    unlabelled_probes: bool = False  # probes recorded without a unit check this one
    main: bool = True  # its unit's main process
    init_exit: tuple[int, int] | None = None  # (pid, ts): its unit's main process ended
    child_death: Verdict | None = None  # the last death by a signal of another process there
    # the last few deaths by a signal of other processes there, oldest first, with each one's
    # parent pid (related_exit)
    related_deaths: tuple[tuple[Verdict, int], ...] = ()
    ancestors: frozenset[int] = frozenset()  # its parent and theirs, in the recorded tree
    exe_of: Callable[[int], str] | None = None  # a pid's executable from its exec, when seen
    # the full tmpfs mounts it saw, read at a SIGBUS of its (TmpfsFull), up to a settle past it
    tmpfs_full: tuple[TmpfsFull, ...] = ()

    @property
    def exit_ev(self) -> Evidence_:
        return (self.ex.ts, say.describe_status(self.ex))


def view_of(ex: Exit, ev: Evidence, unit: str | None, **context: Any) -> ExitView:
    """The evidence view of one exit, out of the store."""
    pe = ev.by_pid.get(ex.pid)
    since = max(ex.start_ns, ex.ts - HISTORY_NS)
    if pe is None:
        return ExitView(ex, since, [], [], [], [], ev, unit, **context)
    # an OOM kill or a fatal signal may come long before the exit (a victim stuck in D state):
    # from the process's start, when the exit says when that was
    lo = ex.start_ns or since
    end = ex.ts + SETTLE_NS
    return ExitView(
        ex,
        since,
        [o for o in pe.ooms if lo <= o.ts <= end],
        [k for k in pe.kmsg if lo <= k.ts <= end],
        [s for s in pe.signals if lo <= s.ts <= ex.ts],
        pe.stalls,
        ev,
        unit,
        **context,
        tmpfs_full=tuple(t for t in pe.tmpfs if lo <= t.ts <= end),
    )


def fatal_signal(signals: list[Signal], sig: int) -> Signal | None:
    """The signal event that ended a process killed by ``sig``: the first delivered
    (``senders.fatal_signal``)."""
    return senders.fatal_signal([s for s in signals if s.sig == sig])


def is_kernel_kill(s: Signal) -> bool:
    """A SIGKILL the kernel sent (the OOM killer, a PID namespace's end): never the process's
    own doing, whichever task's context it ran in."""
    return s.sig == _signal.SIGKILL and s.si_code == SI_KERNEL


def amend(f: Finding, **changes: Any) -> Finding:
    """A copy of a rule's finding with some fields changed (findings are frozen: a rule never
    changes another rule's conclusion in place)."""
    return msgspec.structs.replace(f, **changes)


@dataclass(frozen=True, slots=True)
class SenderKill:
    """A kill whose sender ``signal_exit`` has named, as the supervisor and user-space OOM
    rules judge it: the fatal signal, who sent it and how (a stop or a plain kill), the
    signals and doubts said so far, and what the trace disagrees about."""

    last: Signal
    who: senders.Sender
    how: str
    evidence: list[Evidence_]
    disagree: tuple[str, ...]

    def finding(
        self,
        cause: str,
        confidence: str,
        summary: str,
        advice: str,
        evidence: list[Evidence_],
        *,
        stall_ns: int | None = None,
        host_available: int | None = None,
        probe_failures: int = 0,
    ) -> Finding:
        """The rule's finding, with the signal and its sender filled in."""
        return Finding(
            cause,
            confidence,
            summary,
            advice,
            tuple(sorted(evidence)),
            disagreements=self.disagree,
            signal=signal_name(self.last.sig),
            sender_pid=self.last.sender_pid,
            sender_comm=self.last.sender_comm,
            sender_role=self.who.role,
            stall_ns=stall_ns,
            host_available=host_available,
            probe_failures=probe_failures,
        )


def sender_of(v: ExitView, sig: Signal) -> tuple[senders.Sender, str]:
    """Who sent ``sig`` to the exiting process (``senders.classify``, with what the trace knows
    of the sender: its executable, its cgroup, whether it started the victim), and that
    executable ("" when not seen)."""
    exe = sig.sender_exe or (v.exe_of(sig.sender_pid) if v.exe_of is not None else "")
    who = senders.classify(
        sig.sender_comm,
        sig.sender_pid,
        v.ex.pid,
        kernel=sig.si_code == SI_KERNEL,
        supervisor_pids=v.supervisor_pids,
        exe=exe,
        cgroup=v.ev.path(sig.sender_cgroup_id) or "",
        ancestor=sig.sender_pid in v.ancestors,
    )
    return who, exe


def sent_by(
    sig: Signal,
    who: senders.Sender,
    exe: str,
    summary: str,
    advice: str,
    evidence: list[Evidence_],
    disagree: tuple[str, ...],
    exit_code: int | None = None,
) -> Finding:
    """A signal_kill: another process's signal ended it (killed, or a stop it handled)."""
    return Finding(
        SIGNAL_KILL,
        HIGH,
        summary,
        advice,
        tuple(sorted(evidence)),
        disagreements=disagree,
        sender_pid=sig.sender_pid,
        sender_comm=sig.sender_comm,
        sender_role=who.role,
        sender_exe=exe or None,
        exit_code=exit_code,
    )
