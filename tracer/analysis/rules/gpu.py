"""The GPU rules: what GPU evidence says about one process exit. ``gpu_exit`` takes the
exit's GPU facts (tracer/analysis/gpu_store.py) and the signal that ended it; ``judge`` decides
the GPU cause. The GPU's words are here, beside the one rule family that says them.

The rules (ARCHITECTURE.md, "Verdicts need agreement"):

* ``device_reset``: the GPU was lost (NVML: GPU is lost / reset required; kernel log: fallen off
  the bus) or an Xid 79 came within ``RESET_WINDOW_NS`` before the exit (or just after it), the
  process used a GPU, and it did not exit cleanly. A lost device takes every context on it.
* ``gpu_oom``: device allocations of this process failed with CUDA_ERROR_OUT_OF_MEMORY (caught
  at libcuda) and it then exited non-zero or aborted / crashed by its own hand. High confidence
  when the last failure came shortly before the exit and nothing succeeded after it.
* A *recovered* GPU OOM (failures, then successful allocations, and a clean exit) is an event
  (``GpuOomRecovered``), never a verdict: the exit is ``app_exit``, with the recovery noted.
* Xid 31 and 43 are faults of the application's own GPU code: an exit after one that names this
  process is ``app_exit`` with the fault named, never an OOM.
* CUDA could not start: ``cuInit`` or context creation failed (no device 100, driver mismatch
  803, forward compatibility 804, unknown 999, ...). The exit stays ``app_exit`` (the process
  gave up on its own), with the failure named in the summary, the evidence and the advice.
"""

from __future__ import annotations

import signal as _signal

from tracer.analysis import wording as say
from tracer.analysis.findings import (
    DEVICE_RESET,
    Finding,
)
from tracer.analysis.gpu_store import GpuFacts, facts
from tracer.analysis.quantities import fmt_bytes
from tracer.analysis.rules.view import SECOND, ExitView, amend, fatal_signal, is_kernel_kill
from tracer.events import (
    Exit,
    GpuAllocFailure,
    GpuCallFailure,
    GpuLost,
    GpuXid,
    signal_name,
)
from tracer.parse import cuda
from tracer.parse.xid import xid_meaning

# Signals a process raises on itself (abort(), faults): without a signal event for the exit,
# these are taken as its own doing.
_SELF_INFLICTED = frozenset(
    {_signal.SIGABRT, _signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL}
)


def gpu_exit(v: ExitView) -> Finding | None:
    """gpu_oom, device_reset, or an app_exit that GPU evidence explains (a recovered GPU OOM,
    an Xid 31/43 fault)."""
    store = v.ev.gpu
    ex = v.ex
    if ex.pid not in store.by_pid and not store.xids and not store.lost:
        # no GPU evidence about this process, nor any device report: the common case, even
        # on a GPU host (an agent judges every failing script there)
        return None
    f = facts(store, ex, v.since)
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
            own_doing = killer.sender_pid == ex.pid and not is_kernel_kill(killer)
        else:
            own_doing = ws.signal in _SELF_INFLICTED
        crash = f"aborted ({name})" if ws.signal == _signal.SIGABRT else f"died of {name}"
    finding = judge(f, ex, v.exit_ev, own_doing=own_doing, crash=crash)
    if finding is None:
        return None
    if own_doing and killer is not None:
        what = say.raised_by_itself(signal_name(killer.sig))
        evidence = tuple(sorted([*finding.evidence, (killer.ts, what)]))
        return amend(finding, evidence=evidence)
    if finding.cause == DEVICE_RESET and killer is not None and not own_doing:
        # a process (or the kernel) killed it: that is direct, the device's fault inferred
        other = say.killed_by_other(signal_name(killer.sig), killer.sender_pid, killer.sender_comm)
        return amend(finding, disagreements=(*finding.disagreements, other))
    return finding


RECENT_FAILURE_NS = 10 * SECOND  # a failure this close to the exit caused it (high confidence)


def _ending(ex: Exit, crash: str | None) -> str:
    ws = ex.wait
    if ws.signal is None:
        return f"exited with code {ws.code}"
    return crash or "was killed"


def _describe_failure(e: GpuAllocFailure) -> str:
    return (
        f"[uprobe] {e.function} of {fmt_bytes(e.requested_bytes)} returned "
        f"CUDA_ERROR_OUT_OF_MEMORY with {fmt_bytes(e.held_bytes)} held"
    )


def _describe_down(e: GpuXid | GpuLost) -> str:
    return f"[{e.source}] {say.gpu_down(e)}"


