"""The event vocabulary: every fact whyrestart records, as frozen dataclasses.

Kernel events (decoded from the BPF ring buffer), samplers and parsers all produce these, the
trace file stores them, and the analysis consumes them. Each class has a short ``KIND`` string
that tags it in the trace (``{"t": KIND, ...}``). Timestamps (``ts``) are nanoseconds on
CLOCK_BOOTTIME, the clock ``bpf_ktime_get_boot_ns`` uses; wall-clock time appears only at display
time, from the offset in the trace header.

Raw kernel values are kept raw (``Exit.status`` is the kernel's wait status) and decoded by
one tested function each (``decode_wait_status``), never half in C and half in Python.
"""

from __future__ import annotations

import dataclasses
import functools
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

# ---------------------------------------------------------------------------------------------
# Raw kernel value decoders


@dataclass(frozen=True, slots=True)
class WaitStatus:
    """A decoded ``task->exit_code``: either an exit code or a terminating signal."""

    code: int | None  # exit(code), when the process exited on its own
    signal: int | None  # the terminating signal, when killed
    core_dumped: bool


@functools.lru_cache(maxsize=4096)  # a handful of distinct statuses, a million exits
def decode_wait_status(status: int) -> WaitStatus:
    """Decode the kernel's wait status (``task->exit_code``, the value ``wait(2)`` reports).

    Low 7 bits: terminating signal (0 for a normal exit); bit 7: core dumped; bits 8-15: the exit
    code. This is what ``WIFEXITED``/``WTERMSIG``/``WCOREDUMP`` compute.
    """
    sig = status & 0x7F
    if sig == 0:
        return WaitStatus(code=(status >> 8) & 0xFF, signal=None, core_dumped=False)
    return WaitStatus(code=None, signal=sig, core_dumped=bool(status & 0x80))


def signal_name(sig: int) -> str:
    """``9`` → ``"SIGKILL"``; an unknown number stays readable (``"SIG77"``)."""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


# si_code of a signal the kernel sent itself (SEND_SIG_PRIV), e.g. the OOM killer's SIGKILL.
SI_KERNEL = 0x80
SI_USER = 0  # kill(2)
SI_TKILL = -6  # tkill(2)/tgkill(2)
SI_QUEUE = -1  # sigqueue(3)

# signal_generate's result field (enum trace_signal_deliver/TRACE_SIGNAL_*, kernel/signal.c).
SIGNAL_RESULTS = ("delivered", "ignored", "already_pending", "overflow_fail", "lose_info")


def signal_result_name(result: int) -> str:
    return SIGNAL_RESULTS[result] if 0 <= result < len(SIGNAL_RESULTS) else f"result{result}"


# ---------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event: a timestamp on CLOCK_BOOTTIME (ns)."""

    KIND: ClassVar[str] = ""
    ts: int

    def to_record(self) -> dict[str, Any]:
        """The trace-file form: ``{"t": KIND, field: value, ...}`` (JSON-safe values only)."""
        rec: dict[str, Any] = {"t": self.KIND}
        for name in _field_names(type(self)):
            rec[name] = getattr(self, name)
        return rec


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type[Event]) -> tuple[str, ...]:
    # (dataclasses.fields builds its answer on every call: a third of writing a record)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


@dataclass(frozen=True, slots=True)
class Exit(Event):
    """A process (thread group) ended: its last thread passed ``sched_process_exit``."""

    KIND: ClassVar[str] = "exit"
    pid: int  # the tgid, i.e. the process id users see
    ppid: int
    comm: str
    cgroup_id: int
    status: int  # raw wait status (task->exit_code)
    start_ns: int  # task start time, CLOCK_BOOTTIME ns (tells a reused pid apart)
    rung: str = ""

    @property
    def wait(self) -> WaitStatus:
        return decode_wait_status(self.status)


@dataclass(frozen=True, slots=True)
class Signal(Event):
    """A fatal signal was generated (``signal/signal_generate``): sender is the current task."""

    KIND: ClassVar[str] = "signal"
    sender_pid: int  # sender's tgid
    sender_tid: int
    sender_comm: str
    sender_cgroup_id: int
    target_pid: int  # the task the signal was sent to (thread id; the leader's for kill(2))
    target_comm: str
    sig: int
    si_code: int
    result: int  # TRACE_SIGNAL_* (0 = delivered)
    group: bool  # sent to the whole thread group


