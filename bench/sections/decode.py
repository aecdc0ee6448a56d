"""Section decode: batched decode throughput of synthetic ring-buffer exit records."""

from __future__ import annotations

from pathlib import Path

from bench.options import Options
from bench.records import DecodeResult, Section
from bench.report import method_lines
from bench.runner import Context, run_pyside


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    r: DecodeResult = run_pyside(
        opts, tmp, "decode", str(opts.decode_records), str(opts.decode_repeat)
    )
    target = 500_000
    best = r["events_per_s_best"]
    lines = [
        "## Decode throughput (batched, Python)",
        "",
        "| records | bytes each | best events/s | median events/s | target | met? |",
        "|---:|---:|---:|---:|---:|---|",
        f"| {r['records']:,} | {r['record_bytes']} | {best:,.0f} | "
        f"{r['events_per_s_median']:,.0f} | >= {target:,} | "
        f"{'yes' if best >= target else 'no'} |",
    ]
    lines += method_lines(
        [
            "`tracer.bpf.decode.Decoder().decode_batch(raws)` on a list of {n:,} distinct "
            "`bytes` objects, each a `struct wr_exit` record built with the ctypes mirror in "
            "`tracer.bpf.layout` (what the ring-buffer callback hands over: varied pids, comms, "
            "cgroups, exit codes), timed with perf_counter, {rep} repetitions, a fresh Decoder "
            "each; best and median. One process of the virtualenv's python "
            "({py}), pinned to CPU {storm_cpu}. This is decoding only: not the ring-buffer "
            "callback that copies each record out of the ring, nor what follows decoding.",
        ],
        opts,
        n=r["records"],
        rep=r["repeat"],
        py=r["python"],
    )
    return Section("\n".join(lines) + "\n", {"result": r})
