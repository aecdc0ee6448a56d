"""What the analysis concludes, as data: the causes, a rule's ``Finding``, the ``Verdict`` and
``Restart`` every output shows, and the one factory that makes a verdict of a finding. Pure.

A rule (tracer/analysis/rules/) sees one exit and an evidence view
and returns a ``Finding``: the cause, its confidence and words, and what it measured. The exit's
own facts (pid, comm, time, status) and the unit it belongs to are added here, by ``verdict``,
so that no rule builds a ``Verdict`` by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from tracer.events import Exit, signal_name

CGROUP_OOM = "cgroup_oom"
GLOBAL_OOM = "global_oom"
NUMA_OOM = "numa_oom"  # the NUMA nodes a cpuset or mempolicy allowed ran out, not the host
GPU_OOM = "gpu_oom"
PROBE_KILL = "probe_kill"
USERSPACE_OOM = "userspace_oom"
SIGNAL_KILL = "signal_kill"
DEVICE_RESET = "device_reset"
APP_EXIT = "app_exit"
UNKNOWN = "unknown"

# Every cause, in the order the JSON schema (tracer/outputs/schema.py) and the docs list them.
CAUSES = (
    CGROUP_OOM,
    GLOBAL_OOM,
    NUMA_OOM,
    GPU_OOM,
    PROBE_KILL,
    USERSPACE_OOM,
    SIGNAL_KILL,
    DEVICE_RESET,
    APP_EXIT,
    UNKNOWN,
)

HIGH, MEDIUM, LOW = "high", "medium", "low"
CONFIDENCES = (HIGH, MEDIUM, LOW)

Evidence_ = tuple[int, str]  # (timestamp of the event, what it says)


class Finding(msgspec.Struct, frozen=True, gc=False):
    """A rule's conclusion about one exit, without the exit's own facts (``verdict`` adds them).

    ``signal`` is left None by the rules that do not decide it: the factory names the exit's
    terminating signal then. (A frozen msgspec Struct, as ``Verdict``: a replay judges
    thousands; a rule that refines another's finding makes a new one, ``rules.view.amend``.)"""

    cause: str
    confidence: str
    summary: str
    advice: str
    evidence: tuple[Evidence_, ...]
    disagreements: tuple[str, ...] = ()
    signal: str | None = None
    sender_pid: int | None = None
    sender_comm: str | None = None
    sender_role: str | None = None
    limit_cgroup: str | None = None
    limit_scope: str | None = None
    limit_bytes: int | None = None
    usage_bytes: int | None = None
    peak_bytes: int | None = None
    peak_ts: int | None = None
    breakdown: tuple[tuple[str, int], ...] = ()
    stall_ns: int | None = None
    host_available: int | None = None
    exit_code: int | None = None
    sender_exe: str | None = None
    probe_failures: int = 0


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """Why one process ended. (A frozen msgspec Struct: its C constructor costs a small part
    of a frozen dataclass's 25 ``object.__setattr__`` calls, and a replay makes thousands.)"""

    ts: int  # the exit's timestamp (CLOCK_BOOTTIME ns)
    pid: int
    comm: str
    cause: str
    confidence: str
    summary: str  # one line: what happened, with the numbers
    advice: str
    evidence: tuple[tuple[int, str], ...]  # (timestamp, what that event says), in time order
    disagreements: tuple[str, ...] = ()
    unit: str | None = None
    main: bool = True  # the unit's main process (its exit is a restart of the unit)
    start_ns: int | None = None  # the process's start (a run's length, in a restart loop)
    exit_code: int | None = None
    signal: str | None = None
    sender_pid: int | None = None
    sender_comm: str | None = None
    sender_role: str | None = None
    limit_cgroup: str | None = None
    limit_scope: str | None = None  # "own" or "ancestor"
    limit_bytes: int | None = None
    usage_bytes: int | None = None
    peak_bytes: int | None = None
    peak_ts: int | None = None
    breakdown: tuple[tuple[str, int], ...] = ()  # anon, file, shmem, file_mapped at the kill
    stall_ns: int | None = None  # reclaim + throttling in the minute before
    host_available: int | None = None
    sender_exe: str | None = None  # the sender's executable, when the recording saw it
    probe_failures: int = 0  # the unit's health probes failing in a row up to the exit

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name == "evidence":
                value = [{"ts": ts, "what": what} for ts, what in value]
            elif name == "breakdown":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class Restart:
    """A unit's main process exited and a new one started in the same unit."""

    ts: int  # the new main process's start
    unit: str
    old_pid: int
    new_pid: int
    downtime_ns: int
    cause: str  # the old main process's verdict
    # memory still charged to the unit's cgroup after the old run ended, before the new one
    # started (tmpfs files, page cache: they outlive a process), when it was sampled then and
    # is worth saying (processes.CARRIED_MIN); ``carried`` says it in words
    carried_bytes: int | None = None
    carried: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        if self.carried_bytes is None:
            del out["carried_bytes"], out["carried"]
        return out


def verdict(ex: Exit, f: Finding, unit: str | None, main: bool) -> Verdict:
    """The one place a ``Verdict`` is made: a rule's finding plus the exit's own facts."""
    ws = ex.wait
    sig = f.signal
    if sig is None and ws.signal is not None:
        sig = signal_name(ws.signal)
    return Verdict(
        ts=ex.ts,
        pid=ex.pid,
        comm=ex.comm,
        cause=f.cause,
        confidence=f.confidence,
        summary=f.summary,
        advice=f.advice,
        evidence=f.evidence,
        disagreements=f.disagreements,
        unit=unit,
        main=main,
        start_ns=ex.start_ns or None,
        exit_code=f.exit_code if f.exit_code is not None else ws.code,
        signal=sig,
        sender_pid=f.sender_pid,
        sender_comm=f.sender_comm,
        sender_role=f.sender_role,
        limit_cgroup=f.limit_cgroup,
        limit_scope=f.limit_scope,
        limit_bytes=f.limit_bytes,
        usage_bytes=f.usage_bytes,
        peak_bytes=f.peak_bytes,
        peak_ts=f.peak_ts,
        breakdown=f.breakdown,
        stall_ns=f.stall_ns,
        host_available=f.host_available,
        sender_exe=f.sender_exe,
        probe_failures=f.probe_failures,
    )