@dataclass(frozen=True, slots=True)
class OomKill(Event):
    """The kernel OOM killer chose a victim (one event per victim, ``memory.oom.group`` too)."""

    KIND: ClassVar[str] = "oom"
    victim_pid: int  # victim's tgid
    victim_comm: str
    victim_cgroup_id: int
    trigger_pid: int  # the task whose allocation failed (the current task)
    trigger_comm: str
    memcg: bool  # constrained by a memory cgroup limit (vs. the whole host)
    limit_cgroup_id: int  # the memory cgroup at its limit (0 when none / global OOM)
    limit_bytes: int  # that cgroup's limit (0 when unknown)
    usage_bytes: int  # its usage at the kill
    rung: str  # which hook saw it: kprobe, fentry, tp_btf, tracepoint, kmsg


@dataclass(frozen=True, slots=True)
class Fork(Event):
    """A watched process forked a new process (threads are not reported)."""

    KIND: ClassVar[str] = "fork"
    parent_pid: int
    child_pid: int
    comm: str
    cgroup_id: int


@dataclass(frozen=True, slots=True)
class Exec(Event):
    """A watched process called execve successfully."""

    KIND: ClassVar[str] = "exec"
    pid: int
    comm: str
    filename: str
    cgroup_id: int


@dataclass(frozen=True, slots=True)
class KmsgOom(Event):
    """An OOM report read from the kernel log (``/dev/kmsg``): independent evidence.

    Assembled from the ``oom-kill:constraint=...`` line and the ``Killed process ...`` line of
    one report. Fields the kernel did not print are ``None`` / ``""``.
    """

    KIND: ClassVar[str] = "kmsg_oom"
    victim_pid: int
    victim_comm: str
    constraint: str  # e.g. CONSTRAINT_MEMCG, CONSTRAINT_NONE
    oom_memcg: str  # cgroup path the OOM was constrained to ("" for global)
    task_memcg: str  # the victim's cgroup path
    total_vm_kb: int | None
    anon_rss_kb: int | None
    file_rss_kb: int | None
    shmem_rss_kb: int | None
    oom_score_adj: int | None
    memcg: bool  # constraint == CONSTRAINT_MEMCG, or the "Memory cgroup out of memory" prefix


@dataclass(frozen=True, slots=True)
class CgroupInfo(Event):
    """What a cgroup id stands for, captured while the cgroup still existed.

    Written once per id the first time it is seen, so a trace names cgroups that are long gone
    when it is replayed.
    """

    KIND: ClassVar[str] = "cgroup"
    cgroup_id: int
    path: str  # relative to the hierarchy root, starting with "/"
    hierarchy: str  # "memory" (cgroup v1 memory controller) or "unified" (cgroup v2)
    limit_bytes: int | None  # memory limit set on this cgroup itself (None = unlimited/unknown)


@dataclass(frozen=True, slots=True)
class Lost(Event):
    """Events the kernel could not hand over (ring-buffer reservations that failed)."""

    KIND: ClassVar[str] = "lost"
    count: int  # newly lost since the previous Lost event


# ---------------------------------------------------------------------------------------------
# Memory pressure: reclaim and throttling (BPF), and samples (cgroupfs, /proc)


@dataclass(frozen=True, slots=True)
class ReclaimStall(Event):
    """One long stall of a watched task: memcg reclaim, host direct reclaim, or memory.high
    throttling (``kind``: "memcg", "direct", "high"). Shorter ones only count in summaries."""

    KIND: ClassVar[str] = "stall"
    pid: int  # tgid of the stalled task
    comm: str
    cgroup_id: int  # the memory cgroup being reclaimed/throttled (at or over its limit)
    task_cgroup_id: int  # the stalled task's own memory cgroup
    kind: str
    duration_ns: int
    reclaimed_bytes: int  # 0 for throttling
    rung: str


@dataclass(frozen=True, slots=True)
class ReclaimSummary(Event):
    """Reclaim/throttling aggregated in the kernel per cgroup over one interval.

    ``kind`` "kswapd" counts kswapd wake-ups on the host (``cgroup_id`` 0, durations 0).
    """

    KIND: ClassVar[str] = "reclaim"
    cgroup_id: int
    kind: str
    count: int
    total_ns: int
    max_ns: int
    reclaimed_bytes: int
    interval_ns: int


@dataclass(frozen=True, slots=True)
class CgroupSample(Event):
    """One reading of a memory cgroup's files. ``None``: the file or field is absent here
    (a v1 host has no memory.high; old kernels lack some memory.stat keys)."""

    KIND: ClassVar[str] = "cg_sample"
    cgroup_id: int
    path: str
    usage_bytes: int | None  # v2 memory.current / v1 memory.usage_in_bytes
    limit_bytes: int | None  # v2 memory.max / v1 memory.limit_in_bytes (None = unlimited)
    high_bytes: int | None  # v2 memory.high
    peak_bytes: int | None  # v2 memory.peak / v1 memory.max_usage_in_bytes
    failcnt: int | None  # v1 memory.failcnt
    events: dict[str, int]  # v2 memory.events; v1: oom_kill and under_oom from oom_control
    stat: dict[str, int]  # selected memory.stat keys, bytes: anon, file, shmem, file_mapped...
    psi_some_avg10: float | None  # memory.pressure (v2)
    psi_full_avg10: float | None
    psi_some_total_us: int | None
    psi_full_total_us: int | None