def judge(
    f: GpuFacts, ex: Exit, exit_ev: tuple[int, str], *, own_doing: bool, crash: str | None
) -> Finding | None:
    """The GPU cause of this exit, or None when GPU evidence does not decide it.

    ``own_doing``: the process ended itself (an exit code, or a signal it raised or a fault);
    False when another process or the kernel's OOM killer killed it. ``crash`` words the
    signal ending ("aborted (SIGABRT)") when there was one."""
    ws = ex.wait
    clean = ws.signal is None and ws.code == 0
    named = any(isinstance(e, GpuXid) and e.pid == ex.pid for e in f.device_down)
    if f.device_down and (f.user or named) and not clean:
        return _device_reset(f, ex, exit_ev, crash)
    starts = [c for c in f.calls if c.function in cuda.INIT_FUNCTIONS]
    if clean:
        if f.failures:
            return _recovered(f, ex, exit_ev)
        if starts:
            return _no_cuda(f, starts[0], ex, exit_ev, crash)
        return None
    if f.failures and own_doing:
        return _gpu_oom(f, ex, exit_ev, crash)
    if starts and own_doing:
        return _no_cuda(f, starts[0], ex, exit_ev, crash)
    if f.app_faults and own_doing:
        x = f.app_faults[-1]
        return Finding(
            cause="app_exit",
            confidence="high",
            summary=f"{_ending(ex, crash)} after a GPU fault of its own: Xid {x.xid} "
            f"({xid_meaning(x.xid)})",
            advice="the application's GPU code faulted (a bug, not a lack of memory): run it "
            "under compute-sanitizer or with CUDA_LAUNCH_BLOCKING=1 to find the kernel",
            evidence=tuple(sorted([(x.ts, _describe_down(x)), exit_ev])),
        )
    return None


def _device_reset(f: GpuFacts, ex: Exit, exit_ev: tuple[int, str], crash: str | None) -> Finding:
    # independent observations: NVML's event, NVML's failing queries, the driver's kernel
    # log; the driver's Xid line and its "fallen off the bus" line about one event are two
    # lines of one source
    sources = {(e.source, "" if e.source == "kmsg" else type(e).__name__) for e in f.device_down}
    evidence = [(e.ts, _describe_down(e)) for e in f.device_down]
    evidence += [(e.ts, _describe_failure(e)) for e in f.failures[-1:]]
    first = f.device_down[0]
    return Finding(
        cause="device_reset",
        confidence="high" if len(sources) >= 2 else "medium",
        summary=f"{_ending(ex, crash)} when its GPU went down: {_describe_down(first)}",
        advice="the device failed, not the application: drain the node, check the GPU "
        "(nvidia-smi -q, the kernel log, power and PCIe), reset or replace it before "
        "rescheduling; memory settings will not help",
        evidence=tuple(sorted([*evidence, exit_ev])),
        disagreements=(("this process also had GPU allocation failures",) if f.failures else ()),
    )


def _gpu_oom(f: GpuFacts, ex: Exit, exit_ev: tuple[int, str], crash: str | None) -> Finding:
    last = f.failures[-1]
    after = [r for r in f.recovered if r.ts > last.ts]
    evidence: list[tuple[int, str]] = [(e.ts, _describe_failure(e)) for e in f.failures[-8:]]
    if len(f.failures) > 8:
        evidence.insert(0, (f.failures[0].ts, f"... {len(f.failures) - 8} earlier failures"))
    evidence += [
        (r.ts, f"[uprobe] {r.function} succeeded again after {say.n_failures(r.failures)}")
        for r in f.recovered
    ]
    disagree: list[str] = []
    recent = ex.ts - last.ts <= RECENT_FAILURE_NS
    if after:
        disagree.append(
            f"allocations succeeded after the last failure ({len(after)} recoveries): "
            "it had recovered before it ended"
        )
    if not recent:
        disagree.append(f"the last failure came {(ex.ts - last.ts) / 1e9:.0f} s before the exit")
    peak = max(e.peak_bytes for e in f.failures) or None
    where = ""
    total = used = None
    if f.device is not None:
        d = f.device
        total, used = d.total_bytes, d.used_bytes
        where = (
            f"; NVML: GPU {d.index} ({d.name or d.uuid}) had {fmt_bytes(d.used_bytes)} of "
            f"{fmt_bytes(d.total_bytes)} in use"
        )
        evidence.append(
            (
                d.ts,
                f"[nvml] GPU {d.index}: {fmt_bytes(d.used_bytes)} used, "
                f"{fmt_bytes(d.free_bytes)} free of {fmt_bytes(d.total_bytes)}",
            )
        )
        if d.free_bytes >= last.requested_bytes:
            disagree.append(
                f"NVML showed {fmt_bytes(d.free_bytes)} free, more than the "
                f"{fmt_bytes(last.requested_bytes)} asked for: fragmentation, or a limit "
                "below the device (MIG slice, MPS quota)"
            )
    if f.own is not None and f.own.used_bytes is not None:
        evidence.append((f.own.ts, f"[nvml] this process used {fmt_bytes(f.own.used_bytes)}"))
    # high: the process was told "out of memory" shortly before it ended by its own hand and
    # nothing disagrees (the uprobe saw the failure returned to it; the exit is the kernel's
    # own record of the ending): README, "How sure a verdict is". NVML's reading of the device
    # is in the evidence, but lifts nothing over a disagreement (a failure long before the
    # exit, a recovery after it).
    confidence = "high" if not disagree else "medium"
    # the kernel's own count of failures since the last success: the store keeps the last few
    n = max(len(f.failures), last.failures)
    summary = (
        f"GPU out of memory: {n} device allocation{'s' if n != 1 else ''} failed "
        f"(last: {last.function} of {fmt_bytes(last.requested_bytes)} with "
        f"{fmt_bytes(last.held_bytes)} already held), then it {_ending(ex, crash)}{where}"
    )
    return Finding(
        cause="gpu_oom",
        confidence=confidence,
        summary=summary,
        advice=_gpu_oom_advice(f, last, peak),
        evidence=tuple(sorted([*evidence, exit_ev])),
        disagreements=tuple(disagree),
        peak_bytes=peak,
        limit_bytes=total,
        usage_bytes=used,
    )


