"""Text output: the event timeline and the verdict table. Pure string building.

Times are shown relative to the start of the recording (seconds) and, where the trace header
gives the clock offset, as wall-clock time: the only place wall-clock time appears.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from tracer import safetext
from tracer.analysis import wording as say
from tracer.analysis.analyzer import Restart, Verdict, describe_status
from tracer.analysis.quantities import fmt_bytes, fmt_offset
from tracer.analysis.wording import lost_records, memory_at_kill, stall_kind
from tracer.clock import wall_time
from tracer.events import (
    SI_KERNEL,
    CgroupInfo,
    CgroupMkdir,
    Event,
    Exec,
    Exit,
    Fork,
    GpuAllocFailure,
    GpuCallFailure,
    GpuLibrary,
    GpuLost,
    GpuOomRecovered,
    GpuXid,
    KmsgOom,
    Lost,
    OomKill,
    ProbeSample,
    ReclaimStall,
    ReclaimSummary,
    RuntimeSample,
    Signal,
    TmpfsFull,
    UnitInfo,
    signal_name,
    signal_result_name,
)
from tracer.parse import cuda


class Clock:
    """Formats CLOCK_BOOTTIME timestamps relative to a start and as wall-clock time."""

    def __init__(self, start_ns: int, offset_ns: int | None) -> None:
        self.start_ns = start_ns
        self.offset_ns = offset_ns

    def rel(self, ts: int) -> str:
        return fmt_offset((ts - self.start_ns) / 1e9)

    def wall(self, ts: int) -> str:
        if self.offset_ns is None:
            return self.rel(ts)
        return wall_time(ts, self.offset_ns).strftime("%H:%M:%S.%f")[:-3]


def describe(ev: Event, cgroup_path: Callable[[int], str | None]) -> str | None:
    """One line for a timeline, or None for events that are not shown on their own."""
    if isinstance(ev, Exit):
        return f"exit    {describe_status(ev)}"
    if isinstance(ev, Signal) and ev.si_code == SI_KERNEL:
        return (
            f"signal  {signal_name(ev.sig)} from the kernel (running in pid {ev.sender_pid}, "
            f"{ev.sender_comm}) to pid {ev.target_pid} ({ev.target_comm}): "
            f"{signal_result_name(ev.result)}"
        )
    if isinstance(ev, Signal):
        return (
            f"signal  {signal_name(ev.sig)} from pid {ev.sender_pid} ({ev.sender_comm}) to "
            f"pid {ev.target_pid} ({ev.target_comm}): {signal_result_name(ev.result)}"
        )
    if isinstance(ev, OomKill):
        if ev.memcg:
            where = cgroup_path(ev.limit_cgroup_id) or f"cgroup id {ev.limit_cgroup_id}"
            scope = f"memcg {where} at {fmt_bytes(ev.usage_bytes)} of {fmt_bytes(ev.limit_bytes)}"
        else:
            scope = "global (host out of memory)"
        return (
            f"oom     OOM killer chose pid {ev.victim_pid} ({ev.victim_comm or '?'}), "
            f"{scope}; triggered by pid {ev.trigger_pid} ({ev.trigger_comm}) [{ev.rung}]"
        )
    if isinstance(ev, KmsgOom):
        rss = f", anon-rss {ev.anon_rss_kb} kB" if ev.anon_rss_kb is not None else ""
        memcg = f", oom_memcg={ev.oom_memcg}" if ev.oom_memcg else ""
        return (
            f"kmsg    kernel log: killed pid {ev.victim_pid} ({ev.victim_comm}), "
            f"{ev.constraint or 'no constraint line'}{memcg}{rss}"
        )
    if isinstance(ev, ReclaimStall):
        where = cgroup_path(ev.cgroup_id) or (
            "the host" if not ev.cgroup_id else f"cgroup id {ev.cgroup_id}"
        )
        what = stall_kind(ev.kind)
        freed = f", reclaimed {fmt_bytes(ev.reclaimed_bytes)}" if ev.reclaimed_bytes else ""
        return (
            f"stall   pid {ev.pid} ({ev.comm}) stalled {ev.duration_ns / 1e6:.1f} ms in "
            f"{what} of {where}{freed} [{ev.rung}]"
        )
    if isinstance(ev, ReclaimSummary):
        if ev.kind == "kswapd":
            return f"reclaim kswapd woken {ev.count} times in {ev.interval_ns / 1e9:.1f} s"
        where = cgroup_path(ev.cgroup_id) or (
            "the host" if not ev.cgroup_id else f"cgroup id {ev.cgroup_id}"
        )
        return (
            f"reclaim {ev.count} {ev.kind} stalls in {where}: {ev.total_ns / 1e6:.1f} ms "
            f"total, longest {ev.max_ns / 1e6:.1f} ms, reclaimed "
            f"{fmt_bytes(ev.reclaimed_bytes)} in {ev.interval_ns / 1e9:.1f} s"
        )
    if isinstance(ev, Fork):
        return f"fork    pid {ev.parent_pid} ({ev.comm}) -> pid {ev.child_pid}"
    if isinstance(ev, Exec):
        return f"exec    pid {ev.pid} runs {ev.filename}"
    if isinstance(ev, Lost):
        return f"LOST    {lost_records(ev.count)}"
    if isinstance(ev, ProbeSample):
        state = "timed out" if ev.timed_out else "ok" if ev.ok else f"failed ({ev.error})"
        return f"probe   {ev.target} {ev.unit}: {ev.latency_ns / 1e6:.0f} ms, {state}".replace(
            "  ", " "
        )
    if isinstance(ev, RuntimeSample) and ev.restart_count is not None:
        return f"restart {ev.source} counts {ev.restart_count} restarts of {ev.unit}"
    if isinstance(ev, CgroupMkdir):
        return f"cgroup  created {ev.path}"
    if isinstance(ev, TmpfsFull):
        line = say.tmpfs_full_line(
            ev.mount_point, ev.size_bytes, ev.used_bytes, ev.avail_bytes, ev.via_pid
        )
        return f"tmpfs   pid {ev.pid}: {line}"
    if isinstance(ev, UnitInfo):
        return None
    if isinstance(ev, CgroupInfo):
        return None
    return describe_gpu(ev)  # GPU events; None for samples and the rest


def describe_gpu(ev: Event) -> str | None:
    """One timeline line for a GPU event; None for samples (shown as numbers, not lines) and for
    events that are not GPU events."""
    if isinstance(ev, GpuAllocFailure):
        return (
            f"gpu     pid {ev.pid} ({ev.comm}) {ev.function} of {fmt_bytes(ev.requested_bytes)}: "
            f"CUDA_ERROR_OUT_OF_MEMORY with {fmt_bytes(ev.held_bytes)} held "
            f"(failure {ev.failures} in a row) [uprobe]"
        )
    if isinstance(ev, GpuOomRecovered):
        return (
            f"gpu     pid {ev.pid} ({ev.comm}) recovered GPU OOM: {ev.function} of "
            f"{fmt_bytes(ev.requested_bytes)} succeeded after {say.n_failures(ev.failures)} "
            "[uprobe]"
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
        return f"xid     {say.gpu_down(ev)}{who} [{ev.source}]"
    if isinstance(ev, GpuLost):
        return f"gpu     {say.gpu_down(ev)} [{ev.source}]"
    return None


def timeline(
    events: Iterable[Event], clock: Clock, cgroup_path: Callable[[int], str | None]
) -> Iterable[str]:
    for ev in events:
        line = describe(ev, cgroup_path)
        if line is not None:
            # one escape per line: names, paths and probe errors are the workload's text
            yield f"{clock.rel(ev.ts):>10}  {safetext.field(line)}"


# More verdicts than this (a busy host under --all): plain exits are folded into one line.
MAX_ROWS = 200


def _limit_peak(v: Verdict) -> str:
    if v.limit_bytes is None and v.peak_bytes is None:
        return "-"
    return f"{fmt_bytes(v.peak_bytes)} / {fmt_bytes(v.limit_bytes)}"


def verdict_table(
    verdicts: list[Verdict],
    clock: Clock,
    evidence: bool = True,
    restarts: list[Restart] | None = None,
    restart_counts: list[tuple[str, int, int | None, str]] | None = None,
) -> str:
    """The verdict table (time, unit, pid, cause, confidence, peak/limit), then each verdict's
    summary, evidence chain, disagreements and advice, then the unit restarts (long: the
    sections in the order they print, each a few lines)."""
    if not verdicts:
        return "No process of the watched set exited: no verdicts.\n"
    folded = ""
    if len(verdicts) > MAX_ROWS:
        # A busy host (--all): list what was killed; fold plain exits into one line by code.
        codes = Counter(v.exit_code for v in verdicts if v.cause == "app_exit")
        verdicts = [v for v in verdicts if v.cause != "app_exit"][:MAX_ROWS]
        if codes:
            top = ", ".join(
                f"code {c}: {n}" for c, n in sorted(codes.items(), key=lambda x: -x[1])[:8]
            )
            folded = (
                f"\n{sum(codes.values())} processes exited on their own and are not "
                f"listed ({top}); `whyrestart explain --json` lists every verdict\n"
            )
    header = ("time", "unit", "pid", "comm", "cause", "confidence", "peak/limit")
    rows = [header]
    for v in verdicts:
        unit = safetext.cell(v.unit or "-") + ("" if v.main else " (child)")
        rows.append(
            (
                clock.rel(v.ts),
                unit,
                str(v.pid),
                safetext.cell(v.comm),
                v.cause,
                v.confidence,
                _limit_peak(v),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines) + "\n"
    esc = safetext.field  # a verdict's words quote names, paths and kernel log text
    if evidence:
        for v in verdicts:
            if v.cause == "app_exit" and v.exit_code == 0 and not v.disagreements:
                continue  # nothing to explain
            out += f"\npid {v.pid} ({esc(v.comm)}): {v.cause}, {v.confidence} confidence\n"
            out += f"  {esc(v.summary)}\n"
            if v.breakdown:
                out += f"  {memory_at_kill(v.breakdown, fmt_bytes)}\n"
            if v.peak_ts is not None and v.peak_bytes is not None:
                out += f"  peak usage {fmt_bytes(v.peak_bytes)} at {clock.rel(v.peak_ts)}\n"
            for ts, what in v.evidence:
                out += f"  evidence {clock.rel(ts)}: {esc(what)}\n"
            for d in v.disagreements:
                out += f"  disagrees: {esc(d)}\n"
            if v.advice:
                out += f"  advice: {esc(v.advice)}\n"
    for unit, ours, theirs, source in restart_counts or []:
        if theirs is None:
            if source and ours:
                out += (
                    f"\n{unit}: whyrestart linked {ours} restarts; {source}'s count for them is "
                    "unknown (its first reading came after a restart)\n"
                )
            continue
        if theirs == ours:
            agree = "agrees"
        elif theirs < ours and source in ("docker", "podman"):
            # RestartCount counts the restart policy's restarts only: a `docker restart` (or
            # an autoheal's, or a stop and start) is a restart it never counts
            agree = (
                f"{ours - theirs} of them not by its restart policy: a `{source} restart` or a "
                "stop and start, which it does not count"
            )
        else:
            agree = "DISAGREES: a restart one of us did not see"
        out += (
            f"\n{esc(unit)}: {source} counted {theirs} restarts, whyrestart linked {ours} "
            f"({agree})\n"
        )
    out += folded
    if restarts:
        out += "\nrestarts:\n"
        for r in restarts:
            out += (
                f"  {clock.rel(r.ts)}  {esc(r.unit)}: pid {r.old_pid} -> pid {r.new_pid} after "
                f"{r.downtime_ns / 1e9:.1f} s down ({esc(r.cause)})\n"
            )
            if r.carried:
                out += f"    {esc(r.carried)}\n"
    return out
