"""Readable synthetic event streams for analysis tests (times in seconds, sensible defaults),
and the analyzer judging them (``judge``, ``one``)."""

from __future__ import annotations

import dataclasses
import signal as _signal
from typing import Any

from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.events import (
    SI_KERNEL,
    SI_USER,
    CgroupInfo,
    CgroupSample,
    Event,
    Exec,
    Exit,
    Fork,
    GpuAllocFailure,
    GpuCallFailure,
    GpuLibrary,
    GpuLost,
    GpuOomRecovered,
    GpuProcessSample,
    GpuSample,
    GpuXid,
    HostSample,
    KmsgOom,
    OomKill,
    ProbeSample,
    ReclaimSummary,
    RuntimeSample,
    Signal,
    TmpfsFull,
    UnitInfo,
)
from tracer.trace.format import TraceHeader

S = 1_000_000_000
MiB = 1024 * 1024


def judge(*events: Event, **analyzer: object) -> list[Verdict]:
    """Every verdict an ``Analyzer(**analyzer)`` makes of ``events``."""
    return Analyzer(**analyzer).feed_all(events)  # type: ignore[arg-type]


def one(*events: Event) -> Verdict:
    """The one verdict of ``events`` (an assertion error if there is not exactly one)."""
    [v] = judge(*events)
    return v


def t(seconds: float) -> int:
    return int(seconds * S)


_HEADER = TraceHeader(
    tool_version="test",
    host="h",
    kernel="k",
    cgroup={"mode": "v1", "memory_version": 1},
    clock_offset_ns=1_700_000_000 * S,
    hooks={},
    targets={},
    started_ns=0,
)


def header(**changes: Any) -> TraceHeader:
    """A trace header of plain values; ``changes``: the fields a test cares about."""
    return dataclasses.replace(_HEADER, **changes)


def exit_code(
    at: float,
    pid: int,
    code: int,
    comm: str = "app",
    start: float = 0.0,
    cg: int = 10,
    ppid: int = 1,
) -> Exit:
    return Exit(
        ts=t(at), pid=pid, ppid=ppid, comm=comm, cgroup_id=cg, status=code << 8, start_ns=t(start)
    )


def killed(
    at: float,
    pid: int,
    sig: int,
    comm: str = "app",
    core: bool = False,
    start: float = 0.0,
    cg: int = 10,
    ppid: int = 1,
) -> Exit:
    return Exit(
        ts=t(at),
        pid=pid,
        ppid=ppid,
        comm=comm,
        cgroup_id=cg,
        status=sig | (0x80 if core else 0),
        start_ns=t(start),
    )


def sent(
    at: float,
    sender: int,
    target: int,
    sig: int = _signal.SIGTERM,
    comm: str = "kill",
    code: int = SI_USER,
    target_comm: str = "app",
) -> Signal:
    return Signal(
        ts=t(at),
        sender_pid=sender,
        sender_tid=sender,
        sender_comm=comm,
        sender_cgroup_id=10,
        target_pid=target,
        target_comm=target_comm,
        sig=sig,
        si_code=code,
        result=0,
        group=True,
    )


def tmpfs_full(
    at: float,
    pid: int,
    mount_point: str = "/dev/shm",
    size: int = 64 * MiB,
    used: int = 64 * MiB,
    mapped: bool = True,
    via: int = 0,
) -> TmpfsFull:
    """A tmpfs ``pid`` sees, read full at ``at`` (tracer/pipeline/enrich.py, TmpfsAtFault)."""
    return TmpfsFull(t(at), pid, mount_point, "tmpfs", size, used, size - used, mapped, via)


