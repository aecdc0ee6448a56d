"""The event vocabulary: every fact whyrestart records, as frozen msgspec Structs.

Kernel events (decoded from the BPF ring buffer), samplers and parsers all produce these, the
trace file stores them, and the analysis consumes them. Each class has a short ``KIND`` string
that tags it in the trace (``{"t": KIND, ...}``). Timestamps (``ts``) are nanoseconds on
CLOCK_BOOTTIME, the clock ``bpf_ktime_get_boot_ns`` uses; wall-clock time appears only at display
time, from the offset in the trace header.

Raw kernel values are kept raw (``Exit.status`` is the kernel's wait status) and decoded by
one tested function each (``decode_wait_status``), never half in C and half in Python.
"""

from __future__ import annotations

import functools
import signal as _signal
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, cast

import msgspec

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


@functools.lru_cache(maxsize=128)  # (an Enum lookup per call; a verdict asks several times)
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
BUS_ADRERR = 2  # SIGBUS: no backing for the address (a tmpfs page that could not be allocated)

# signal_generate's result field (enum trace_signal_deliver/TRACE_SIGNAL_*, kernel/signal.c).
SIGNAL_RESULTS = ("delivered", "ignored", "already_pending", "overflow_fail", "lose_info")


def signal_result_name(result: int) -> str:
    return SIGNAL_RESULTS[result] if 0 <= result < len(SIGNAL_RESULTS) else f"result{result}"


# ---------------------------------------------------------------------------------------------
# Events


class Event(msgspec.Struct, frozen=True, gc=False, tag_field="t"):
    """Base of every event: a timestamp on CLOCK_BOOTTIME (ns).

    Events are frozen msgspec Structs rather than dataclasses: the trace reader decodes a block
    of JSON lines straight into them in C (`msgspec.json.Decoder.decode_lines`, ~4x what
    orjson plus building a slots dataclass managed), their positional constructor is C too, and
    ``gc=False`` keeps a million of them out of the cyclic collector's way (an event holds only
    numbers, strings and dicts of those: never a cycle). Each subclass names its ``KIND`` as its
    tag (``class Exit(Event, tag="exit")``), which is also ``{"t": KIND}`` in the trace.
    """

    KIND: ClassVar[str] = ""
    ts: int

    def to_record(self) -> dict[str, Any]:
        """The trace-file form: ``{"t": KIND, field: value, ...}`` (JSON-safe values only)."""
        rec: dict[str, Any] = {"t": self.KIND}
        for name in self.__struct_fields__:
            rec[name] = getattr(self, name)
        return rec


class Exit(Event, frozen=True, tag="exit"):
    """A process (thread group) ended: its last thread passed ``sched_process_exit``."""

    pid: int  # the tgid, i.e. the process id users see
    ppid: int
    comm: str
    cgroup_id: int
    # raw wait status (task->exit_code): 16 bits, never negative (a trace claiming -9 is damaged,
    # not a "SIG119 (core dumped)")
    status: Annotated[int, msgspec.Meta(ge=0, le=0xFFFF)]
    start_ns: int  # task start time, CLOCK_BOOTTIME ns (tells a reused pid apart)
    rung: str = ""

    @property
    def wait(self) -> WaitStatus:
        return decode_wait_status(self.status)


class Signal(Event, frozen=True, tag="signal"):
    """A fatal signal was generated (``signal/signal_generate``): sender is the current task."""

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
    # the sender's executable, read by user space (/proc/PID/exe) when the signal was recorded:
    # its name (comm) is its own choice, its executable is not; "" when unknown (gone by then)
    sender_exe: str = ""
    # the sender was exiting (PF_EXITING): the kernel sent it on its way out, i.e. the
    # PR_SET_PDEATHSIG signal of a child whose parent thread exited
    sender_exiting: bool = False


class OomKill(Event, frozen=True, tag="oom"):
    """The kernel OOM killer chose a victim (one event per victim, ``memory.oom.group`` too)."""

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
    # the OOM's constraint as oom_control states it (fentry/kprobe rungs): "none" (the whole
    # machine), "memcg", "cpuset" or "mempolicy" (NUMA nodes a cpuset or mempolicy confined the
    # allocation to); "" where the rung guessed the scope instead
    constraint: str = ""
    # marked by the OOM killer while already exiting by itself (task_will_free_mem()): no kill
    exiting: bool = False
    # the limit and usage are cgroup v1's memory+swap counter's (memory.memsw.limit_in_bytes):
    # the charge that failed was memory+swap's, with memory itself under its limit
    memsw: bool = False


class Fork(Event, frozen=True, tag="fork"):
    """A watched process forked a new process (threads are not reported)."""

    parent_pid: int
    child_pid: int
    comm: str
    cgroup_id: int


