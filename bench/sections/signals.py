"""Section signals: a SIGUSR1 ping-pong storm bare and under each tracer, then paced at
--sig-rate for loss."""

from __future__ import annotations

from pathlib import Path

from bench.options import Options
from bench.records import Run, Section, Summary
from bench.report import (
    fmt,
    med,
    method_lines,
    ok_runs,
    slow_str,
    slowdown,
    tool_notes,
    usable_variants,
    vmhwm_mib,
)
from bench.runner import Context, round_robin, tool_setup
from bench.tools import BPFTRACE_SIG_PROG
from bench.workloads import SigWork

METHOD = [
    "**signals/s**: build/bench/wr-sigstorm, pinned to CPU {storm_cpu} with its child: it "
    "sends SIGUSR1 to a child that handles it and waits for the child's one-byte ack on a pipe "
    "before the next (a ping-pong, so every signal is delivered, none merged into one already "
    "pending); completed round trips divided by wall time over {seconds:g} s; median over "
    "rounds. Every kill(2) is exactly one signal/signal_generate hit from the storm to the "
    "child with sig 10. The child handles SIGUSR1, so it can neither end it nor explain its "
    "end: whyrestart counts each one in the kernel instead of recording it (the footer's "
    "signals_unsent, less one ignored SIGUSR1 per marker seen).",
    "**slowdown**: per round, bare signals/s over the variant's, same round; median.",
    "**events seen / sent**: signal events with sig 10 from the storm's pid to its child's pid "
    "in the tool's output (whyrestart: trace records t=signal plus the SIGUSR1s counted; "
    "bpftrace one-liner "
    "`{bpftrace_sig}`; sigsnoop: its PID, SIG and TPID columns), against the storm's count of "
    "successful kill(2) calls; summed over rounds.",
    "**lost**, **tracer CPU s**, **peak RSS MB**: as in the storm section (tracer CPU over the "
    "storm plus {drain:g} s of drain; VmHWM before SIGINT); **workload CPU us / signal**: "
    "user+system time of the storm and its child (getrusage) per signal sent, which includes "
    "the in-kernel cost of the tracer's BPF program; medians.",
    "**paced at {sig_rate:,.0f}/s**: the same storm sleeping on an absolute schedule "
    "(every 1 ms worth of signals) for {seconds:g} s, one run per variant after the rounds: "
    "can the tool keep up with a sustained rate it is expected to handle, and at what CPU "
    "cost to the workload (us/signal, vs bare in the same table). Markers for the start-up "
    "check are children that send themselves an ignored SIGUSR1 (their comm is the sender's).",
]


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    lineup = tool_setup(opts, "signals", ctx)
    objs, active, skipped, variants = lineup.objs, lineup.active, lineup.skipped, lineup.variants
    runs = round_robin(opts, "signals", objs, active, SigWork, tmp, opts.rounds)
    paced: list[Run] = []
    if opts.sig_rate > 0:
        paced = round_robin(
            opts, "signals", objs, active, lambda: SigWork(opts.sig_rate), tmp, 1, "-paced"
        )
    lines = [
        f"## Signal storm (SIGUSR1 ping-pong), {opts.rounds} round(s) x {opts.seconds:g} s",
        "",
        "| variant | signals/s | slowdown | events seen / sent | lost | tracer CPU s "
        "| peak RSS MB | workload CPU us / signal | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    summary: dict[str, Summary] = {}
    for v, ok, errs in usable_variants(variants, runs, skipped, lines, summary, 9):
        s = sig_summary(runs, ok)
        summary[v] = s
        us = fmt(s["workload_cpu_us_per_signal"], ".2f")
        if v == "bare":
            lines.append(f"| bare | {s['per_s']:,.0f} | 1.00x | - | - | - | - | {us} | |")
            continue
        lines.append(
            f"| {v} | {s['per_s']:,.0f} | {slow_str(s['slowdown'])} | {s['seen']:,} / "
            f"{s['sent']:,} ({s['seen_pct']:.2f}%) | {s['lost']:,} "
            f"| {fmt(s['cpu_storm_s'], '.2f')} | {fmt(s['vmhwm_mib'], '.1f')} | {us} "
            f"| {tool_notes(opts, v, ok, errs)} |"
        )
    if paced:
        lines += [
            "",
            f"Paced at {opts.sig_rate:,.0f} signals/s, {opts.seconds:g} s, one run each:",
            "",
            "| variant | signals/s achieved | events seen / sent | lost "
            "| tracer CPU s | workload CPU us / signal | notes |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for v in variants:
            if v in skipped:
                continue
            ok, errs = ok_runs(paced, v)
            if not ok:
                lines.append(f"| {v} | failed: {(errs or ['no run'])[0][:80]} | | | | | |")
                continue
            s = sig_summary(paced, ok)
            summary[v]["paced"] = s
            us = fmt(s["workload_cpu_us_per_signal"], ".2f")
            if v == "bare":
                lines.append(f"| bare | {s['per_s']:,.0f} | - | - | - | {us} | |")
                continue
            lines.append(
                f"| {v} | {s['per_s']:,.0f} | {s['seen']:,} / {s['sent']:,} "
                f"({s['seen_pct']:.2f}%) | {s['lost']:,} | {fmt(s['cpu_storm_s'], '.2f')} "
                f"| {us} | {tool_notes(opts, v, ok, errs)} |"
            )
    lines += method_lines(METHOD, opts, bpftrace_sig=BPFTRACE_SIG_PROG)
    return Section(
        "\n".join(lines) + "\n",
        {
            "summary": summary,
            "runs": runs,
            "paced_runs": paced,
            "skipped": skipped,
        },
    )


def sig_summary(runs: list[Run], ok: list[Run]) -> Summary:
    sent = sum(r["work"]["sent"] for r in ok)
    seen = sum(r.get("seen", 0) for r in ok)
    return {
        "runs": len(ok),
        "per_s": med([r["work"]["per_s"] for r in ok]),
        "slowdown": slowdown(runs, ok),
        "sent": sent,
        "seen": seen,
        "seen_pct": seen / sent * 100 if sent else 0.0,
        "lost": sum(r.get("lost", 0) for r in ok),
        "cpu_storm_s": med([r.get("cpu_storm_s") for r in ok]),
        "vmhwm_mib": med([vmhwm_mib(r) for r in ok]),
        "workload_cpu_us_per_signal": med(
            [r["work"]["cpu_s"] / r["work"]["sent"] * 1e6 for r in ok if r["work"]["sent"]]
        ),
    }