@dataclass(frozen=True, slots=True)
class EffectiveLimit(Event):
    """The smallest memory limit over a watched cgroup and its ancestors, and who sets it.

    Written at start and whenever it changes."""

    KIND: ClassVar[str] = "eff_limit"
    cgroup_id: int
    path: str
    limit_bytes: int | None  # None: no limit anywhere up to the root
    set_by: str | None  # the path of the cgroup whose limit it is


@dataclass(frozen=True, slots=True)
class HostSample(Event):
    """/proc/meminfo and /proc/pressure/memory: what "the host says memory is free" means."""

    KIND: ClassVar[str] = "host_sample"
    mem_total: int
    mem_available: int | None
    mem_free: int
    cached: int | None
    swap_free: int | None
    psi_some_avg10: float | None
    psi_full_avg10: float | None
    psi_some_total_us: int | None
    psi_full_total_us: int | None


@dataclass(frozen=True, slots=True)
class ProcessSample(Event):
    """A watched process's resident memory split (from /proc/PID/status), bytes."""

    KIND: ClassVar[str] = "proc_sample"
    pid: int
    rss_anon: int | None
    rss_file: int | None  # file-backed resident pages, i.e. mapped files
    rss_shmem: int | None
    vm_swap: int | None


@dataclass(frozen=True, slots=True)
class SampleError(Event):
    """A sampler could not read something (said once per source, target and problem)."""

    KIND: ClassVar[str] = "sample_error"
    source: str  # "cgroup", "host", "process", "psi"...
    target: str  # a cgroup path, a pid, a file
    message: str


# ---------------------------------------------------------------------------------------------
# GPU: allocation failures caught at libcuda (uprobes), NVML samples, Xid and lost-GPU reports

# CUresult values (cuda.h)
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2


@dataclass(frozen=True, slots=True)
class GpuAllocFailure(Event):
    """A device allocation returned CUDA_ERROR_OUT_OF_MEMORY inside a watched process (a uretprobe
    on the libcuda.so.1 it maps). NVML never sees these: the process was refused the memory."""

    KIND: ClassVar[str] = "gpu_alloc_fail"
    pid: int  # tgid
    tid: int
    comm: str
    cgroup_id: int
    function: str  # the driver entry point, e.g. cuMemAlloc_v2
    requested_bytes: int
    result: int  # the CUresult returned (2)
    held_bytes: int  # device memory the process held through probed allocations before the call
    peak_bytes: int  # high-water mark of held_bytes
    failures: int  # failed allocations since the process's last success, this one included


@dataclass(frozen=True, slots=True)
class GpuOomRecovered(Event):
    """The first successful device allocation after failures: a *recovered* GPU OOM (PyTorch and
    XLA free their caches and retry). An event, never a verdict on its own."""

    KIND: ClassVar[str] = "gpu_oom_recovered"
    pid: int
    tid: int
    comm: str
    cgroup_id: int
    function: str
    requested_bytes: int
    held_bytes: int  # before this allocation
    peak_bytes: int
    failures: int  # failed allocations since the previous success


@dataclass(frozen=True, slots=True)
class GpuLibrary(Event):
    """A watched process maps a CUDA driver library: it is a GPU user. Says which allocation
    entry points were probed, so a trace shows what could and could not be caught."""

    KIND: ClassVar[str] = "gpu_lib"
    pid: int
    path: str  # as the process maps it (inside its mount namespace)
    probed: str  # comma-separated entry points with uprobes attached
    missing: str  # comma-separated entry points this library does not export
    error: str  # why probing failed ("" when it did not)


@dataclass(frozen=True, slots=True)
class GpuSample(Event):
    """One NVML reading of a device's memory (``nvmlDeviceGetMemoryInfo``, v2 where the driver
    has it: ``reserved_bytes`` is None on v1)."""

    KIND: ClassVar[str] = "gpu_sample"
    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuProcessSample(Event):
    """Device memory NVML attributes to one watched process on one device."""

    KIND: ClassVar[str] = "gpu_proc_sample"
    index: int  # device index
    pid: int
    used_bytes: int | None  # None: NVML says "not available"
    kind: str  # "compute" or "graphics"


@dataclass(frozen=True, slots=True)
class GpuXid(Event):
    """An Xid error: from NVML's event set (no pid) or from the driver's kernel-log line
    ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``"""

    KIND: ClassVar[str] = "gpu_xid"
    xid: int
    device: str  # PCI bus id (kernel log) or UUID (NVML); "" when unknown
    device_index: int | None  # NVML index, when known
    pid: int | None  # the process the driver names, when it names one
    proc_name: str
    message: str  # the rest of the driver's text
    source: str  # "nvml" or "kmsg"


