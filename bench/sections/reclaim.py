"""Section reclaim: a memcg reclaim storm (a file four times a child cgroup's limit, read
again and again) bare and under each tracer."""

from __future__ import annotations

import os
from pathlib import Path

from bench.options import MiB, Options
from bench.records import Section, Summary
from bench.report import (
    fmt,
    med,
    method_lines,
    slow_str,
    slowdown,
    tool_notes,
    usable_variants,
    vmhwm_mib,
)
from bench.runner import Context, round_robin, tool_setup
from bench.tools import BPFTRACE_RECLAIM_PROG
from bench.workloads import ReclaimWork, memory_version
from tracer.sources.cgroupfs import own_memory_cgroup

METHOD = [
    "**workload**: build/bench/wr-reclaim pinned to CPU {storm_cpu}, in a child memory cgroup "
    "created for each run under the bench's own ({cg_version}, limit {reclaim_limit_mib} MiB, "
    "removed "
    "after the run): it drops a {reclaim_file_mib} MiB file in {reclaim_dir} from the page cache "
    "(fadvise DONTNEED), then reads it start to end, 1 MiB per read(2), again and again for "
    "{seconds:g} s. The file is four times the limit, so every pass reads from disk and every "
    "new page-cache page is charged at the limit: memcg reclaim runs all the time, with no "
    "anonymous memory, so nothing can be OOM-killed (and the host is never at risk).",
    "**MiB/s**: bytes read over wall time; **slowdown**: bare MiB/s over the variant's, same "
    "round, median. The workload waits on the disk much of the time, so this is noisier than "
    "the CPU-bound storms; **workload CPU s**: its own utime+stime (getrusage), median.",
    "**reclaims seen**: whyrestart: the `count` of its `reclaim` summary records (kind memcg) "
    "for the run's cgroup id (whyrestart aggregates reclaim in the kernel per cgroup and "
    "drains the aggregate once a second; only stalls over 10 ms become records of their own); "
    "bpftrace: lines of the one-liner `{bpftrace}` for the workload's pid (one printed line per "
    "reclaim). **limit hits**: the cgroup's memory.failcnt (v1) at the end of the run, the "
    "kernel's own count of charge attempts that failed at the limit: a reference for the "
    "scale, not the same count (a charge that needs reclaim usually fails more than once "
    "around it). Sums over rounds.",
    "**lost**, **tracer CPU s**, **peak RSS MB**: as in the storm section.",
]


def reclaim_data(opts: Options) -> Path:
    """Write the workload's data file on a disk file system (not tmpfs), once per section."""
    d = Path(opts.reclaim_dir)
    where = str(d.resolve())
    fstype = ""
    best = ""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1]
            inside = where.startswith(mnt.rstrip("/") + "/") or where == mnt
            if inside and len(mnt) >= len(best):
                best, fstype = mnt, parts[2]
    if fstype in ("tmpfs", "ramfs"):
        raise RuntimeError(f"{d} is on {fstype}: its pages are not reclaimable page cache")
    size = opts.reclaim_file_mib * MiB
    st = os.statvfs(d)
    if st.f_bavail * st.f_frsize < 2 * size:
        raise RuntimeError(f"not enough space in {d} for a {opts.reclaim_file_mib} MiB file")
    path = d / f"wr-bench-reclaim-{os.getpid()}.dat"
    block = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        for _ in range(opts.reclaim_file_mib):
            os.write(fd, block)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    lineup = tool_setup(opts, "reclaim", ctx)
    objs, active, skipped, variants = lineup.objs, lineup.active, lineup.skipped, lineup.variants
    version, own = memory_version(), own_memory_cgroup()
    data = reclaim_data(opts)
    try:
        runs = round_robin(
            opts, "reclaim", objs, active, lambda: ReclaimWork(data), tmp, opts.rounds
        )
    finally:
        data.unlink(missing_ok=True)
    lines = [
        f"## Memcg reclaim storm, {opts.rounds} round(s) x {opts.seconds:g} s "
        f"(limit {opts.reclaim_limit_mib} MiB, file {opts.reclaim_file_mib} MiB)",
        "",
        "| variant | MiB/s read | slowdown | workload CPU s | reclaims seen | limit hits "
        "(failcnt) | lost | tracer CPU s | peak RSS MB | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    summary: dict[str, Summary] = {}
    for v, ok, errs in usable_variants(variants, runs, skipped, lines, summary, 10):
        fails = [r["work"]["failcnt"] for r in ok if r["work"].get("failcnt") is not None]
        s: Summary = {
            "runs": len(ok),
            "mib_per_s": med([r["work"]["per_s"] for r in ok]),
            "slowdown": slowdown(runs, ok),
            "workload_cpu_s": med([r["work"]["cpu_s"] for r in ok]),
            "failcnt": sum(fails) if fails else None,
        }
        summary[v] = s
        fc = f"{s['failcnt']:,}" if s["failcnt"] is not None else "n/a (v2)"
        if v == "bare":
            lines.append(
                f"| bare | {s['mib_per_s']:,.0f} | 1.00x | {s['workload_cpu_s']:.2f} | - | {fc} "
                "| - | - | - | |"
            )
            continue
        s.update(
            seen=sum(r.get("seen", 0) for r in ok),
            lost=sum(r.get("lost", 0) for r in ok),
            cpu_storm_s=med([r.get("cpu_storm_s") for r in ok]),
            vmhwm_mib=med([vmhwm_mib(r) for r in ok]),
        )
        lines.append(
            f"| {v} | {s['mib_per_s']:,.0f} | {slow_str(s['slowdown'])} "
            f"| {s['workload_cpu_s']:.2f} | {s['seen']:,} | {fc} | {s['lost']:,} "
            f"| {fmt(s['cpu_storm_s'], '.2f')} | {fmt(s['vmhwm_mib'], '.1f')} "
            f"| {tool_notes(opts, v, ok, errs)} |"
        )
    lines += method_lines(
        METHOD,
        opts,
        cg_version=f"cgroup v{version} memory controller, parent {own}",
        bpftrace=BPFTRACE_RECLAIM_PROG,
    )
    return Section("\n".join(lines) + "\n", {"summary": summary, "runs": runs, "skipped": skipped})
