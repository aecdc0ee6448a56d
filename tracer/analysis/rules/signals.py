"""Deaths by a signal: who sent it, in the order it is decided (nobody seen, the kernel, the
process itself or its own set-up, a supervisor's probe kill, a user-space OOM killer, anyone
else)."""

from __future__ import annotations

import signal as _signal

from tracer.analysis import senders
from tracer.analysis import wording as say
from tracer.analysis.evidence import HISTORY_NS
from tracer.analysis.findings import (
    APP_EXIT,
    CGROUP_OOM,
    HIGH,
    LOW,
    MEDIUM,
    SIGNAL_KILL,
    UNKNOWN,
    Evidence_,
    Finding,
)
from tracer.analysis.rules.oom import counted_oom, oom_counter
from tracer.analysis.rules.supervisors import probe_kill, userspace_oom
from tracer.analysis.rules.view import (
    SECOND,
    SETTLE_NS,
    ExitView,
    SenderKill,
    amend,
    fatal_signal,
    is_kernel_kill,
    sender_of,
    sent_by,
)
from tracer.events import (
    BUS_ADRERR,
    SI_KERNEL,
    SI_USER,
    Signal,
    signal_name,
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
        if last is not None and not is_kernel_kill(last):
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
    if is_kernel_kill(last):
        return kernel_kill(v, last, disagree)
    origin = kernel_origin(v, last, core, disagree)
    if origin is not None:
        return origin
    who, exe = sender_of(v, last)
    if who.role in (senders.ROLE_SELF, senders.ROLE_KERNEL):
        # A fault the process raised itself (si_code > 0: SIGSEGV, SIGBUS, SIGFPE...; the
        # kernel's SI_KERNEL for a general protection fault) or abort(): the application
        # crashed.
        fault = last.si_code > 0 or who.role == senders.ROLE_KERNEL
        full = tmpfs_crash(v, last, core, disagree)
        if full is not None:
            return full
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
            return amend(probe, sender_exe=sender_exe)
    if who.role in (senders.ROLE_OOM_DAEMON, senders.ROLE_KUBELET):
        oom = userspace_oom(v, kill)
        if oom is not None:
            return amend(oom, sender_exe=sender_exe)
    summary, advice = say.sender_text(who, how, last.sender_comm, last.sender_pid)
    return sent_by(last, who, exe, summary, advice, evidence, disagree)


def tmpfs_crash(v: ExitView, last: Signal, core: str, disagree: tuple[str, ...]) -> Finding | None:
    """A SIGBUS the kernel raised at the process's own fault for an address it could not back
    (BUS_ADRERR), with a tmpfs it sees measured full within a second after it: a write to a
    shared mapping of a file on a full tmpfs (shmem_fault() -> VM_FAULT_SIGBUS on -ENOSPC,
    tracer/sources/tmpfs.py). Still the application's crash, but the fix is room on that
    filesystem, not memory. High: the fault is recorded and the full filesystem is measured.
    None: no such measurement (a plain crash)."""
    if last.sig != _signal.SIGBUS or last.si_code != BUS_ADRERR:
        return None
    full = [t for t in v.tmpfs_full if 0 <= t.ts - last.ts <= SECOND]
    if not full:
        return None
    # the one it maps a file of, else the fullest
    t = max(full, key=lambda t: (t.mapped, t.used_bytes / max(t.size_bytes, 1)))
    name = signal_name(last.sig)
    summary, advice = say.tmpfs_full_text(name, core, t.mount_point, t.size_bytes, t.used_bytes)
    line = say.tmpfs_full_line(t.mount_point, t.size_bytes, t.used_bytes, t.avail_bytes, t.via_pid)
    return Finding(
        APP_EXIT,
        HIGH,
        summary,
        advice,
        tuple(sorted([(last.ts, say.raised_by_itself(name)), (t.ts, line), v.exit_ev])),
        disagreements=disagree,
        sender_role=senders.ROLE_SELF,
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
