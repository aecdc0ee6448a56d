"""The verdict rules: pure functions of (exit, evidence view) -> ``Finding``. No process table,
no retention, no English (tracer/analysis/wording.py has the words).

``decide`` applies the rule families in order: the kernel's OOM kill, then the GPU
(tracer/analysis/gpu.py), then signals (a health-probe kill, a user-space OOM killer, a
supervisor's stop, anyone else), then the process's own exit.

Rules (ARCHITECTURE.md, "Verdicts need agreement"): exit status 137 alone is never a memory
verdict. An OOM verdict needs an OOM kill of this very process incarnation (from BPF or the
kernel log, stamped after it started) *and* a SIGKILL exit that no process sent; the OOM
killer's own SIGKILL (si_code SI_KERNEL) is part of that OOM, not a second "signal kill".
Evidence belongs to an incarnation (pid + start time), never to a bare pid: a report stamped
before the process started is about an earlier process with the pid, and one an earlier exit's
verdict used is gone with it.

How sure (README, "How sure a verdict is"): a cause the kernel records as an act is seen
directly: the exit code a process returned, the signal hook's record of who sent the signal
that ended it, a fault or abort it raised. One such record, with nothing against it, is high.
A cause that is inferred (a memory limit, the GPU, a health probe, a device failure) is high
only when two independent sources agree (BPF, the kernel log, the cgroup's counters, NVML,
the uprobes, the prober, the signal hook); the GPU OOM rule counts the uprobe's "out of
memory" returned to the process within seconds of its own exit as the two (the failure and
the ending are each recorded as they happen). One source is medium; none is low. Any
disagreement caps a verdict at medium, whichever rule made it (``decide`` enforces it).
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracer.analysis import gpu as gpu_rules
from tracer.analysis import senders
from tracer.analysis import wording as say
from tracer.analysis.evidence import HISTORY_NS, Evidence
from tracer.analysis.findings import (
    APP_EXIT,
    CGROUP_OOM,
    DEVICE_RESET,
    GLOBAL_OOM,
    HIGH,
    LOW,
    MEDIUM,
    NUMA_OOM,
    PROBE_KILL,
    SIGNAL_KILL,
    UNKNOWN,
    USERSPACE_OOM,
    Evidence_,
    Finding,
    Verdict,
)
from tracer.analysis.quantities import fmt_bytes
from tracer.events import (
    SI_KERNEL,
    SI_USER,
    CgroupSample,
    Exit,
    KmsgOom,
    OomKill,
    ProbeSample,
    ReclaimStall,
    RuntimeSample,
    Signal,
    signal_name,
)

SECOND = 1_000_000_000
SETTLE_NS = 1 * SECOND  # how long after an exit late evidence may still arrive
ALLOC_FAIL_WINDOW_NS = 10 * SECOND  # "an allocation failure preceded" the exit
PROBE_WINDOW_NS = 60 * SECOND
PROBE_FAILURES = 3  # consecutive failed probes before a kill that make it a probe kill
# A probe that answered this slowly counts as failing for a supervisor whose own timeout we do
# not know (Kubernetes' default timeoutSeconds is 1): a kill after only slow probes is a
# probe kill at medium confidence.
SLOW_PROBE_NS = 1 * SECOND
# Memory pressure that a user-space OOM killer (or a kubelet eviction) acts on, in the minute
# before its kill: any one of these.
PRESSURE_PSI_SOME = 10.0  # % (avg10), host or the victim's cgroups
PRESSURE_AVAILABLE = 0.10  # of MemTotal
PRESSURE_USAGE = 0.90  # of a cgroup's limit
PRESSURE_STALL_NS = 1 * SECOND
RUNTIME_HEALTHCHECK = "healthcheck"  # ProbeSample.target of a runtime's own exec health check
HEADROOM = 0.15
# A main process's non-zero exit this soon after another process of its unit was OOM-killed or
# killed by a signal passes that death on (an API server whose engine or worker process died:
# vllm's "Failed core proc(s)", a gunicorn master giving up on its workers). Seconds, not
# more: a later exit has had time for a cause of its own.
RELATED_DEATH_NS = 5 * SECOND
RELATED_DEATHS_KEPT = 8  # deaths remembered per unit (the first of a cascade is the cause)

# Signals a process raises on itself (abort(), faults): without a signal event for the exit,
# these are taken as its own doing.
_SELF_INFLICTED = frozenset(
    {_signal.SIGABRT, _signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL}
)
# Signals the kernel raises for a process's own set-up, from whatever task was running (an
# interrupt's or a kworker's current task is no sender): the terminal driver's (n_tty isig(),
# a hang-up: kill_pgrp(..., 1), SEND_SIG_PRIV), the interval timers' (it_real_fn(),
# check_cpu_itimer(): SEND_SIG_PRIV), the CPU time limit's (check_rlimit(): SEND_SIG_PRIV);
# si_code of POSIX timers, message queues, AIO and SIGIO (uapi asm-generic/siginfo.h).
_TTY_SIGNALS = frozenset({_signal.SIGINT, _signal.SIGQUIT, _signal.SIGHUP})
_ITIMER_SIGNALS = frozenset({_signal.SIGALRM, _signal.SIGVTALRM, _signal.SIGPROF})
SI_TIMER, SI_MESGQ, SI_ASYNCIO, SI_SIGIO = -2, -3, -4, -5
POLL_CODES = range(1, 7)  # POLL_IN .. POLL_HUP: SIGIO from send_sigio()


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
    )


def oom_evidence_complete(ex: Exit, store: Evidence) -> bool:
    """Whether an OOM-killed exit's evidence is all in before SETTLE_NS has passed: the
    kernel's OOM record (BPF) and its report (the kernel log) for this process, and, where the
    limiting cgroup is sampled, a sample taken at or after the kill (its OOM counter's rise).
    What the settle window waits for is exactly these; with them in, nothing later changes
    the verdict, and a live consumer (the agent) need not wait the rest of the second."""
    if ex.wait.signal != _signal.SIGKILL:
        return False
    pe = store.by_pid.get(ex.pid)
    if pe is None or not pe.ooms or not pe.kmsg:
        return False
    lo = ex.start_ns or ex.ts - HISTORY_NS
    bpf = [o for o in pe.ooms if lo <= o.ts <= ex.ts]
    if not bpf or not any(lo <= k.ts for k in pe.kmsg):
        return False
    oom = best_oom(bpf)
    if oom is None:
        return False
    if not oom.memcg:
        return True  # (a global OOM: no cgroup counter is read)
    cg = store.by_cgroup.get(oom.limit_cgroup_id or ex.cgroup_id)
    return cg is None or not cg.samples or cg.sample_ts[-1] >= oom.ts


def fatal_signal(signals: list[Signal], sig: int) -> Signal | None:
    """The signal event that ended a process killed by ``sig``: the first delivered
    (``senders.fatal_signal``)."""
    return senders.fatal_signal([s for s in signals if s.sig == sig])


def _kernel_kill(s: Signal) -> bool:
    """A SIGKILL the kernel sent (the OOM killer, a PID namespace's end): never the process's
    own doing, whichever task's context it ran in."""
    return s.sig == _signal.SIGKILL and s.si_code == SI_KERNEL


def decide(v: ExitView) -> Finding:
    """The finding on one exit: the first rule family that applies. Whatever the rule, a
    finding that lists a disagreement is at most medium, and one whose unit's health probes
    were failing up to the exit lists them, cause or not."""
    f = _decide(v)
    if f.disagreements and f.confidence == HIGH:
        f = _with(f, confidence=MEDIUM)
    if v.ev.probes:
        f = _with_probe_failures(v, f)
    return f


def failing_probes(v: ExitView, until: int) -> list[ProbeSample]:
    """The unit's probes that failed (or timed out, or answered slower than SLOW_PROBE_NS)
    without a break up to ``until``, oldest first: a probe that passed resets the count, as
    Kubernetes' failureThreshold does."""
    start = max(until - PROBE_WINDOW_NS, v.ex.start_ns)
    probes = v.ev.probes_between(start, until, v.unit, v.unlabelled_probes)
    run: list[ProbeSample] = []
    for p in reversed(probes):
        if p.ok and not p.timed_out and p.latency_ns < SLOW_PROBE_NS:
            break
        if not p.ok and not p.timed_out and p.ts + p.latency_ns > until:
            # in flight at the exit and refused or reset: the death's effect, not a failure
            # before it (a probe that timed out had waited on a silent server, and counts)
            continue
        run.append(p)
    run.reverse()
    return run


def never_healthy(v: ExitView, until: int) -> int | None:
    """How many of the unit's probes ran from this process's start to ``until`` with none
    passing (it was still starting); None when none ran or one passed, or when the probes
    began over PROBE_WINDOW_NS after its start (a recording that attached to a running server,
    or a start not known: it may have been healthy before)."""
    start = v.ex.start_ns
    probes = v.ev.probes_between(start, until, v.unit, v.unlabelled_probes)
    if not probes or probes[0].ts - start > PROBE_WINDOW_NS or any(p.ok for p in probes):
        return None
    return len(probes)


def _with_probe_failures(v: ExitView, f: Finding) -> Finding:
    failing = failing_probes(v, v.ex.ts)
    if not failing:
        return f
    if f.cause == PROBE_KILL:
        return _with(f, probe_failures=len(failing))
    # not the cause, but part of the picture: the failures, and for how long
    lines = [(p.ts, say.probe_line(p)) for p in failing[-3:]]
    lines.append((v.ex.ts, say.probes_failed_before(len(failing), v.ex.ts - failing[0].ts)))
    return _with(f, evidence=tuple(sorted([*f.evidence, *lines])), probe_failures=len(failing))


def _decide(v: ExitView) -> Finding:
    ws = v.ex.wait
    had_oom = best_oom(v.ooms) is not None or bool(v.kmsg)
    if had_oom and ws.signal == _signal.SIGKILL:
        killer = fatal_signal(v.signals, _signal.SIGKILL)
        if killer is None or _kernel_kill(killer) or any(_kernel_kill(s) for s in v.signals):
            return oom_kill(v)
        # the SIGKILL that ended it was sent by a process, and the kernel sent none: the OOM
        # report is not about this kill (an earlier process with the pid, a late report)
        return signal_exit(v, had_oom)
    gpu = gpu_exit(v)
    if gpu is not None:
        return gpu
    if ws.signal is not None:
        return signal_exit(v, had_oom)
    return init_exit(v) or handled_stop(v) or related_exit(v, had_oom) or app_exit(v, had_oom)


# -- the process's own exit ------------------------------------------------------------------


def app_exit(v: ExitView, had_oom: bool) -> Finding:
    ex = v.ex
    code = ex.wait.code if ex.wait.code is not None else -1
    disagree: tuple[str, ...] = (say.OOM_REPORTED_YET_EXITED,) if had_oom else ()
    evidence = [v.exit_ev]
    failures = alloc_failures(v) if code != 0 else []
    if failures:
        evidence = sorted([*failures, v.exit_ev])
    summary, advice = say.app_exit_text(code, bool(failures))
    return Finding(
        cause=APP_EXIT,
        confidence=HIGH,
        summary=summary,
        advice=advice,
        evidence=tuple(evidence),
        disagreements=disagree,
        exit_code=code,
    )


def init_exit(v: ExitView) -> Finding | None:
    """A container's init (tini, dumb-init, docker-init, a shell) exits 128 + N right after
    its child died of signal N: it passed the child's death on, and the unit restarted for
    the child's cause. Medium at most: the cause is the child's, inferred through the init."""
    child, ex = v.child_death, v.ex
    code = ex.wait.code
    if not v.main or child is None or code is None or code <= 128 or child.signal is None:
        return None
    if child.signal != signal_name(code - 128) or not 0 <= ex.ts - child.ts <= SETTLE_NS:
        return None
    summary = say.passed_on(code, child.pid, child.comm, child.summary)
    return _passed_on(child, summary, [v.exit_ev], code)


def _passed_on(child: Verdict, summary: str, more: list[Evidence_], code: int) -> Finding:
    """Another process's death as this exit's cause: its cause, facts and evidence, at medium
    at most (the link is inferred), with this exit's own evidence added."""
    return Finding(
        child.cause,
        MEDIUM if child.confidence != LOW else LOW,
        summary,
        child.advice,
        tuple(sorted([*child.evidence, *more])),
        disagreements=child.disagreements,
        sender_pid=child.sender_pid,
        sender_comm=child.sender_comm,
        sender_role=child.sender_role,
        limit_cgroup=child.limit_cgroup,
        limit_scope=child.limit_scope,
        limit_bytes=child.limit_bytes,
        usage_bytes=child.usage_bytes,
        peak_bytes=child.peak_bytes,
        peak_ts=child.peak_ts,
        breakdown=child.breakdown,
        stall_ns=child.stall_ns,
        host_available=child.host_available,
        exit_code=code,
    )


def related_exit(v: ExitView, had_oom: bool) -> Finding | None:
    """A unit's main process exits non-zero within RELATED_DEATH_NS after another process of
    the unit (its worker, its engine process) was OOM-killed or killed by a signal that the
    main process did not send itself: that death is the cause, passed on with its evidence and
    the gap (an API server exiting 1 after its worker's OOM kill is not a bug of its own).
    Medium at most: the link is inferred from the timing; an OOM report about the main
    process itself (a disagreement app_exit states) leaves it to app_exit."""
    ex, code = v.ex, v.ex.wait.code
    if not v.main or had_oom or not code or not v.related_deaths:
        return None
    lo = max(ex.ts - RELATED_DEATH_NS, ex.start_ns)
    # (deaths the main process caused itself, stopping its workers on its way out, are its
    # doing, not a cause; a pid reused by the main process is not another process)
    near = [
        (d, ppid)
        for d, ppid in v.related_deaths
        if lo <= d.ts <= ex.ts and d.pid != ex.pid and d.sender_pid != ex.pid
    ]
    if not near:
        return None
    # the first death of a cascade is its cause; an OOM kill before any other death
    ooms = [n for n in near if n[0].cause in _OOM_CAUSES]
    child, ppid = (ooms or near)[0]
    gap = ex.ts - child.ts
    oom = child.cause in _OOM_CAUSES
    line = say.related_death(code, gap, child.pid, child.comm, ppid == ex.pid, oom, child.signal)
    summary = say.related_death_summary(line, child.summary)
    return _passed_on(child, summary, [v.exit_ev, (ex.ts, line)], code)


def handled_stop(v: ExitView) -> Finding | None:
    """A main process that exits 128 + N right after another process sent it signal N, which
    it handled (a shell's ``trap 'exit 143' TERM``, a server's graceful shutdown): stopped on
    request, as a runtime's graceful stop (``docker stop``, CRI StopContainer) ends it, not an
    exit of its own. Worded by who sent it, as a kill is."""
    ex = v.ex
    code = ex.wait.code
    if not v.main or code is None or code <= 128 or code - 128 > 64:
        return None
    sig = next(
        (
            s
            for s in reversed(v.signals)
            if s.sig == code - 128
            and s.sender_pid != ex.pid
            and s.si_code != SI_KERNEL
            and s.result == 0
            and 0 <= ex.ts - s.ts <= SETTLE_NS
        ),
        None,
    )
    if sig is None:
        return None
    exe = sig.sender_exe or (v.exe_of(sig.sender_pid) if v.exe_of is not None else "")
    who = senders.classify(
        sig.sender_comm,
        sig.sender_pid,
        ex.pid,
        kernel=False,
        supervisor_pids=v.supervisor_pids,
        exe=exe,
        cgroup=v.ev.path(sig.sender_cgroup_id) or "",
        ancestor=sig.sender_pid in v.ancestors,
    )
    if who.role in (senders.ROLE_SELF, senders.ROLE_KERNEL):
        return None
    name = signal_name(sig.sig)
    summary, advice = say.sender_text(
        who, say.handled_how(name, code), sig.sender_comm, sig.sender_pid
    )
    evidence = [(sig.ts, say.signal_from(name, sig.sender_pid, sig.sender_comm)), v.exit_ev]
    if who.doubt:
        evidence.append((sig.ts, who.doubt))
    disagree: tuple[str, ...] = ()
    record = supervisor_record(v, sig.ts)
    if record is not None:
        # the runtime's word beside ours; an OOMKilled for a handled stop is its mistake
        # (kubernetes#140718), said so, not taken
        evidence.append((record[0].ts, record[1]))
        if record[0].oom_killed:
            disagree = (say.runtime_claims_oom(record[0].source),)
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
        exit_code=code,
    )


_OOM_CAUSES = frozenset((CGROUP_OOM, GLOBAL_OOM))


def alloc_failures(v: ExitView) -> list[Evidence_]:
    """Signs that memory ran out shortly before an exit the process chose: the cgroup's
    charge-failure counters rose, or the process stalled in reclaim."""
    ex, store = v.ex, v.ev
    start = ex.ts - ALLOC_FAIL_WINDOW_NS
    out: list[Evidence_] = []
    if not store.by_cgroup and not v.stalls:
        return out
    for cid in store.ancestry(ex.cgroup_id):
        samples = store.samples_between(cid, start, ex.ts + SETTLE_NS)
        if len(samples) < 2:
            continue
        first, last = samples[0], samples[-1]
        if first.failcnt is not None and last.failcnt is not None and last.failcnt > first.failcnt:
            out.append((last.ts, say.failcnt_rose(last.path, last.failcnt - first.failcnt)))
        for key in ("max", "oom"):
            a, b = first.events.get(key), last.events.get(key)
            if a is not None and b is not None and b > a:
                out.append((last.ts, say.events_rose(key, last.path, b - a)))
    stalls = [s for s in v.stalls if start <= s.ts <= ex.ts]
    if stalls:
        out.append((stalls[-1].ts, say.own_stalls(len(stalls), sum(s.duration_ns for s in stalls))))
    return out


# -- the kernel's OOM killer -----------------------------------------------------------------


def oom_kill(v: ExitView) -> Finding:
    ex, store = v.ex, v.ev
    evidence: list[Evidence_] = []
    disagree: list[str] = []
    bpf = best_oom(v.ooms)
    km = v.kmsg[-1] if v.kmsg else None
    # The mark_victim rungs guess the scope (a cgroup found at its limit by walking up from
    # the victim); the kernel log states the OOM's constraint. Where both exist, the kernel's
    # word settles the scope: a cgroup that happened to sit near its limit during a global OOM
    # is not the cause. (fentry/kprobe read oc->memcg: exact, a vote like the log's.)
    guessed = bpf is not None and km is not None and bpf.rung not in _EXACT_RUNGS
    votes = [e.memcg for e in (bpf, km) if e is not None and not (guessed and e is bpf)]
    if bpf is not None:
        evidence.append((bpf.ts, say.bpf_oom(bpf, store.path(bpf.limit_cgroup_id))))
    if km is not None:
        evidence.append((km.ts, say.kmsg_oom(km)))
    limit_id, limit_path, limit_bytes, usage, differ = limiting_cgroup(v, bpf, km)
    if differ:
        disagree.append(differ)
    oom_ts = min([o.ts for o in v.ooms if not o.exiting] + [k.ts for k in v.kmsg])
    for s in v.signals:
        # __oom_kill_process() sends the SIGKILL just before mark_oom_victim(): the signal
        # may precede the OOM event by microseconds.
        if s.sig == _signal.SIGKILL and s.si_code == SI_KERNEL and abs(s.ts - oom_ts) < SECOND:
            evidence.append((s.ts, say.oom_killer_signal(s.sender_comm)))
    memcg = any(votes)
    numa = numa_constraint(bpf, km)
    if len(set(votes)) > 1:
        disagree.append(say.CONSTRAINTS_DISAGREE)
    if guessed and bpf is not None and km is not None and bpf.memcg != km.memcg:
        disagree.append(say.scope_guess_overruled(bpf.rung, bpf.memcg))
    sources = int(bpf is not None) + int(km is not None)
    counter = oom_counter(store, limit_id or ex.cgroup_id, oom_ts) if memcg else None
    if counter is not None:
        evidence.append(counter)
        sources += 1
    said = runtime_exit(store, ex)
    if said is not None:
        evidence.append(said)
        sources += 1
    evidence.append(v.exit_ev)
    peak, peak_ts, parts, stall, host_avail = around_kill(store, ex, km, limit_id, usage, oom_ts)
    scope = None
    if limit_id:
        scope = "own" if limit_id == ex.cgroup_id else "ancestor"
    confidence = HIGH if sources >= 2 and not disagree else MEDIUM if sources >= 1 else LOW
    evidence.sort()
    if memcg:
        cause = CGROUP_OOM
        where = store.cgroup_label(limit_id, limit_path)
        summary, advice = say.cgroup_oom_text(
            where, limit_bytes, scope, host_avail, stall, peak, HEADROOM, never_healthy(v, oom_ts)
        )
        summary, advice, said = with_composition(
            v, km, oom_ts, limit_id, limit_bytes or usage, summary, advice
        )
        if said is not None:
            evidence.append(said)
            evidence.sort()
    elif numa:
        cause, summary, advice = NUMA_OOM, say.numa_oom_summary(numa), say.NUMA_OOM_ADVICE
    else:
        cause, summary, advice = GLOBAL_OOM, say.GLOBAL_OOM_SUMMARY, say.GLOBAL_OOM_ADVICE
    return Finding(
        cause,
        confidence,
        summary,
        advice,
        tuple(evidence),
        tuple(disagree),
        signal="SIGKILL",
        limit_cgroup=limit_path if memcg else None,
        limit_scope=scope if memcg else None,
        limit_bytes=limit_bytes if memcg else None,
        usage_bytes=usage if memcg else None,
        peak_bytes=peak if memcg else None,
        peak_ts=peak_ts if memcg else None,
        breakdown=parts,
        stall_ns=stall,
        host_available=host_avail,
    )


# BPF rungs that read the OOM's memory cgroup from the kernel's own oom_control; the others
# walk the victim's ancestors for one at its limit, a guess the kernel log can overrule
_EXACT_RUNGS = frozenset(("kprobe", "fentry"))

# The kernel's CONSTRAINT_CPUSET / CONSTRAINT_MEMORY_POLICY (oom_control, and the kernel log's
# oom-kill line): the allocation could only use some NUMA nodes, and those ran out.
_NUMA_CONSTRAINTS = {
    "cpuset": "cpuset",
    "mempolicy": "mempolicy",
    "CONSTRAINT_CPUSET": "cpuset",
    "CONSTRAINT_MEMORY_POLICY": "mempolicy",
}


def best_oom(ooms: list[OomKill]) -> OomKill | None:
    """The record that says most about the kill: never a mark of a victim that was already
    exiting by itself (task_will_free_mem(): the OOM killer marked it and killed nothing); the
    exact rungs' (oom_control read) before the guesses; the first of equals (a later mark of the
    same process is another of its threads, outside the kill). Not simply the last: a guess
    that came after the exact record would override its scope."""
    kills = [o for o in ooms if not o.exiting]
    exact = [o for o in kills if o.rung in _EXACT_RUNGS]
    return exact[0] if exact else kills[0] if kills else None


def numa_constraint(bpf: OomKill | None, km: KmsgOom | None) -> str | None:
    """ "cpuset" or "mempolicy" when the OOM was confined to some NUMA nodes, as oom_control
    (the exact rungs) or the kernel log's constraint says; None otherwise."""
    for said in (bpf.constraint if bpf else "", km.constraint if km else ""):
        if said in _NUMA_CONSTRAINTS:
            return _NUMA_CONSTRAINTS[said]
    return None


def limiting_cgroup(
    v: ExitView, bpf: OomKill | None, km: KmsgOom | None
) -> tuple[int, str | None, int | None, int | None, str | None]:
    """The memory cgroup whose limit killed: (id, path, limit, usage at the kill, what
    disagreed). BPF's, unless it was the ancestor walk's guess and the kernel log names
    another (the log prints the OOM's own memcg); the kernel log's alone, as the cgroup that
    was at that path at the kill (a restart may have made a new one there since)."""
    ex, store = v.ex, v.ev
    limit_id = 0
    limit_path: str | None = None
    limit_bytes = usage = None
    differ = None
    if bpf is not None and bpf.memcg:
        limit_id = bpf.limit_cgroup_id
        limit_path = store.path(limit_id) if limit_id else None
        limit_bytes, usage = bpf.limit_bytes or None, bpf.usage_bytes or None
    if km is not None and km.memcg and km.oom_memcg and limit_path != km.oom_memcg:
        if limit_path is not None:
            differ = say.cgroups_disagree(km.oom_memcg, limit_path)
        if limit_path is None or (bpf is not None and bpf.rung not in _EXACT_RUNGS):
            limit_path = km.oom_memcg
            if store.path(ex.cgroup_id) == km.oom_memcg:
                limit_id = ex.cgroup_id
            else:
                limit_id = store.id_of_path(km.oom_memcg, at=km.ts) or 0
            limit_bytes = usage = None
    if limit_bytes is None and limit_id:
        info = store.cgroups.get(limit_id)
        limit_bytes = info.limit_bytes if info else None
    return limit_id, limit_path, limit_bytes, usage, differ


def around_kill(
    store: Evidence, ex: Exit, km: KmsgOom | None, limit_id: int, usage: int | None, oom_ts: int
) -> tuple[int | None, int | None, tuple[tuple[str, int], ...], int | None, int | None]:
    """The picture around an OOM kill: (peak usage of the limiting cgroup and when, the
    memory breakdown, reclaim stall time in the minute before, the host's available memory)."""
    window = oom_ts - HISTORY_NS
    peak = peak_ts = None
    for smp in store.samples_between(limit_id, window, oom_ts) if limit_id else []:
        if smp.usage_bytes is not None and (peak is None or smp.usage_bytes > peak):
            peak, peak_ts = smp.usage_bytes, smp.ts
    if usage is not None and (peak is None or usage >= peak):
        peak, peak_ts = usage, oom_ts
    parts = breakdown(store, ex, km, oom_ts, limit_id)
    stall = store.stall_ns([*store.ancestry(ex.cgroup_id), limit_id], window, oom_ts) or None
    host = store.host_at(oom_ts)
    return peak, peak_ts, parts, stall, host.mem_available if host else None


def oom_counter(store: Evidence, cgroup_id: int, oom_ts: int) -> Evidence_ | None:
    """memory.events oom_kill (v2) / memory.oom_control oom_kill (v1) rising across the
    kill: a third, independent source."""
    samples = store.samples_between(cgroup_id, oom_ts - HISTORY_NS, oom_ts + SETTLE_NS)
    before = [s for s in samples if s.ts < oom_ts and "oom_kill" in s.events]
    after = [s for s in samples if s.ts >= oom_ts and "oom_kill" in s.events]
    if before and after and after[-1].events["oom_kill"] > before[-1].events["oom_kill"]:
        n = after[-1].events["oom_kill"] - before[-1].events["oom_kill"]
        return (after[-1].ts, say.oom_counter_rose(after[-1].path, n))
    # read after the fact (post-mortem): a counter that started at 0 before the kill
    total = store.oom_counts.get(cgroup_id)
    if total is not None and total.count > 0 and total.ts <= oom_ts <= total.read_ns:
        return (total.read_ns, say.oom_count_reads(total.path, total.count))
    return None


def runtime_exit(store: Evidence, ex: Exit) -> Evidence_ | None:
    """The supervisor's own record of this very exit, read after the fact (post-mortem): its
    main process ended by SIGKILL (code 137) at this time. The runtime saw the death itself
    (conmon, containerd-shim and systemd wait for their child), so it is a source beside the
    kernel's log; its OOMKilled flag is quoted, not trusted (podman 4.3 says false for real
    OOM kills)."""
    for r in store.runtime_exits.get(ex.cgroup_id, ()):
        if (
            r.exit_code == 128 + _signal.SIGKILL
            and r.pid in (0, ex.pid)
            and abs(r.ts - ex.ts) <= SETTLE_NS
        ):
            return (r.ts, say.runtime_exit_says(r.source, r.unit, r.exit_code, r.oom_killed))
    return None


def counted_oom(v: ExitView) -> Finding | None:
    """A SIGKILL with no sender and no OOM report seen, where a memory cgroup's OOM counter
    (or a runtime's flag read from one: Docker's OOMKilled, systemd's Result=oom-kill) says an
    OOM kill happened in its cgroup during its life: cgroup_oom at medium confidence, since a
    counter names no victim."""
    ex, store = v.ex, v.ev
    evidence: list[Evidence_] = []
    where_id = 0
    for cid in store.ancestry(ex.cgroup_id):
        total = store.oom_counts.get(cid)
        if total is not None and total.count > 0 and total.ts <= ex.ts <= total.read_ns:
            evidence.append((total.read_ns, say.oom_count_reads(total.path, total.count)))
            where_id = where_id or cid
    for r in store.runtime_exits.get(ex.cgroup_id, ()):
        if r.oom_killed and r.pid in (0, ex.pid) and abs(r.ts - ex.ts) <= SETTLE_NS:
            evidence.append((r.ts, say.runtime_says_oom(r.source, r.unit)))
            where_id = where_id or ex.cgroup_id
    if not evidence:
        return None
    path = store.path(where_id)
    info = store.cgroups.get(where_id)
    limit = info.limit_bytes if info else None
    summary, advice = say.counted_oom_text(store.cgroup_label(where_id, path), limit)
    return Finding(
        CGROUP_OOM,
        MEDIUM,
        summary,
        advice,
        tuple(sorted([*evidence, v.exit_ev])),
        signal="SIGKILL",
        limit_cgroup=path,
        limit_scope=("own" if where_id == ex.cgroup_id else "ancestor") if path else None,
        limit_bytes=limit,
    )


def breakdown(
    store: Evidence, ex: Exit, km: KmsgOom | None, oom_ts: int, limit_id: int = 0
) -> tuple[tuple[str, int], ...]:
    """The limiting cgroup's composition at the kill (``composition``), followed by the
    victim's own RSS from the kernel log (``anon_rss``, ``file_rss``, ``shmem_rss``: the
    victim's, not the cgroup's; wording.memory_at_kill labels each)."""
    parts = composition(store, ex, km, oom_ts, limit_id)[0]
    if km is not None:
        # The kernel log's numbers are the victim process's RSS, not its cgroup's charge:
        # file-rss counts mapped files (libraries) that may be charged to other cgroups, so
        # anon + file can exceed the limit. Named as what they are (wording.memory_at_kill).
        pairs = (
            ("anon_rss", km.anon_rss_kb),
            ("file_rss", km.file_rss_kb),
            ("shmem_rss", km.shmem_rss_kb),
        )
        parts += tuple((k, val * 1024) for k, val in pairs if val is not None)
    return parts


def composition(
    store: Evidence, ex: Exit, km: KmsgOom | None, oom_ts: int, limit_id: int
) -> tuple[tuple[tuple[str, int], ...], str | None]:
    """What filled the limiting cgroup at the kill, and where that came from: (parts in
    say.COMPOSITION_KEYS order, the source's words or None when nothing was read).

    Best first: the kernel's own OOM report (its "Memory cgroup stats for" dump is the OOM's
    memcg at the moment of the kill); else the first memory.stat read of the limiting cgroup
    after the kill (the sampler reads it at once on a kill; the victim's anon may already be
    freed by then, tmpfs and page cache are not); else the last read in the 5 s before."""
    if km is not None and km.memcg_stat:
        return split_stat(km.memcg_stat), say.composition_source_kmsg(km.memcg_stat_path)
    ids = [i for i in (limit_id, ex.cgroup_id) if i]
    for cid in ids:
        after = [s for s in store.samples_between(cid, oom_ts, oom_ts + SETTLE_NS) if s.stat]
        if after:
            return split_stat(after[0].stat), say.composition_source_sample(
                after[0].path, after[0].ts - oom_ts
            )
    for cid in ids:
        before = [s for s in store.samples_between(cid, oom_ts - 5 * SECOND, oom_ts) if s.stat]
        fresh = before and (
            km is None
            or km.anon_rss_kb is None
            or (before[-1].usage_bytes or 0) * 2 >= km.anon_rss_kb * 1024
        )
        if before and fresh:
            return split_stat(before[-1].stat), say.composition_source_sample(
                before[-1].path, before[-1].ts - oom_ts
            )
    return (), None


def with_composition(
    v: ExitView,
    km: KmsgOom | None,
    oom_ts: int,
    limit_id: int,
    limit: int | None,
    summary: str,
    advice: str,
) -> tuple[str, str, Evidence_ | None]:
    """A cgroup OOM's summary and advice with what filled the limiting cgroup (issue 30 §1),
    and the evidence it was read from."""
    parts, source = composition(v.ev, v.ex, km, oom_ts, limit_id)
    said = say.composition_text(parts, limit)
    if said is None or source is None:
        return summary, advice, None
    what = say.composition_parts(list(parts), fmt_bytes)
    top = dict(parts)
    # Where tmpfs or kernel memory filled it, a higher limit only delays the next kill: that
    # advice comes first. Otherwise the limit's advice stands and the composition refines it.
    pinned = max(top.get("shmem", 0), top.get("kernel", 0) + top.get("sock", 0))
    first = pinned > top.get("anon", 0) + top.get("file_mapped", 0) + top.get("file_unmapped", 0)
    advice = f"{said[1]}; {advice}" if first else f"{advice}; {said[1]}"
    return f"{summary}; {said[0]}", advice, (oom_ts, f"{source}: {what}")


def split_stat(stat: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """memory.stat (v2 names, parse.memory.normalize_stat) as the parts a user acts on.

    ``file`` counts shmem in both versions (v1's ``cache`` too), so the page cache proper is
    file - shmem, split into mapped (``file_mapped``, capped: it can count mapped shmem) and
    unmapped. ``kernel`` is v2's (slab, stacks, page tables...) or v1's kmem usage, else the
    sum of the parts printed; ``sock`` is charged beside it on v2."""
    out: dict[str, int] = {}
    if "anon" in stat:
        out["anon"] = stat["anon"]
    shmem = stat.get("shmem", 0)
    if "shmem" in stat:
        out["shmem"] = shmem
    if "file" in stat:
        cache = max(stat["file"] - shmem, 0)
        mapped = min(stat.get("file_mapped", 0), cache)
        out["file_mapped"] = mapped
        out["file_unmapped"] = cache - mapped
    kernel = stat.get("kernel")
    if kernel is None:
        pieces = [stat[k] for k in ("slab", "kernel_stack", "pagetables") if k in stat]
        kernel = sum(pieces) if pieces else None
    if kernel is not None:
        out["kernel"] = kernel
    for k in ("slab", "pagetables", "sock", "swap"):
        if k in stat:
            out[k] = stat[k]
    return tuple(out.items())


# -- the GPU (the rules themselves are in tracer/analysis/gpu.py) ----------------------------


def gpu_exit(v: ExitView) -> Finding | None:
    """gpu_oom, device_reset, or an app_exit that GPU evidence explains (a recovered GPU OOM,
    an Xid 31/43 fault)."""
    store = v.ev.gpu
    ex = v.ex
    if ex.pid not in store.by_pid and not store.xids and not store.lost:
        # no GPU evidence about this process, nor any device report: the common case, even
        # on a GPU host (an agent judges every failing script there)
        return None
    f = gpu_rules.facts(store, ex, v.since)
    if not (f.user or f.device_down):
        return None
    ws = ex.wait
    crash = None
    own_doing = ws.signal is None
    killer = None
    if ws.signal is not None:
        name = signal_name(ws.signal)
        killer = fatal_signal(v.signals, ws.signal)
        # abort() and faults are raised by the process itself (sender == the process); the
        # kernel's SIGKILL (the OOM killer, even in the process's own context) and other
        # processes' signals are not its own doing
        if killer is not None:
            own_doing = killer.sender_pid == ex.pid and not _kernel_kill(killer)
        else:
            own_doing = ws.signal in _SELF_INFLICTED
        crash = f"aborted ({name})" if ws.signal == _signal.SIGABRT else f"died of {name}"
    finding = gpu_rules.judge(f, ex, v.exit_ev, own_doing=own_doing, crash=crash)
    if finding is None:
        return None
    if own_doing and killer is not None:
        what = say.raised_by_itself(signal_name(killer.sig))
        evidence = tuple(sorted([*finding.evidence, (killer.ts, what)]))
        return _with(finding, evidence=evidence)
    if finding.cause == DEVICE_RESET and killer is not None and not own_doing:
        # a process (or the kernel) killed it: that is direct, the device's fault inferred
        other = say.killed_by_other(signal_name(killer.sig), killer.sender_pid, killer.sender_comm)
        return _with(finding, disagreements=(*finding.disagreements, other))
    return finding


def _with(f: Finding, **changes: object) -> Finding:
    # f was made a moment ago by a rule and is not shared yet: set its fields in place
    for name, value in changes.items():
        setattr(f, name, value)
    return f


# -- signals ---------------------------------------------------------------------------------


def signal_exit(v: ExitView, had_oom: bool) -> Finding:
    # Long on purpose: one ladder over who sent the fatal signal, in the order it is decided
    # (nobody seen, the kernel, the process itself, a supervisor's probe kill, a user-space
    # OOM killer, anyone else), each rung a few lines over the same evidence list.
    ex = v.ex
    ws = ex.wait
    assert ws.signal is not None
    name = signal_name(ws.signal)
    core = " (core dumped)" if ws.core_dumped else ""
    last = fatal_signal(v.signals, ws.signal)
    disagree: tuple[str, ...] = ()
    if had_oom:
        disagree = (say.oom_reported_yet_killed(name),)
        if last is not None and not _kernel_kill(last):
            disagree = (say.oom_reported_yet_sent(name, last.sender_pid, last.sender_comm),)
    if last is None:
        if ws.signal == _signal.SIGKILL and not had_oom:
            counted = counted_oom(v)
            if counted is not None:
                return counted
        summary, advice = say.no_sender_text(name, core)
        return Finding(
            UNKNOWN,
            LOW,
            summary,
            advice,
            (v.exit_ev,),
            disagreements=(*disagree, say.NO_SIGNAL_EVENT),
        )
    if _kernel_kill(last):
        return kernel_kill(v, last, disagree)
    origin = kernel_origin(v, last, core, disagree)
    if origin is not None:
        return origin
    exe = last.sender_exe or (v.exe_of(last.sender_pid) if v.exe_of is not None else "")
    who = senders.classify(
        last.sender_comm,
        last.sender_pid,
        ex.pid,
        kernel=last.si_code == SI_KERNEL,
        supervisor_pids=v.supervisor_pids,
        exe=exe,
        cgroup=v.ev.path(last.sender_cgroup_id) or "",
        ancestor=last.sender_pid in v.ancestors,
    )
    if who.role in (senders.ROLE_SELF, senders.ROLE_KERNEL):
        # A fault the process raised itself (si_code > 0: SIGSEGV, SIGBUS, SIGFPE...; the
        # kernel's SI_KERNEL for a general protection fault) or abort(): the application
        # crashed.
        fault = last.si_code > 0 or who.role == senders.ROLE_KERNEL
        summary, advice = say.self_inflicted_text(name, core, fault)
        return Finding(
            APP_EXIT,
            HIGH,
            summary,
            advice,
            ((last.ts, say.raised_by_itself(name)), v.exit_ev),
            disagreements=disagree,
            sender_role=who.role,
        )
    # the signals of the minute before the kill (a process's whole life may be long)
    recent = [s for s in v.signals if last.ts - s.ts <= HISTORY_NS]
    evidence: list[Evidence_] = [
        (s.ts, say.signal_from(signal_name(s.sig), s.sender_pid, s.sender_comm))
        for s in recent
        if s.sender_pid != ex.pid
    ]
    evidence.append(v.exit_ev)
    if who.doubt:
        evidence.append((last.ts, who.doubt))
    # A stop: SIGTERM first, then SIGKILL from the same sender after the grace period.
    # (runtimes send each signal from a new `runc kill` process: match the sender by name)
    term = [s for s in recent if s.sig == _signal.SIGTERM and s.sender_comm == last.sender_comm]
    if ws.signal == _signal.SIGKILL and term:
        how = say.stop_how((last.ts - term[0].ts) / 1e9)
    else:
        how = f"{name}{core}"
    sender_exe = exe or None
    kill = SenderKill(last, who, how, evidence, disagree)
    if who.role in (senders.ROLE_SUPERVISOR, senders.ROLE_KUBELET):
        probe = probe_kill(v, kill)
        if probe is not None:
            return _with(probe, sender_exe=sender_exe)
    if who.role in (senders.ROLE_OOM_DAEMON, senders.ROLE_KUBELET):
        oom = userspace_oom(v, kill)
        if oom is not None:
            return _with(oom, sender_exe=sender_exe)
    summary, advice = say.sender_text(who, how, last.sender_comm, last.sender_pid)
    return Finding(
        SIGNAL_KILL,
        HIGH,
        summary,
        advice,
        tuple(sorted(evidence)),
        disagreements=disagree,
        sender_pid=last.sender_pid,
        sender_comm=last.sender_comm,
        sender_role=who.role,
        sender_exe=sender_exe,
    )


def own_source(last: Signal) -> str | None:
    """Which of the process's own set-ups raised ``last`` (wording.OWN_SIGNAL_SOURCES), if
    one did."""
    code, sig = last.si_code, last.sig
    if code in (SI_TIMER, SI_MESGQ, SI_ASYNCIO):
        return "timer" if code == SI_TIMER else "sigio"
    if code == SI_SIGIO or (sig == _signal.SIGIO and code in POLL_CODES):
        return "sigio"
    if code == SI_KERNEL and sig in _ITIMER_SIGNALS:
        return "itimer"
    if code == SI_KERNEL and sig == _signal.SIGXCPU:
        return "rlimit_cpu"
    return None


def kernel_origin(
    v: ExitView, last: Signal, core: str, disagree: tuple[str, ...]
) -> Finding | None:
    """A fatal signal the kernel sent for the process's own set-up, whichever task's context
    it ran in: its parent-death signal (sent by the parent's exiting thread), its terminal, its
    own timers, asynchronous I/O or CPU time limit. None: a sender to classify."""
    name = signal_name(last.sig)
    if last.sender_exiting and last.si_code == SI_USER and last.sender_pid != v.ex.pid:
        # forget_original_parent() sends pdeath_signal from the exiting thread, as SI_USER
        summary, advice = say.pdeath_text(name, core, last.sender_pid, last.sender_comm)
        line = say.pdeath_line(name, last.sender_pid, last.sender_comm)
        return Finding(
            SIGNAL_KILL,
            HIGH,
            summary,
            advice,
            ((last.ts, line), v.exit_ev),
            disagreements=disagree,
            sender_pid=last.sender_pid,
            sender_comm=last.sender_comm,
            sender_role=senders.ROLE_KERNEL,
        )
    if last.si_code == SI_KERNEL and last.sig in _TTY_SIGNALS:
        summary, advice = say.tty_text(name, core)
        return Finding(
            SIGNAL_KILL,
            HIGH,
            summary,
            advice,
            ((last.ts, say.tty_line(name)), v.exit_ev),
            disagreements=disagree,
            sender_role=senders.ROLE_KERNEL,
        )
    source = own_source(last)
    if source is None:
        return None
    summary, advice = say.own_source_text(source, name, core)
    return Finding(
        APP_EXIT,
        HIGH,
        summary,
        advice,
        ((last.ts, say.own_source_line(source, name)), v.exit_ev),
        disagreements=disagree,
        sender_role=senders.ROLE_SELF,
    )


def kernel_kill(v: ExitView, last: Signal, disagree: tuple[str, ...]) -> Finding:
    """A SIGKILL the kernel sent, with no OOM report for this process: the OOM killer whose
    report is late or lost, or a PID namespace's end. Only evidence decides which: the memory
    cgroup's OOM counter rising across the kill, or the sender being its unit's main process
    that had just exited (the init of its namespace). Otherwise: unknown, never "not an OOM
    kill" without evidence against it."""
    ex, store = v.ex, v.ev
    kill_ev = (last.ts, say.sent_by_kernel("SIGKILL", last.sender_pid, last.sender_comm))
    for cid in store.ancestry(ex.cgroup_id, at=last.ts):
        counter = oom_counter(store, cid, last.ts)
        if counter is not None:
            where = store.path(cid)
            summary, advice = say.kernel_kill_counted_text(store.cgroup_label(cid, where))
            return Finding(
                CGROUP_OOM,
                MEDIUM,
                summary,
                advice,
                tuple(sorted([kill_ev, counter, v.exit_ev])),
                disagreements=(*disagree, say.NO_OOM_REPORT),
                limit_cgroup=where,
                limit_scope="own" if cid == ex.cgroup_id else "ancestor",
            )
    init = v.init_exit
    if (
        init is not None
        and init[0] == last.sender_pid
        and init[0] != ex.pid
        and abs(last.ts - init[1]) <= SETTLE_NS
    ):
        summary, advice = say.namespace_end_text(init[0])
        return Finding(
            SIGNAL_KILL,
            MEDIUM,
            summary,
            advice,
            (kill_ev, v.exit_ev),
            disagreements=disagree,
            sender_pid=last.sender_pid,
            sender_comm=last.sender_comm,
            sender_role=senders.ROLE_KERNEL,
        )
    lost = store.lost_between(last.ts - SECOND, ex.ts + SETTLE_NS)
    summary, advice = say.unexplained_kernel_kill_text(sum(x.count for x in lost))
    return Finding(
        UNKNOWN,
        LOW,
        summary,
        advice,
        tuple(sorted([kill_ev, v.exit_ev, *((x.ts, say.lost_evidence(x.count)) for x in lost)])),
        disagreements=disagree,
        sender_role=senders.ROLE_KERNEL,
    )


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


def probe_kill(v: ExitView, kill: SenderKill) -> Finding | None:
    """A supervisor's kill (a runtime, the kubelet, systemd, a --supervisor pid, or the
    process that started the victim) while the unit's health probes were failing or slow."""
    ex, store, last = v.ex, v.ev, kill.last
    failing = failing_probes(v, last.ts)
    # a runtime's own health check (podman/docker HEALTHCHECK) is counted by the runtime,
    # which kills after its own --health-retries: the failed check just before its kill is its
    # decision; our probes need the recording's threshold
    need = 1 if failing and failing[-1].target == RUNTIME_HEALTHCHECK else v.probe_failures
    if not failing or len(failing) < max(1, need):
        return None
    start = last.ts - PROBE_WINDOW_NS
    recent = failing[-max(3, min(len(failing), 8)) :]
    stall = store.stall_ns(store.ancestry(ex.cgroup_id), start, last.ts)
    psi = store.psi_peak(start, last.ts)
    ev = [*kill.evidence, *((p.ts, say.probe_line(p)) for p in recent)]
    # only slow, never failed: the supervisor's patience is inferred, not recorded
    slow_only = all(p.ok and not p.timed_out for p in failing)
    starting = never_healthy(v, last.ts) is not None
    summary, advice = say.probe_kill_text(
        kill.who.description,
        kill.how,
        say.probe_latencies(recent[-3:]),
        stall,
        psi,
        failed_for_ns=last.ts - failing[0].ts,
        slow_only=slow_only,
        starting_ns=last.ts - ex.start_ns if starting else None,
    )
    return kill.finding(
        PROBE_KILL,
        # two sources: the prober's failures and the signal hook's record of the kill
        MEDIUM if slow_only else HIGH,
        summary,
        advice,
        ev,
        stall_ns=stall or None,
        probe_failures=len(failing),
    )


@dataclass(frozen=True, slots=True)
class Pressure:
    """Memory pressure in the minute before a kill, from the samples: what a user-space OOM
    killer acts on."""

    evidence: tuple[Evidence_, ...]
    words: str  # "PSI some 42%, MemAvailable 180 MiB of 8 GiB, ..." ("" when none seen)
    high: bool  # over a threshold a user-space killer would act on
    stall_ns: int
    host_available: int | None


def pressure_before(v: ExitView, until: int) -> Pressure:
    ex, store = v.ex, v.ev
    start = until - HISTORY_NS
    evidence: list[Evidence_] = []
    high = False
    some: float | None = None
    worst_words: tuple[str, float, int] | None = None
    hosts = [h for h in store.host if start <= h.ts <= until]
    psi = [h for h in hosts if h.psi_some_avg10 is not None]
    if psi:
        top = max(psi, key=lambda h: h.psi_some_avg10 or 0.0)
        some = top.psi_some_avg10 or 0.0
        evidence.append((top.ts, say.host_psi(some, top.psi_full_avg10)))
        high |= some >= PRESSURE_PSI_SOME
    avail = [(h.mem_available, h) for h in hosts if h.mem_total and h.mem_available is not None]
    host_available = None
    if avail:
        host_available, low = min(avail, key=lambda a: a[0])
        evidence.append((low.ts, say.host_available(host_available, low.mem_total)))
        high |= host_available < PRESSURE_AVAILABLE * low.mem_total
    worst: tuple[float, CgroupSample, int] | None = None
    cg_psi: CgroupSample | None = None
    for cid in store.ancestry(ex.cgroup_id, at=until):
        info = store.cgroups.get(cid)
        for smp in store.samples_between(cid, start, until):
            limit = smp.limit_bytes or (info.limit_bytes if info else None)
            if limit and smp.usage_bytes is not None:
                ratio = smp.usage_bytes / limit
                if worst is None or ratio > worst[0]:
                    worst = (ratio, smp, limit)
            if smp.psi_some_avg10 is not None and (
                cg_psi is None or smp.psi_some_avg10 > (cg_psi.psi_some_avg10 or 0.0)
            ):
                cg_psi = smp
    if worst is not None:
        ratio, smp, limit = worst
        evidence.append((smp.ts, say.cgroup_usage(smp.path, smp.usage_bytes or 0, limit)))
        worst_words = (smp.path, ratio, limit)
        high |= ratio >= PRESSURE_USAGE
    if cg_psi is not None and cg_psi.psi_some_avg10:
        evidence.append((cg_psi.ts, say.cgroup_psi(cg_psi.path, cg_psi.psi_some_avg10)))
        high |= cg_psi.psi_some_avg10 >= PRESSURE_PSI_SOME
    stall = store.stall_ns(store.ancestry(ex.cgroup_id), start, until)
    high |= stall >= PRESSURE_STALL_NS
    words = say.pressure_words(some, host_available, worst_words, stall)
    return Pressure(tuple(evidence), words, high, stall, host_available)


def supervisor_record(v: ExitView, kill_ts: int) -> tuple[RuntimeSample, str] | None:
    """The supervisor's own record of this kill (systemd's Result=oom-kill and exit status of
    a unit's main process, read by the recorder as the process ended): the first sample of
    the victim's unit, from the kill to the settle past its exit, that records an exit. Its
    word is quoted beside the kernel's, not trusted over it."""
    if not v.unit or not v.main:
        return None
    end = v.ex.ts + SETTLE_NS
    for r in v.ev.runtime.get(v.unit, ()):
        if kill_ts <= r.ts <= end and (r.oom_killed or r.exit_code is not None):
            return r, say.supervisor_recorded(r.source, r.unit, r.exit_code, r.oom_killed)
    return None


def userspace_oom(v: ExitView, kill: SenderKill) -> Finding | None:
    """A user-space memory killer's kill (systemd-oomd, earlyoom, nohang, lmkd; the kubelet
    evicting under memory pressure), with the pressure it acted on. The killer is known by its
    executable or cgroup (high, with pressure seen), or by its name only (medium); a kubelet's
    kill is an eviction only when the pressure is there (medium: its decision is inferred)."""
    last, who, evidence = kill.last, kill.who, kill.evidence
    p = pressure_before(v, last.ts)
    kubelet = who.role == senders.ROLE_KUBELET
    if kubelet and not p.high:
        return None  # a pod deletion or a redeploy: a signal_kill by the kubelet
    strong = who.identified_by in (senders.BY_EXECUTABLE, senders.BY_CGROUP)
    confidence = HIGH if strong and p.evidence and not kubelet else MEDIUM
    record = supervisor_record(v, last.ts)
    summary, advice = say.userspace_oom_text(
        who.description,
        kill.how,
        p.words,
        kubelet,
        record[0].source if record and record[0].oom_killed else "",
    )
    if record is not None:
        evidence = [*evidence, (record[0].ts, record[1])]
    if not strong:
        evidence = [*evidence, (last.ts, say.known_by_name_only(last.sender_comm))]
    return kill.finding(
        USERSPACE_OOM,
        confidence,
        summary,
        advice,
        [*evidence, *p.evidence],
        stall_ns=p.stall_ns or None,
        host_available=p.host_available,
    )
