"""NVML through nvidia-ml-py (``import pynvml``): device memory, per-process device memory, Xid
events and lost GPUs, behind the small ``GpuSampler`` interface the recorder uses.

``open_nvml`` returns an ``NvmlSampler`` when NVML works and sees a device, else an
``NvmlAbsent`` that says why (no driver library, driver not loaded, no GPU): a machine without
a GPU is a normal case to record in the trace header, not an error.

``NvmlSampler.sample`` and ``wait_events`` are synchronous (tests call them directly);
``start`` runs both on one background thread, because NVML calls can block for milliseconds
(the process queries) or for the whole timeout (the event wait), and the recorder's loop must
not. The thread only appends events to a list that ``drain`` takes.

Every reading is stamped on CLOCK_BOOTTIME, the trace's one clock. A device that answers
``NVML_ERROR_GPU_IS_LOST`` or ``NVML_ERROR_RESET_REQUIRED`` gives one ``GpuLost`` event; other
failures give one ``SampleError`` per device and message.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tracer.clock import boottime_ns
from tracer.events import Event, GpuLost, GpuProcessSample, GpuSample, GpuXid, SampleError

__all__ = ["GpuSampler", "NvmlAbsent", "NvmlSampler", "open_nvml"]

DEFAULT_INTERVAL_S = 1.0
# The event wait is cut into slices this long so that close() never waits longer.
WAIT_SLICE_MS = 200

Clock = Callable[[], int]


class GpuSampler(Protocol):
    """What the recorder needs from a GPU sampler."""

    @property
    def available(self) -> bool: ...

    def describe(self) -> dict[str, Any]: ...

    def set_pids(self, pids: frozenset[int] | None) -> None: ...

    def start(self) -> None: ...

    def drain(self) -> list[Event]: ...

    def close(self) -> None: ...


@dataclass
class NvmlAbsent:
    """No NVML here; ``reason`` says why, for the trace header."""

    reason: str

    @property
    def available(self) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        return {"nvml": "absent", "reason": self.reason}

    def set_pids(self, pids: frozenset[int] | None) -> None:
        pass

    def start(self) -> None:
        pass

    def drain(self) -> list[Event]:
        return []

    def close(self) -> None:
        pass


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    memory_v2: bool = True  # until the driver refuses the v2 struct
    bus_id: str = ""  # its PCI bus id: the kernel log's Xid lines name the GPU by it


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _absent_reason(nvml: Any, exc: BaseException) -> str:
    code = _code(exc)
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "libnvidia-ml.so.1 not found: no NVIDIA driver installed"
    if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA kernel driver is not loaded"
    if code == nvml.NVML_ERROR_NO_PERMISSION:
        return "no permission to use NVML"
    return f"NVML failed to initialize: {exc}"


def open_nvml(
    interval_s: float = DEFAULT_INTERVAL_S,
    library: str | None = None,
    clock: Clock = boottime_ns,
) -> NvmlSampler | NvmlAbsent:
    """NVML initialised with its devices listed, or why not. ``library``: load NVML from this
    file instead of the name ``libnvidia-ml.so.1`` (a driver outside the loader's path)."""
    try:
        import pynvml
    except ImportError:
        return NvmlAbsent("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    if library is not None:
        # pynvml loads its library only while its module global is unset; filling it first is
        # the seam its own loader leaves.
        with pynvml.libLoadLock:
            if pynvml.nvmlLib is None:
                try:
                    pynvml.nvmlLib = ctypes.CDLL(library)
                except OSError as exc:
                    return NvmlAbsent(f"cannot load NVML from {library}: {exc}")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlAbsent(_absent_reason(pynvml, exc))
    try:
        count = pynvml.nvmlDeviceGetCount()
        devices = []
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            devices.append(
                _Device(
                    i,
                    handle,
                    _text(pynvml.nvmlDeviceGetUUID, handle),
                    _text(pynvml.nvmlDeviceGetName, handle),
                    bus_id=_text(lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId, handle),
                )
            )
    except pynvml.NVMLError as exc:
        pynvml.nvmlShutdown()
        return NvmlAbsent(f"NVML cannot list devices: {exc}")
    if not devices:
        pynvml.nvmlShutdown()
        return NvmlAbsent("no GPU: NVML sees 0 devices")
    return NvmlSampler(pynvml, devices, interval_s, clock)


def _text(fn: Callable[[Any], Any], handle: Any) -> str:
    try:
        value = fn(handle)
    except Exception:  # a name is decoration: never a reason to give up on a device
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Samples every ``interval_s``; Xid events as they come (see the module docstring)."""

    def __init__(self, nvml: Any, devices: list[_Device], interval_s: float, clock: Clock) -> None:
        self.nvml = nvml
        self.devices = devices
        self.interval_ns = int(interval_s * 1e9)
        self.clock = clock
        self._pids: frozenset[int] | None = frozenset()
        self._lost: set[tuple[int | None, str]] = set()
        self._errors: set[tuple[str, str]] = set()
        self._out: list[Event] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.xid_events = "nvml"
        self._event_set: Any = None
        try:
            self._event_set = nvml.nvmlEventSetCreate()
            registered = 0
            for d in devices:
                try:
                    nvml.nvmlDeviceRegisterEvents(
                        d.handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                    )
                    registered += 1
                except nvml.NVMLError as exc:
                    self.xid_events = f"not on gpu{d.index}: {exc}"
            if not registered:
                nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
        except nvml.NVMLError as exc:
            self.xid_events = f"unavailable: {exc}"
            self._event_set = None
        self._by_handle = {_address(d.handle): d for d in devices}

    @property
    def available(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        return {
            "nvml": "present",
            "devices": [{"index": d.index, "uuid": d.uuid, "name": d.name} for d in self.devices],
            "interval_ms": self.interval_ns // 1_000_000,
            "xid_events": self.xid_events,
        }

    def set_pids(self, pids: frozenset[int] | None) -> None:
        """The processes whose device memory is recorded; None: every process."""
        self._pids = pids  # one reference swap: the thread reads whichever set is current

    # -- synchronous steps ------------------------------------------------------------------

    def sample(self) -> list[Event]:
        """One reading of every device and of the watched processes on it."""
        out: list[Event] = []
        for d in self.devices:
            now = self.clock()
            try:
                mem = self._memory(d)
            except self.nvml.NVMLError as exc:
                out += self._failed(d, "memory info", exc, now)
                continue
            out.append(
                GpuSample(
                    ts=now,
                    index=d.index,
                    uuid=d.uuid,
                    name=d.name,
                    total_bytes=int(mem.total),
                    used_bytes=int(mem.used),
                    free_bytes=int(mem.free),
                    reserved_bytes=int(mem.reserved) if d.memory_v2 else None,
                    pci_bus_id=d.bus_id,
                )
            )
            out += self._processes(d, now)
        return out

    def wait_events(self, timeout_ms: int) -> list[Event]:
        """Xid events NVML delivers within ``timeout_ms`` (the first one ends the wait)."""
        if self._event_set is None:
            self._stop.wait(timeout_ms / 1000)
            return []
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except nvml.NVMLError as exc:
            if _code(exc) == nvml.NVML_ERROR_TIMEOUT:
                return []
            now = self.clock()
            # a wait that fails at once would spin: pace it like a timeout
            self._stop.wait(timeout_ms / 1000)
            if _code(exc) in (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED):
                return self._lost_event(None, exc, now)
            return self._error("events", f"waiting for events: {exc}", now)
        now = self.clock()
        if not int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
            return []
        dev = self._by_handle.get(_address(data.device))
        return [
            GpuXid(
                ts=now,
                xid=int(data.eventData),
                device=dev.uuid if dev else "",
                device_index=dev.index if dev else None,
                pid=None,
                proc_name="",
                message="",
                source="nvml",
            )
        ]

    # -- background thread ------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="whyrestart-nvml", daemon=True)
            self._thread.start()

    def drain(self) -> list[Event]:
        with self._lock:
            out, self._out = self._out, []
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        nvml = self.nvml
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a sampler that dies must say so in the trace
            self._push(
                [
                    SampleError(
                        ts=self.clock(),
                        source="nvml",
                        target="sampler",
                        message=f"stopped: {exc!r}",
                    )
                ]
            )

    def _loop(self) -> None:
        next_at = self.clock()
        while not self._stop.is_set():
            if self.clock() >= next_at:
                self._push(self.sample())
                next_at += self.interval_ns
                # after a long stall, sample on the next slice rather than in a burst
                next_at = max(next_at, self.clock())
            left_ms = (next_at - self.clock()) // 1_000_000
            self._push(self.wait_events(int(max(1, min(WAIT_SLICE_MS, left_ms)))))

    def _push(self, events: list[Event]) -> None:
        if events:
            with self._lock:
                self._out.extend(events)

    # -- helpers ----------------------------------------------------------------------------

    def _memory(self, d: _Device) -> Any:
        nvml = self.nvml
        if d.memory_v2:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(d.handle, version=nvml.nvmlMemory_v2)
            except nvml.NVMLError as exc:
                if _code(exc) not in (
                    nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                    nvml.NVML_ERROR_NOT_SUPPORTED,
                    nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    raise
                d.memory_v2 = False  # an older driver: v1 has no "reserved"
        return nvml.nvmlDeviceGetMemoryInfo(d.handle)

    def _processes(self, d: _Device, now: int) -> list[Event]:
        pids = self._pids
        if pids is not None and not pids:
            return []
        nvml = self.nvml
        out: list[Event] = []
        for kind in ("compute", "graphics"):
            try:
                procs = self._query_processes(kind, d)
            except nvml.NVMLError as exc:
                out += self._failed(d, f"{kind} processes", exc, now)
                continue
            for p in procs:
                if pids is not None and p.pid not in pids:
                    continue
                used = p.usedGpuMemory
                out.append(
                    GpuProcessSample(
                        ts=now,
                        index=d.index,
                        pid=int(p.pid),
                        used_bytes=int(used) if used is not None else None,
                        kind=kind,
                    )
                )
        return out

    def _query_processes(self, kind: str, d: _Device) -> list[Any]:
        """The device's processes of one kind, through the newest query this driver has (v3
        since R510; pynvml does the two-call size protocol)."""
        nvml = self.nvml
        name = "Compute" if kind == "compute" else "Graphics"
        last: BaseException | None = None
        for version in ("_v3", "_v2"):
            fn = getattr(nvml, f"nvmlDeviceGet{name}RunningProcesses{version}", None)
            if fn is None:
                continue
            try:
                return list(fn(d.handle))
            except nvml.NVMLError as exc:
                if _code(exc) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                last = exc
        if last is not None:
            raise last
        return []

    def _failed(self, d: _Device, what: str, exc: BaseException, now: int) -> list[Event]:
        nvml = self.nvml
        if _code(exc) in (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED):
            return self._lost_event(d, exc, now)
        return self._error(f"gpu{d.index}", f"{what}: {exc}", now)

    def _lost_event(self, d: _Device | None, exc: BaseException, now: int) -> list[Event]:
        reason = (
            "gpu_is_lost" if _code(exc) == self.nvml.NVML_ERROR_GPU_IS_LOST else "reset_required"
        )
        key = (d.index if d else None, reason)
        if key in self._lost:
            return []
        self._lost.add(key)
        return [
            GpuLost(
                ts=now,
                device=d.uuid if d else "",
                device_index=d.index if d else None,
                reason=reason,
                source="nvml",
            )
        ]

    def _error(self, target: str, message: str, now: int) -> list[Event]:
        if (target, message) in self._errors:
            return []
        self._errors.add((target, message))
        return [SampleError(ts=now, source="nvml", target=target, message=message)]


def _address(handle: Any) -> int | None:
    """A device handle's pointer value: NVML hands the same pointer back in event data."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None
