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
import signal as _signal
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
        for f in dataclasses.fields(self):
            rec[f.name] = getattr(self, f.name)
        return rec


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
    )
}


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