def oom(
    at: float,
    victim: int,
    memcg: bool = True,
    limit_cgroup: int = 20,
    limit: int = 64 * MiB,
    usage: int = 64 * MiB,
    trigger: int | None = None,
    rung: str = "tp_btf",
    victim_cg: int = 20,
    constraint: str = "",
    exiting: bool = False,
) -> OomKill:
    return OomKill(
        ts=t(at),
        victim_pid=victim,
        victim_comm="app",
        victim_cgroup_id=victim_cg,
        trigger_pid=trigger or victim,
        trigger_comm="app",
        memcg=memcg,
        limit_cgroup_id=limit_cgroup if memcg else 0,
        limit_bytes=limit if memcg else 0,
        usage_bytes=usage if memcg else 0,
        rung=rung,
        constraint=constraint,
        exiting=exiting,
    )


def oom_killer_sigkill(at: float, victim: int, trigger: int) -> Signal:
    return sent(at, trigger, victim, _signal.SIGKILL, comm="app", code=SI_KERNEL)


def kmsg(
    at: float,
    victim: int,
    memcg: bool = True,
    oom_memcg: str = "/demo",
    comm: str = "app",
    constraint: str | None = None,
) -> KmsgOom:
    return KmsgOom(
        ts=t(at),
        victim_pid=victim,
        victim_comm=comm,
        constraint=constraint or ("CONSTRAINT_MEMCG" if memcg else "CONSTRAINT_NONE"),
        oom_memcg=oom_memcg if memcg else "",
        task_memcg=oom_memcg,
        total_vm_kb=100000,
        anon_rss_kb=65000,
        file_rss_kb=100,
        shmem_rss_kb=0,
        oom_score_adj=0,
        memcg=memcg,
    )


def cgroup(cid: int, path: str, limit: int | None = None) -> CgroupInfo:
    return CgroupInfo(ts=0, cgroup_id=cid, path=path, hierarchy="memory", limit_bytes=limit)


def sample(
    at: float,
    cg: int,
    path: str,
    usage: int | None = None,
    failcnt: int | None = None,
    events: dict[str, int] | None = None,
    stat: dict[str, int] | None = None,
    limit: int | None = None,
    some: float | None = None,
) -> CgroupSample:
    """A cgroup's sample at ``at``; ``some``: its PSI some avg10."""
    return CgroupSample(
        ts=t(at),
        cgroup_id=cg,
        path=path,
        usage_bytes=usage,
        limit_bytes=limit,
        high_bytes=None,
        peak_bytes=None,
        failcnt=failcnt,
        events=events or {},
        stat=stat or {},
        psi_some_avg10=some,
        psi_full_avg10=None,
        psi_some_total_us=None,
        psi_full_total_us=None,
    )


def host(at: float, available: int, some: float = 0.0, full: float = 0.0) -> HostSample:
    """The host's memory at ``at``; ``some``, ``full``: its PSI avg10."""
    return HostSample(
        ts=t(at),
        mem_total=24 << 30,
        mem_available=available,
        mem_free=available,
        cached=0,
        swap_free=0,
        psi_some_avg10=some,
        psi_full_avg10=full,
        psi_some_total_us=0,
        psi_full_total_us=0,
    )


def reclaim(
    at: float, cg: int, total_s: float, count: int, interval_s: float = 1.0, kind: str = "memcg"
) -> ReclaimSummary:
    return ReclaimSummary(
        ts=t(at),
        cgroup_id=cg,
        kind=kind,
        count=count,
        total_ns=t(total_s),
        max_ns=t(total_s) // max(count, 1),
        reclaimed_bytes=0,
        interval_ns=t(interval_s),
    )


def execd(at: float, pid: int, cg: int, comm: str = "app") -> Exec:
    return Exec(ts=t(at), pid=pid, comm=comm, filename=f"/usr/bin/{comm}", cgroup_id=cg)


def forked(at: float, parent: int, child: int, cg: int, comm: str = "app") -> Fork:
    return Fork(ts=t(at), parent_pid=parent, child_pid=child, comm=comm, cgroup_id=cg)