def _gpu_oom_advice(f: GpuFacts, last: GpuAllocFailure, peak: int | None) -> str:
    """What to change after a GPU OOM: what it held and asked for, and who else held memory."""
    others = ""
    if f.device is not None and f.own is not None and f.own.used_bytes is not None:
        rest = f.device.used_bytes - f.own.used_bytes
        if rest > 0:
            others = f"; other processes held {fmt_bytes(rest)} of that GPU"
    held = (
        f"it held up to {fmt_bytes(peak)} and asked for {fmt_bytes(last.requested_bytes)} more"
        if peak
        else f"it asked for {fmt_bytes(last.requested_bytes)} before holding any"
    )
    return (
        f"{held}{others}: lower the batch size or sequence length, cap the framework's cache "
        "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation), or give it "
        "a larger GPU or one of its own"
    )


def _describe_call(e: GpuCallFailure) -> str:
    size = f" of {fmt_bytes(e.requested_bytes)}" if e.requested_bytes else ""
    return f"[uprobe] {e.function}{size} returned {cuda.name(e.result)} ({e.result})"


def _no_cuda(
    f: GpuFacts, first: GpuCallFailure, ex: Exit, exit_ev: tuple[int, str], crash: str | None
) -> Finding:
    """CUDA could not start: the first failing cuInit / context creation is the cause (later
    failures, e.g. CUDA_ERROR_NOT_INITIALIZED from allocations, follow from it)."""
    shown = f.calls[-8:]
    evidence = [(e.ts, _describe_call(e)) for e in shown]
    if first not in shown:
        evidence.insert(0, (first.ts, _describe_call(first)))
    total = max(len(f.calls), f.calls[-1].failures)
    if total > len(evidence):
        evidence.insert(0, (f.calls[0].ts, f"... {total} failing driver calls in all"))
    clean = ex.wait.signal is None and ex.wait.code == 0
    then = "exited with code 0: it ran without the GPU" if clean else _ending(ex, crash)
    return Finding(
        cause="app_exit",
        confidence="high",
        summary=f"CUDA could not initialise: {cuda.name(first.result)} ({first.function} "
        f"returned {first.result}), then it {then}",
        advice=cuda.advice(first.result),
        evidence=tuple(sorted([*evidence, exit_ev])),
    )


def _recovered(f: GpuFacts, ex: Exit, exit_ev: tuple[int, str]) -> Finding:
    n = len(f.failures)
    how = (
        f"{len(f.recovered)} later allocation{'s' if len(f.recovered) != 1 else ''} succeeded"
        if f.recovered
        else "it did not allocate again"
    )
    evidence = [(e.ts, _describe_failure(e)) for e in f.failures[-8:]]
    evidence += [
        (r.ts, f"[uprobe] {r.function} succeeded again after {say.n_failures(r.failures)}")
        for r in f.recovered
    ]
    return Finding(
        cause="app_exit",
        confidence="high",
        summary=f"exited on its own with code 0; it had a recovered GPU OOM: {n} device "
        f"allocation{'s' if n != 1 else ''} failed and {how}",
        advice="it ran at the edge of the GPU's memory and coped (frameworks free caches and "
        "retry); keep headroom if the retries cost latency",
        evidence=tuple(sorted([*evidence, exit_ev])),
        peak_bytes=max(e.peak_bytes for e in f.failures) or None,
    )