class Exec(Event, frozen=True, tag="exec"):
    """A watched process called execve successfully."""

    pid: int
    comm: str
    filename: str
    cgroup_id: int


class KmsgOom(Event, frozen=True, tag="kmsg_oom"):
    """An OOM report read from the kernel log (``/dev/kmsg``): independent evidence.

    Assembled from the ``oom-kill:constraint=...`` line and the ``Killed process ...`` line of
    one report. Fields the kernel did not print are ``None`` / ``""``.
    """

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
    # The report's "Memory cgroup stats for <path>:" dump (the OOM's memcg at the kill), in
    # parse.memory.normalize_stat's v2 names, plus "kernel" (v1's kmem usage line) and "swap"
    # (v2's swap usage line) where printed; {} when the report had none.
    memcg_stat: dict[str, int] = {}
    memcg_stat_path: str = ""


class CgroupInfo(Event, frozen=True, tag="cgroup"):
    """What a cgroup id stands for, captured while the cgroup still existed.

    Written once per id the first time it is seen, so a trace names cgroups that are long gone
    when it is replayed.
    """

    cgroup_id: int
    path: str  # relative to the hierarchy root, starting with "/"
    hierarchy: str  # "memory" (cgroup v1 memory controller) or "unified" (cgroup v2)
    limit_bytes: int | None  # memory limit set on this cgroup itself (None = unlimited/unknown)


class Lost(Event, frozen=True, tag="lost"):
    """Events the kernel could not hand over (ring-buffer reservations that failed)."""

    count: int  # newly lost since the previous Lost event


# ---------------------------------------------------------------------------------------------
# Memory pressure: reclaim and throttling (BPF), and samples (cgroupfs, /proc)


class ReclaimStall(Event, frozen=True, tag="stall"):
    """One long stall of a watched task: memcg reclaim, host direct reclaim, or memory.high
    throttling (``kind``: "memcg", "direct", "high"). Shorter ones only count in summaries."""

    pid: int  # tgid of the stalled task
    comm: str
    cgroup_id: int  # the memory cgroup being reclaimed/throttled (at or over its limit)
    task_cgroup_id: int  # the stalled task's own memory cgroup
    kind: str
    duration_ns: int
    reclaimed_bytes: int  # 0 for throttling
    rung: str


class ReclaimSummary(Event, frozen=True, tag="reclaim"):
    """Reclaim/throttling aggregated in the kernel per cgroup over one interval.

    ``kind`` "kswapd" counts kswapd wake-ups on the host (``cgroup_id`` 0, durations 0).
    """

    cgroup_id: int
    kind: str
    count: int
    total_ns: int
    max_ns: int
    reclaimed_bytes: int
    interval_ns: int


class CgroupSample(Event, frozen=True, tag="cg_sample"):
    """One reading of a memory cgroup's files. ``None``: the file or field is absent here
    (a v1 host has no memory.high; old kernels lack some memory.stat keys)."""

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


class EffectiveLimit(Event, frozen=True, tag="eff_limit"):
    """The smallest memory limit over a watched cgroup and its ancestors, and who sets it.

    Written at start and whenever it changes."""

    cgroup_id: int
    path: str
    limit_bytes: int | None  # None: no limit anywhere up to the root
    set_by: str | None  # the path of the cgroup whose limit it is


class HostSample(Event, frozen=True, tag="host_sample"):
    """/proc/meminfo and /proc/pressure/memory: what "the host says memory is free" means."""

    mem_total: int
    mem_available: int | None
    mem_free: int
    cached: int | None
    swap_free: int | None
    psi_some_avg10: float | None
    psi_full_avg10: float | None
    psi_some_total_us: int | None
    psi_full_total_us: int | None


class ProcessSample(Event, frozen=True, tag="proc_sample"):
    """A watched process's resident memory split (from /proc/PID/status), bytes."""

    pid: int
    rss_anon: int | None
    rss_file: int | None  # file-backed resident pages, i.e. mapped files
    rss_shmem: int | None
    vm_swap: int | None


class TmpfsFull(Event, frozen=True, tag="tmpfs_full"):
    """A memory-backed filesystem (tmpfs: /dev/shm, a ``size=`` tmpfs) that a process sees is
    full, read right after the kernel sent it a fatal SIGBUS for an address it could not back
    (tracer/sources/tmpfs.py says what counts as full, and why a full tmpfs ends in SIGBUS).
    Read through the process's own /proc entry (its mount namespace, its root), or, when it
    was gone already, through a live process recorded in the same mount namespace."""

    pid: int  # the process that faulted (tgid)
    mount_point: str  # as the process sees it (inside its mount namespace)
    fs_type: str  # "tmpfs"
    size_bytes: int  # statvfs: f_blocks * f_frsize
    used_bytes: int  # (f_blocks - f_bfree) * f_frsize
    avail_bytes: int  # f_bavail * f_frsize
    mapped: bool  # the process maps a file on it (/proc/PID/maps; False when read via another)
    via_pid: int = 0  # the live process read instead, in the same mount namespace (0: itself)


