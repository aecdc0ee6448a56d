"""The GPU rules of the analysis: what GPU evidence says about one process exit. Pure.

``GpuStore`` keeps the GPU events (bounded, per pid and per device) for ``tracer.analysis.
evidence.Evidence``; ``facts`` gathers what concerns one exit; ``judge`` turns that into a
``Finding`` (tracer/analysis/findings.py) that the verdict factory makes a verdict of (kept
apart so that the GPU rules read as one piece; tracer/analysis/rules.py calls them in turn).

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

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from tracer.analysis.findings import Finding
from tracer.analysis.quantities import fmt_bytes
from tracer.events import (
    Event,
    Exit,
    GpuAllocFailure,
    GpuCallFailure,
    GpuLibrary,
    GpuLost,
    GpuOomRecovered,
    GpuProcessSample,
    GpuSample,
    GpuXid,
)
from tracer.parse import cuda
from tracer.parse.xid import APP_FAULT_XIDS, DEVICE_LOST_XIDS, xid_meaning

__all__ = ["Finding", "GpuFacts", "GpuStore", "describe_event", "facts", "judge"]

SECOND = 1_000_000_000
RESET_WINDOW_NS = 10 * SECOND  # a lost device before the exit: its processes fail within this
AFTER_EXIT_NS = 1 * SECOND  # the driver's report may be stamped a little after the exit
RECENT_FAILURE_NS = 10 * SECOND  # a failure this close to the exit caused it (high confidence)

MAX_PIDS = 8192
PER_PID = 256


@dataclass
class _PidGpu:
    failures: deque[GpuAllocFailure] = field(default_factory=lambda: deque(maxlen=PER_PID))
    recovered: deque[GpuOomRecovered] = field(default_factory=lambda: deque(maxlen=PER_PID))
    samples: deque[GpuProcessSample] = field(default_factory=lambda: deque(maxlen=64))
    # the kernel sends a process's first 64 failing calls: all of them fit
    calls: deque[GpuCallFailure] = field(default_factory=lambda: deque(maxlen=64))
    user_since: int | None = None  # first sign that it uses a GPU


class GpuStore:
    """GPU evidence, bounded in count (per pid and per device) and pruned to the history."""

    def __init__(self) -> None:
        self.by_pid: OrderedDict[int, _PidGpu] = OrderedDict()
        self.xids: deque[GpuXid] = deque(maxlen=1024)
        self.lost: deque[GpuLost] = deque(maxlen=256)
        self.devices: dict[int, deque[GpuSample]] = {}
        self.bus_index: dict[str, int] = {}  # pci_key of a PCI bus id -> NVML index

    def _pid(self, pid: int) -> _PidGpu:
        item = self.by_pid.get(pid)
        if item is None:
            item = self.by_pid[pid] = _PidGpu()
            if len(self.by_pid) > MAX_PIDS:
                self.by_pid.popitem(last=False)
        else:
            self.by_pid.move_to_end(pid)
        return item

    def _user(self, pid: int, ts: int) -> _PidGpu:
        p = self._pid(pid)
        if p.user_since is None:
            p.user_since = ts
        return p

    # the event types ``add`` keeps (Evidence dispatches on them)
    KINDS: tuple[type[Event], ...] = (
        GpuAllocFailure,
        GpuOomRecovered,
        GpuCallFailure,
        GpuLibrary,
        GpuProcessSample,
        GpuXid,
        GpuLost,
        GpuSample,
    )

    def add(self, ev: Event) -> bool:
        """Keep a GPU event; False for any other event."""
        if isinstance(ev, GpuAllocFailure):
            self._user(ev.pid, ev.ts).failures.append(ev)
        elif isinstance(ev, GpuOomRecovered):
            self._user(ev.pid, ev.ts).recovered.append(ev)
        elif isinstance(ev, GpuCallFailure):
            self._user(ev.pid, ev.ts).calls.append(ev)
        elif isinstance(ev, GpuLibrary):
            self._user(ev.pid, ev.ts)
        elif isinstance(ev, GpuProcessSample):
            self._user(ev.pid, ev.ts).samples.append(ev)
        elif isinstance(ev, GpuXid):
            self.xids.append(ev)
            if ev.pid is not None:
                self._user(ev.pid, ev.ts)
        elif isinstance(ev, GpuLost):
            self.lost.append(ev)
        elif isinstance(ev, GpuSample):
            self.devices.setdefault(ev.index, deque(maxlen=1200)).append(ev)
            key = pci_key(ev.pci_bus_id)
            if key is not None:
                self.bus_index[key] = ev.index
        else:
            return False
        return True

    def forget_pid(self, pid: int, until: int) -> None:
        """Drop what a pid did up to its exit (a later process may reuse the pid)."""
        p = self.by_pid.get(pid)
        if p is None:
            return
        p.failures = deque((e for e in p.failures if e.ts > until), maxlen=PER_PID)
        p.recovered = deque((e for e in p.recovered if e.ts > until), maxlen=PER_PID)
        p.samples = deque((e for e in p.samples if e.ts > until), maxlen=64)
        p.calls = deque((e for e in p.calls if e.ts > until), maxlen=64)
        p.user_since = None
        if not (p.failures or p.recovered or p.samples or p.calls):
            del self.by_pid[pid]

    def seen(self) -> bool:
        """Whether the recording has any GPU evidence at all (most have none: the GPU rules
        are skipped then)."""
        return bool(self.by_pid or self.xids or self.lost)

    def prune(self, horizon: int) -> None:
        for p in self.by_pid.values():
            while p.failures and p.failures[0].ts < horizon:
                p.failures.popleft()
            while p.recovered and p.recovered[0].ts < horizon:
                p.recovered.popleft()
            while p.calls and p.calls[0].ts < horizon:
                p.calls.popleft()


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """The GPU evidence that concerns one exit."""

    user: bool  # the process used a GPU (mapped libcuda, NVML listed it, allocated, was named)
    failures: tuple[GpuAllocFailure, ...]  # from its start (or the history window) to its exit
    recovered: tuple[GpuOomRecovered, ...]
    calls: tuple[GpuCallFailure, ...]  # other failing driver calls (cuInit, contexts, ...)
    device_down: tuple[GpuXid | GpuLost, ...]  # lost / reset / Xid 79 around the exit
    app_faults: tuple[GpuXid, ...]  # Xid 31/43 naming this process
    device: GpuSample | None  # NVML's last reading of its device before the last failure
    own: GpuProcessSample | None  # NVML's last reading of this process before the last failure


def pci_key(bus_id: str) -> str | None:
    """A PCI address as the kernel log ("0000:3b:00") and NVML ("00000000:3B:00.0") print
    it, reduced to one form (domain:bus:device), or None when it is not one."""
    parts = bus_id.lower().removeprefix("pci:").split(":")
    if len(parts) < 2:
        return None
    try:
        dom = int(parts[-3], 16) if len(parts) >= 3 else 0
        return f"{dom:x}:{int(parts[-2], 16):02x}:{int(parts[-1].split('.')[0], 16):02x}"
    except ValueError:
        return None


def facts(store: GpuStore, ex: Exit, since: int) -> GpuFacts:
    p = store.by_pid.get(ex.pid) or _PidGpu()
    failures = tuple(e for e in p.failures if since <= e.ts <= ex.ts)
    recovered = tuple(e for e in p.recovered if since <= e.ts <= ex.ts)
    calls = tuple(e for e in p.calls if since <= e.ts <= ex.ts)
    indices = {s.index for s in p.samples}
    lo, hi = ex.ts - RESET_WINDOW_NS, ex.ts + AFTER_EXIT_NS
    # every GPU this recording knows of (NVML's devices, the process's own): a report that
    # names no device can only be about this process's GPU when there is one GPU in sight
    known = set(store.devices) | indices

    def on_its_device(e: GpuXid | GpuLost) -> bool:
        if isinstance(e, GpuXid) and e.pid == ex.pid:
            return True  # the driver named this process
        index = e.device_index
        if index is None:  # the kernel log names a PCI bus: NVML's bus ids map it
            key = pci_key(e.device)
            index = store.bus_index.get(key) if key is not None else None
            if (
                index is None
                and key is not None
                and known
                and known <= set(store.bus_index.values())
            ):
                return False  # a bus that is none of the GPUs in sight: another device's
        if index is None:
            return len(known) <= 1
        if indices:
            return index in indices
        return len(known) <= 1  # it used a GPU, which one is unknown

    down: list[GpuXid | GpuLost] = [
        x for x in store.xids if lo <= x.ts <= hi and x.xid in DEVICE_LOST_XIDS and on_its_device(x)
    ]
    down += [g for g in store.lost if lo <= g.ts <= hi and on_its_device(g)]
    faults = tuple(
        x for x in store.xids if x.pid == ex.pid and x.xid in APP_FAULT_XIDS and since <= x.ts <= hi
    )
    device = own = None
    if failures:
        at = failures[-1].ts
        own = next((s for s in reversed(p.samples) if s.ts <= at), None)
        index = own.index if own is not None else None
        if index is None and len(store.devices) == 1:
            index = next(iter(store.devices))
        if index is not None:
            device = next((s for s in reversed(store.devices.get(index, ())) if s.ts <= at), None)
    return GpuFacts(
        user=p.user_since is not None or bool(failures or recovered or calls),
        failures=failures,
        recovered=recovered,
        calls=calls,
        device_down=tuple(sorted(down, key=lambda e: e.ts)),
        app_faults=faults,
        device=device,
        own=own,
    )


def _ending(ex: Exit, crash: str | None) -> str:
    ws = ex.wait
    if ws.signal is None:
        return f"exited with code {ws.code}"
    return crash or "was killed"


def _failures(n: int) -> str:
    return f"{n} failure{'s' if n != 1 else ''}"


def _describe_failure(e: GpuAllocFailure) -> str:
    return (
        f"[uprobe] {e.function} of {fmt_bytes(e.requested_bytes)} returned "
        f"CUDA_ERROR_OUT_OF_MEMORY with {fmt_bytes(e.held_bytes)} held"
    )


def _down_text(e: GpuXid | GpuLost) -> str:
    if isinstance(e, GpuXid):
        dev = f" on {e.device}" if e.device else ""
        return f"Xid {e.xid}{dev}: {xid_meaning(e.xid)}"
    dev = f" {e.device}" if e.device else ""
    what = {
        "gpu_is_lost": "GPU is lost",
        "reset_required": "GPU requires a reset",
        "fallen_off_bus": "GPU has fallen off the bus",
    }.get(e.reason, e.reason)
    return f"GPU{dev}: {what}"


def _describe_down(e: GpuXid | GpuLost) -> str:
    return f"[{e.source}] {_down_text(e)}"


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
        (r.ts, f"[uprobe] {r.function} succeeded again after {_failures(r.failures)}")
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
        (r.ts, f"[uprobe] {r.function} succeeded again after {_failures(r.failures)}")
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


def describe_event(ev: Event) -> str | None:
    """One timeline line for a GPU event, in tracer.outputs.text's "kind    text" shape; None for
    samples (shown as numbers, not lines) and for events that are not GPU events."""
    if isinstance(ev, GpuAllocFailure):
        return (
            f"gpu     pid {ev.pid} ({ev.comm}) {ev.function} of {fmt_bytes(ev.requested_bytes)}: "
            f"CUDA_ERROR_OUT_OF_MEMORY with {fmt_bytes(ev.held_bytes)} held "
            f"(failure {ev.failures} in a row) [uprobe]"
        )
    if isinstance(ev, GpuOomRecovered):
        return (
            f"gpu     pid {ev.pid} ({ev.comm}) recovered GPU OOM: {ev.function} of "
            f"{fmt_bytes(ev.requested_bytes)} succeeded after {_failures(ev.failures)} [uprobe]"
        )
    if isinstance(ev, GpuCallFailure):
        size = f" of {fmt_bytes(ev.requested_bytes)}" if ev.requested_bytes else ""
        return (
            f"gpu     pid {ev.pid} ({ev.comm}) {ev.function}{size}: "
            f"{cuda.name(ev.result)} ({ev.result}) [uprobe]"
        )
    if isinstance(ev, GpuLibrary):
        if ev.error and not ev.probed:
            return f"gpu     pid {ev.pid} maps {ev.path}: not probed ({ev.error})"
        probed = {name.split("=")[0] for name in ev.probed.split(",")}
        n = len(probed & set(cuda.ALLOC_FUNCTIONS))
        return (
            f"gpu     pid {ev.pid} maps {ev.path}: {n}/{len(cuda.ALLOC_FUNCTIONS)} allocation "
            "entry points probed"
        )
    if isinstance(ev, GpuXid):
        who = f" (pid {ev.pid}{', ' + ev.proc_name if ev.proc_name else ''})" if ev.pid else ""
        return f"xid     {_down_text(ev)}{who} [{ev.source}]"
    if isinstance(ev, GpuLost):
        return f"gpu     {_down_text(ev)} [{ev.source}]"
    return None
