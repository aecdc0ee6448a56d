"""GPU evidence for the analysis: ``GpuStore`` keeps the GPU events (bounded, per pid and per
device) for ``tracer.analysis.evidence.Evidence``, and ``facts`` gathers what concerns one exit
for the GPU rules (tracer/analysis/rules/gpu.py). Pure."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

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
from tracer.parse.xid import APP_FAULT_XIDS, DEVICE_LOST_XIDS

SECOND = 1_000_000_000
RESET_WINDOW_NS = 10 * SECOND  # a lost device before the exit: its processes fail within this
AFTER_EXIT_NS = 1 * SECOND  # the driver's report may be stamped a little after the exit

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