@dataclass(frozen=True, slots=True)
class GpuLost(Event):
    """A GPU stopped answering: NVML reports it lost or needing a reset, or the driver logged
    that it fell off the bus."""

    KIND: ClassVar[str] = "gpu_lost"
    device: str
    device_index: int | None
    reason: str  # "gpu_is_lost", "reset_required", "fallen_off_bus"
    source: str  # "nvml" or "kmsg"


@dataclass(frozen=True, slots=True)
class CgroupMkdir(Event):
    """A cgroup was created in the tracked hierarchy while containers were being followed."""

    KIND: ClassVar[str] = "cg_mkdir"
    cgroup_id: int
    path: str
    level: int


# ---------------------------------------------------------------------------------------------
# Containers, supervisors and health probes


@dataclass(frozen=True, slots=True)
class UnitInfo(Event):
    """What a cgroup is to its users: a container (with its runtime's name for it), a pod's
    container, a systemd unit. Written once per cgroup id, when first named."""

    KIND: ClassVar[str] = "unit"
    cgroup_id: int
    kind: str  # podman, docker, containerd, crio, k8s, systemd
    unit_id: str  # container id / unit name
    name: str  # the runtime's name for it ("" when no runtime answered)
    pod: str  # "namespace/name" for Kubernetes, else ""
    main_pid: int = 0  # its main process, when a runtime said so (a container already running)


@dataclass(frozen=True, slots=True)
class RuntimeSample(Event):
    """What a supervisor says about a unit: its restart count and its own exit claims."""

    KIND: ClassVar[str] = "runtime"
    unit: str  # the unit label, as UnitInfo names it
    source: str  # podman, docker, systemd, kubernetes
    restart_count: int | None
    state: str
    exit_code: int | None
    oom_killed: bool | None  # the runtime's claim (podman 4.3 says False for real cgroup OOMs)


@dataclass(frozen=True, slots=True)
class ProbeSample(Event):
    """One health probe: ours (--probe) or a runtime's exec health check seen in the kernel."""

    KIND: ClassVar[str] = "probe"
    target: str  # the probe spec, or "healthcheck" for a runtime's exec check
    unit: str  # the unit it checks ("" when not known)
    latency_ns: int
    ok: bool
    timed_out: bool
    status: int | None  # HTTP status or exit code
    error: str
    pid: int = 0  # the check's process, for a runtime's exec health check


KINDS: dict[str, type[Event]] = {
    cls.KIND: cls
    for cls in (
        Exit,
        Signal,
        OomKill,
        Fork,
        Exec,
        KmsgOom,
        CgroupInfo,
        Lost,
        ReclaimStall,
        ReclaimSummary,
        CgroupSample,
        EffectiveLimit,
        HostSample,
        ProcessSample,
        SampleError,
        CgroupMkdir,
        UnitInfo,
        RuntimeSample,
        ProbeSample,
        GpuAllocFailure,
        GpuOomRecovered,
        GpuLibrary,
        GpuSample,
        GpuProcessSample,
        GpuXid,
        GpuLost,
    )
}


def positional_builder(cls: type[Event]) -> Callable[..., Event]:
    """A fast constructor taking every field positionally, in declaration order.

    Hot paths (decoding ring-buffer records, a few hundred thousand a second) build events this
    way: a frozen dataclass's __init__ sets each field through object.__setattr__, which costs
    more than decoding the record. This stores through the slot descriptors instead, in
    straight-line generated code (a loop over the setters costs a third more); the values must
    already have the right types (the decoders' do).
    """
    names = [f.name for f in dataclasses.fields(cls)]
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    src = [f"def build({', '.join(f'v{i}' for i in range(len(names)))}):", "    o = _new(_cls)"]
    for i, name in enumerate(names):
        ns[f"s{i}"] = getattr(cls, name).__set__
        src.append(f"    s{i}(o, v{i})")
    src.append("    return o")
    exec(compile("\n".join(src), f"<positional builder for {cls.__name__}>", "exec"), ns)
    build: Callable[..., Event] = ns["build"]
    return build


class RecordError(ValueError):
    """A trace record that does not describe a known event."""


def from_record(rec: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_record``. Unknown fields are ignored, missing ones are an error."""
    kind = rec.get("t")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"unknown event kind {kind!r}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in rec:
            kwargs[f.name] = rec[f.name]
        elif f.default is dataclasses.MISSING:
            raise RecordError(f"{kind} record lacks field {f.name!r}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - guarded by the loop above
        raise RecordError(f"{kind} record: {exc}") from exc