class SampleError(Event, frozen=True, tag="sample_error"):
    """A sampler could not read something (said once per source, target and problem)."""

    source: str  # "cgroup", "host", "process", "psi"...
    target: str  # a cgroup path, a pid, a file
    message: str


# ---------------------------------------------------------------------------------------------
# GPU: allocation failures caught at libcuda (uprobes), NVML samples, Xid and lost-GPU reports

# CUresult values (cuda.h)
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2


class GpuAllocFailure(Event, frozen=True, tag="gpu_alloc_fail"):
    """A device allocation returned CUDA_ERROR_OUT_OF_MEMORY inside a watched process (a uretprobe
    on the libcuda.so.1 it maps). NVML never sees these: the process was refused the memory."""

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


class GpuOomRecovered(Event, frozen=True, tag="gpu_oom_recovered"):
    """The first successful device allocation after failures: a *recovered* GPU OOM (PyTorch and
    XLA free their caches and retry). An event, never a verdict on its own."""

    pid: int
    tid: int
    comm: str
    cgroup_id: int
    function: str
    requested_bytes: int
    held_bytes: int  # before this allocation
    peak_bytes: int
    failures: int  # failed allocations since the previous success


class GpuCallFailure(Event, frozen=True, tag="gpu_call_fail"):
    """A driver call of a watched process failed with something other than out of memory:
    ``cuInit`` or context creation (CUDA could not start: no device 100, driver/runtime
    mismatch 803, forward compatibility 804, unknown 999, ...) or an allocation refused for
    another reason (not initialised 3, no context 201, ...). Caught at libcuda by a uretprobe;
    only the first 64 failures of a process are sent (``failures`` counts them all so far)."""

    pid: int
    tid: int
    comm: str
    cgroup_id: int
    function: str  # the driver entry point, e.g. cuInit
    result: int  # the CUresult returned
    requested_bytes: int  # allocations only; 0 for cuInit and contexts
    failures: int  # this process's failing calls so far, this one included


class GpuLibrary(Event, frozen=True, tag="gpu_lib"):
    """A watched process maps a CUDA driver library: it is a GPU user. Says which allocation
    entry points were probed, so a trace shows what could and could not be caught."""

    pid: int
    path: str  # as the process maps it (inside its mount namespace)
    probed: str  # comma-separated entry points with uprobes attached
    missing: str  # comma-separated entry points this library does not export
    error: str  # why probing failed ("" when it did not)


