"""Section storm: the fork/exit storm bare and under each tracer (slowdown, events seen and
lost, tracer CPU and RSS, start-to-first-event)."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.options import Options
from bench.records import Run, Section, Summary
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
from bench.workloads import StormWork

METHOD = [
    "**exits/s**: the storm's own count of reaped children divided by its wall time "
    "(build/bench/wr-storm, pinned with `taskset -c {storm_cpu}`; it forks {batch} children "
    "that `_exit(i & 0xff)` at once, reaps them, and loops for {seconds:g} s); median over "
    "rounds.",
    "**slowdown**: per round, bare exits/s divided by the variant's exits/s in the same round "
    "(variants alternate round-robin, order rotated each round); median over rounds. "
    "1.00x = no cost.",
    "**events seen / exits**: exit events whose comm is `wr-storm` (the storm process itself "
    "excluded) in the tool's output (whyrestart: trace records with t=exit; bpftrace/exitsnoop: "
    "output lines), against the exits the storm reaped; summed over rounds.",
    "**lost**: what the tool itself reports, summed over rounds: whyrestart's trace footer "
    "`lost`; for bpftrace and exitsnoop their `lost N events` warnings on stderr/stdout.",
    "**tracer CPU s**: utime+stime of the tool process from /proc/PID/stat, read {settle:g} s "
    "before the storm and {drain:g} s after it (so its catch-up is included); median over "
    "rounds. Its whole life (start-up, storm, stop and final write-out) from wait4's rusage is in "
    "the second table. In-kernel BPF time is charged to the storm, i.e. it is in the slowdown.",
    "**peak RSS MB**: VmHWM (MiB) of the tool from /proc/PID/status just before SIGINT; median.",
    "**start-to-first-event s**: from just before the tool is spawned (taskset + exec, for "
    "whyrestart including Python start-up) to the exit of the first marker the tool caught. A "
    "marker loop pinned to the storm CPU forks a child named wrmkNNNNN every {marker_ms} ms; "
    "after the run, the lowest marker number in the tool's output is k, and the number reported "
    "is when marker k's parent had reaped it (so the tool was attached before that and after "
    "marker k-1 was forked: resolution {marker_ms} ms). This is attach latency, independent of "
    "output buffering; median.",
    "**visible s** (second table): from tool spawn until a marker line actually appeared in the "
    "tool's output file, polled every 5 ms. This adds output buffering: exitsnoop's stdout to "
    "a file is block-buffered (4 KiB), bpftrace flushes every line, whyrestart's trace writer "
    "writes in chunks of 256 records (or at stop), so with little else happening it depends on "
    "the marker rate. The storm starts only once a marker is visible (proof the tool is "
    "attached), then {settle:g} s later.",
    "**stop s** (second table): from SIGINT until the tool exited (whyrestart: final drain, "
    "footer, verdict table to stdout, which goes to a file).",
]


def report(
    opts: Options,
    runs: list[Run],
    skipped: dict[str, str],
    variants: list[str],
    helpers: dict[str, str],
) -> tuple[str, dict[str, Summary]]:
    lines = [
        f"## Fork/exit storm, {opts.rounds} round(s) x {opts.seconds:g} s",
        "",
        "| variant | exits/s | slowdown | events seen / exits | lost | tracer CPU s "
        "| peak RSS MB | start-to-first-event s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    details = [
        "| variant | visible s | stop s | tracer CPU s, whole life | CPU us / storm exit "
        "| ru_maxrss MB | in-kernel BPF ns / storm exit | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    summary: dict[str, Summary] = {}
    for v, ok, errs in usable_variants(variants, runs, skipped, lines, summary, 8):
        rate = med([r["work"]["exits_per_s"] for r in ok])
        slow = slowdown(runs, ok)
        exits = sum(r["work"]["exits"] for r in ok)
        s: Summary = {
            "runs": len(ok),
            "failed_runs": errs,
            "exits_per_s": rate,
            "slowdown": slow,
            "exits": exits,
        }
        if v == "bare":
            lines.append(f"| bare | {rate:,.0f} | 1.00x | - | - | - | - | - |")
            summary[v] = s
            continue
        seen = sum(r.get("seen", 0) for r in ok)
        lost = sum(r.get("lost", 0) for r in ok)
        cpu = med([r.get("cpu_storm_s") for r in ok])
        rss = med([vmhwm_mib(r) for r in ok])
        first = med([r.get("start_to_first_event_s") for r in ok])
        vis = med([r.get("visible_s") for r in ok])
        stop = med([r.get("stop_s") for r in ok])
        cpu_tot = med([r.get("cpu_total_s") for r in ok])
        maxrss = med([r["ru_maxrss_kb"] / 1024 if r.get("ru_maxrss_kb") else None for r in ok])
        us_per = med([_us_per_exit(r) for r in ok])
        bpf_ns = med(
            [r["bpf_ns_total"] / r["work"]["exits"] if "bpf_ns_total" in r else None for r in ok]
        )
        pct = seen / exits * 100 if exits else 0.0
        lines.append(
            f"| {v} | {rate:,.0f} | {slow_str(slow)} | {seen:,} / {exits:,} ({pct:.2f}%) "
            f"| {lost:,} | {fmt(cpu, '.2f')} | {fmt(rss, '.1f')} | {fmt(first, '.3f')} |"
        )
        details.append(
            f"| {v} | {fmt(vis, '.3f')} | {fmt(stop, '.2f')} | {fmt(cpu_tot, '.2f')} "
            f"| {fmt(us_per, '.1f')} | {fmt(maxrss, '.1f')} "
            f"| {fmt(bpf_ns, '.0f', 'not measured (--bpf-stats)')} "
            f"| {tool_notes(opts, v, ok, errs)} |"
        )
        s.update(
            seen=seen,
            lost=lost,
            cpu_storm_s=cpu,
            vmhwm_mib=rss,
            start_to_first_event_s=first,
            visible_s=vis,
            stop_s=stop,
            cpu_total_s=cpu_tot,
            cpu_us_per_exit=us_per,
            ru_maxrss_mib=maxrss,
            bpf_ns_per_exit=bpf_ns,
        )
        summary[v] = s
    out = [*lines, "", "Start-up, stop and cost detail (medians over rounds):", "", *details]
    out += method_lines(METHOD, opts)
    out.append(f"- Storm binary: {helpers.get('wr-storm')}.")
    if opts.bpf_stats:
        out.append(
            "- **in-kernel BPF ns / storm exit**: with kernel.bpf_stats_enabled=1, the "
            "run_time_ns of the tool's own programs (those loaded after it started) over "
            "the storm window, divided by the storm's exits (includes its fork "
            "programs where it has any). Turning stats on adds a little to every program."
        )
    bare = [r["work"]["exits_per_s"] for r in runs if r["variant"] == "bare" and "work" in r]
    if bare and statistics.median(bare) < 10000:
        out.append(
            f"\nNote: the bare storm ran at {statistics.median(bare):,.0f} exits/s, "
            "below the 10,000/s this benchmark is meant for."
        )
    return "\n".join(out) + "\n", summary


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    lineup = tool_setup(opts, "storm", ctx)
    runs = round_robin(opts, "storm", lineup.objs, lineup.active, StormWork, tmp, opts.rounds)
    text, summary = report(opts, runs, lineup.skipped, lineup.variants, ctx.helpers)
    return Section(text, {"summary": summary, "runs": runs, "skipped": lineup.skipped})


def _us_per_exit(r: Run) -> float | None:
    cpu = r.get("cpu_storm_s")
    return None if cpu is None else cpu / r["work"]["exits"] * 1e6