def probe(
    at: float,
    ok: bool,
    latency_ms: float = 5.0,
    timed_out: bool = False,
    unit: str = "",
    target: str = "http://127.0.0.1:8080/health",
) -> ProbeSample:
    return ProbeSample(
        ts=t(at),
        target=target,
        unit=unit,
        latency_ns=int(latency_ms * 1e6),
        ok=ok,
        timed_out=timed_out,
        status=200 if ok else None,
        error="" if ok else "timed out",
    )


def unit_info(cg: int, kind: str, name: str, unit_id: str = "a" * 64) -> UnitInfo:
    return UnitInfo(ts=0, cgroup_id=cg, kind=kind, unit_id=unit_id, name=name, pod="")


def runtime(at: float, unit: str, count: int, source: str = "podman") -> RuntimeSample:
    return RuntimeSample(
        ts=t(at),
        unit=unit,
        source=source,
        restart_count=count,
        state="running",
        exit_code=None,
        oom_killed=False,
    )


# --- GPU ------------------------------------------------------------------------------------

GiB = 1024 * MiB


def gpu_fail(
    at: float,
    pid: int,
    requested: int = 2 * GiB,
    held: int = 70 * GiB,
    peak: int | None = None,
    function: str = "cuMemAlloc_v2",
    failures: int = 1,
    comm: str = "app",
) -> GpuAllocFailure:
    return GpuAllocFailure(
        ts=t(at),
        pid=pid,
        tid=pid,
        comm=comm,
        cgroup_id=10,
        function=function,
        requested_bytes=requested,
        result=2,
        held_bytes=held,
        peak_bytes=held if peak is None else peak,
        failures=failures,
    )


def gpu_recovered(
    at: float, pid: int, requested: int = 1 * GiB, held: int = 60 * GiB, failures: int = 1
) -> GpuOomRecovered:
    return GpuOomRecovered(
        ts=t(at),
        pid=pid,
        tid=pid,
        comm="app",
        cgroup_id=10,
        function="cuMemAlloc_v2",
        requested_bytes=requested,
        held_bytes=held,
        peak_bytes=70 * GiB,
        failures=failures,
    )


def gpu_call(
    at: float,
    pid: int,
    function: str = "cuInit",
    result: int = 100,
    failures: int = 1,
    requested: int = 0,
) -> GpuCallFailure:
    return GpuCallFailure(
        ts=t(at),
        pid=pid,
        tid=pid,
        comm="app",
        cgroup_id=10,
        function=function,
        result=result,
        requested_bytes=requested,
        failures=failures,
    )


def gpu_lib(at: float, pid: int) -> GpuLibrary:
    return GpuLibrary(
        ts=t(at),
        pid=pid,
        path="/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        probed="cuMemAlloc_v2",
        missing="",
        error="",
    )


def xid(
    at: float, number: int, pid: int | None = None, source: str = "kmsg", index: int | None = None
) -> GpuXid:
    return GpuXid(
        ts=t(at),
        xid=number,
        device="0000:3b:00" if source == "kmsg" else "GPU-fake-0000",
        device_index=index,
        pid=pid,
        proc_name="app" if pid else "",
        message="",
        source=source,
    )


def gpu_lost(at: float, index: int | None = 0, reason: str = "gpu_is_lost") -> GpuLost:
    return GpuLost(
        ts=t(at), device="GPU-fake-0000", device_index=index, reason=reason, source="nvml"
    )


def gpu_sample(
    at: float, used: int, total: int = 80 * GiB, index: int = 0, reserved: int = 0
) -> GpuSample:
    return GpuSample(
        ts=t(at),
        index=index,
        uuid=f"GPU-fake-{index:04d}",
        name="Fake GPU",
        total_bytes=total,
        used_bytes=used,
        free_bytes=total - used - reserved,
        reserved_bytes=reserved,
    )


def gpu_proc(at: float, pid: int, used: int, index: int = 0) -> GpuProcessSample:
    return GpuProcessSample(ts=t(at), index=index, pid=pid, used_bytes=used, kind="compute")