class GpuSample(Event, frozen=True, tag="gpu_sample"):
    """One NVML reading of a device's memory (``nvmlDeviceGetMemoryInfo``, v2 where the driver
    has it: ``reserved_bytes`` is None on v1)."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None
    # the PCI bus id NVML gives (e.g. 00000000:3B:00.0): the kernel log names a GPU by it
    pci_bus_id: str = ""


class GpuProcessSample(Event, frozen=True, tag="gpu_proc_sample"):
    """Device memory NVML attributes to one watched process on one device."""

    index: int  # device index
    pid: int
    used_bytes: int | None  # None: NVML says "not available"
    kind: str  # "compute" or "graphics"


class GpuXid(Event, frozen=True, tag="gpu_xid"):
    """An Xid error: from NVML's event set (no pid) or from the driver's kernel-log line
    ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``"""

    xid: int
    device: str  # PCI bus id (kernel log) or UUID (NVML); "" when unknown
    device_index: int | None  # NVML index, when known
    pid: int | None  # the process the driver names, when it names one
    proc_name: str
    message: str  # the rest of the driver's text
    source: str  # "nvml" or "kmsg"


class GpuLost(Event, frozen=True, tag="gpu_lost"):
    """A GPU stopped answering: NVML reports it lost or needing a reset, or the driver logged
    that it fell off the bus."""

    device: str
    device_index: int | None
    reason: str  # "gpu_is_lost", "reset_required", "fallen_off_bus"
    source: str  # "nvml" or "kmsg"


class CgroupMkdir(Event, frozen=True, tag="cg_mkdir"):
    """A cgroup was created in the tracked hierarchy while containers were being followed."""

    cgroup_id: int
    path: str
    level: int


# ---------------------------------------------------------------------------------------------
# Containers, supervisors and health probes


class UnitInfo(Event, frozen=True, tag="unit"):
    """What a cgroup is to its users: a container (with its runtime's name for it), a pod's
    container, a systemd unit. Written once per cgroup id, when first named."""

    cgroup_id: int
    kind: str  # podman, docker, containerd, crio, k8s, systemd
    unit_id: str  # container id / unit name
    name: str  # the runtime's name for it ("" when no runtime answered)
    pod: str  # "namespace/name" for Kubernetes, else ""
    main_pid: int = 0  # its main process, when a runtime said so (a container already running)


class RuntimeSample(Event, frozen=True, tag="runtime"):
    """What a supervisor says about a unit: its restart count and its own exit claims."""

    unit: str  # the unit label, as UnitInfo names it
    source: str  # podman, docker, systemd, kubernetes
    restart_count: int | None
    state: str
    exit_code: int | None
    oom_killed: bool | None  # the runtime's claim (podman 4.3 says False for real cgroup OOMs)


class RuntimeExit(Event, frozen=True, tag="runtime_exit"):
    """A supervisor's own record of how a unit's main process last ended, stamped with the time
    it gives (podman/docker ``State.FinishedAt``, systemd ``ExecMainExitTimestampMonotonic``),
    brought onto CLOCK_BOOTTIME. Read after the fact by ``postmortem``: the runtime's word,
    beside the kernel's. ``exit_code`` is as the runtime reports it (128 + n for signal n)."""

    cgroup_id: int  # the unit's cgroup (as in UnitInfo), 0 when unknown
    unit: str  # the unit label, as UnitInfo names it
    source: str  # podman, docker, systemd
    exit_code: int | None
    pid: int  # the process that ended, 0 when the runtime does not keep it
    oom_killed: bool | None  # the runtime's claim (Docker OOMKilled, systemd Result=oom-kill)


class OomKillCount(Event, frozen=True, tag="oom_count"):
    """A memory cgroup's cumulative ``oom_kill`` counter, read once after the fact: ``count``
    OOM kills of its processes happened between ``ts`` and ``read_ns``. ``ts`` is the earliest
    time this incarnation of the cgroup is known to have existed (the counter starts at 0 when
    a cgroup is created, and a restarted container gets a new cgroup at the same path)."""

    cgroup_id: int
    path: str
    count: int
    read_ns: int


class ProbeSample(Event, frozen=True, tag="probe"):
    """One health probe: ours (--probe) or a runtime's exec health check seen in the kernel."""

    target: str  # the probe spec, or "healthcheck" for a runtime's exec check
    unit: str  # the unit it checks ("" when not known)
    latency_ns: int
    ok: bool
    timed_out: bool
    status: int | None  # HTTP status or exit code
    error: str
    pid: int = 0  # the check's process, for a runtime's exec health check


_ALL: tuple[type[Event], ...] = (
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
    TmpfsFull,
    SampleError,
    CgroupMkdir,
    UnitInfo,
    RuntimeSample,
    RuntimeExit,
    OomKillCount,
    ProbeSample,
    GpuAllocFailure,
    GpuOomRecovered,
    GpuCallFailure,
    GpuLibrary,
    GpuSample,
    GpuProcessSample,
    GpuXid,
    GpuLost,
)
for _cls in _ALL:
    # (a Struct's config is final only once its class exists: __init_subclass__ is too early)
    _cls.KIND = cast(str, _cls.__struct_config__.tag)
KINDS: dict[str, type[Event]] = {cls.KIND: cls for cls in _ALL}


class RecordError(ValueError):
    """A trace record that does not describe a known event."""


def from_record(rec: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_record``. Unknown fields are ignored; a missing field or a value of
    the wrong type is a `RecordError`."""
    kind = rec.get("t")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"unknown event kind {kind!r}")
    try:
        return msgspec.convert(rec, cls)
    except msgspec.ValidationError as exc:
        raise RecordError(f"{kind} record: {exc}") from None


def cgroup_ids(ev: Event) -> tuple[int, ...]:
    """The cgroup ids an event mentions (each needs a ``CgroupInfo`` before it in a trace)."""
    if isinstance(ev, Exit | Fork | Exec | GpuAllocFailure | GpuOomRecovered | GpuCallFailure):
        return (ev.cgroup_id,)
    if isinstance(ev, Signal):
        return (ev.sender_cgroup_id,)
    if isinstance(ev, OomKill):
        return (ev.victim_cgroup_id, ev.limit_cgroup_id)
    if isinstance(ev, ReclaimStall):
        return (ev.cgroup_id, ev.task_cgroup_id)
    if isinstance(ev, ReclaimSummary | CgroupSample | EffectiveLimit | CgroupMkdir):
        return (ev.cgroup_id,)
    return ()
