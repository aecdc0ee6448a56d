"""Section soak: `whyrestart record --all` under a paced storm for --soak-seconds, its RSS
every second (flat?), loss and CPU."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from bench.options import Options
from bench.procs import (
    HelperFailed,
    key_values,
    kill_all,
    proc_cpu_s,
    proc_status_kb,
    reap,
    say,
    spawn,
    tail,
)
from bench.records import Run, Section
from bench.report import method_lines, rss_growth
from bench.runner import Context, count_output, start_tool, stop_tool
from bench.tools import Whyrestart
from bench.workloads import StormWork, parse_storm


def soak_run(opts: Options, tmp: Path, codes: str) -> Run:
    """One soak: the recorder's RSS and CPU every second under a paced storm."""
    v = Whyrestart(opts, "soak")
    res: Run = {"codes": codes}
    try:
        st = start_tool(opts, v, tmp)
        tool = st.tool
        if tool.poll() is not None or st.visible is None:
            raise HelperFailed(f"whyrestart did not start: {tail(tmp / 'tool.stderr')}")
        res["start_rss_kb"] = proc_status_kb(tool.pid, "VmRSS")
        time.sleep(opts.settle)
        work = StormWork(seconds=opts.soak_seconds, batch=10, rate=opts.soak_rate, codes=codes)
        samples: list[tuple[float, int | None, float | None]] = []  # (s, VmRSS kB, CPU s)

        def sample() -> None:
            pid = tool.pid
            samples.append((time.monotonic() - t0, proc_status_kb(pid, "VmRSS"), proc_cpu_s(pid)))

        with open(tmp / "storm.out", "wb") as fo, open(tmp / "storm.err", "wb") as fe:
            t0 = time.monotonic()
            storm = spawn(work.command(opts), stdout=fo, stderr=fe)
            k = 0
            while storm.poll() is None:
                sample()
                k += 1
                time.sleep(max(0.0, t0 + k - time.monotonic()))
            rc, _, killed = reap(storm, 60)
        if rc != 0 or killed:
            raise HelperFailed(f"the storm failed (rc {rc}): {tail(tmp / 'storm.err')}")
        res["work"] = parse_storm(key_values((tmp / "storm.out").read_text()))
        time.sleep(opts.drain)
        sample()
        res["vmhwm_kb"] = proc_status_kb(tool.pid, "VmHWM")
        res.update(stop_tool(opts, tool))
        count_output(v, tmp, res)
        res["samples"] = samples
    except Exception as exc:
        res["error"] = repr(exc)
        return res
    finally:
        kill_all()
    rss = [(t, kb / 1024) for t, kb, _ in samples if kb]
    cpus = [c for _, _, c in samples if c is not None]
    res.update(rss_growth(rss))
    res["tracer_cpu_pct"] = (cpus[-1] - cpus[0]) / (samples[-1][0] - samples[0][0]) * 100
    return res


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    v = Whyrestart(opts, "soak")
    if v.missing():
        return Section(f"## Tracer RSS soak\n\nwhyrestart {v.missing()}\n")
    ctx.versions.setdefault("whyrestart", v.version())
    runs: list[Run] = []
    for codes in [c for c in ("mixed", "zero") if c in opts.soak_exits.split(",")]:
        d = tmp / f"soak-{codes}"
        d.mkdir()
        r = soak_run(opts, d, codes)
        runs.append(r)
        if "error" in r:
            say(f"soak ({codes}): FAILED {r['error'][:200]}")
        else:
            say(
                f"soak ({codes}): RSS {r['rss_first_mib']:.1f} -> {r['rss_last_mib']:.1f} MiB, "
                f"seen {r['seen']:,}/{r['work']['exits']:,}, lost {r['lost']}"
            )
        if not opts.keep_tmp:
            shutil.rmtree(d, ignore_errors=True)
    lines = [
        f"## Tracer RSS steady state (soak: {opts.soak_seconds:g} s at "
        f"{opts.soak_rate:,.0f} exits/s each)",
        "",
        "| storm children exit | exits made | seen | lost | RSS first MB | RSS at 25% MB "
        "| RSS last MB | RSS max MB | growth 25%->end MB | slope 2nd half MB/min | flat? "
        "| <= 50 MB? | tracer CPU % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in runs:
        label = "with status 0" if r["codes"] == "zero" else "with status i & 0xff (failures)"
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error'][:200]} |" + " |" * 11)
            continue
        lines.append(
            f"| {label} | {r['work']['exits']:,} | {r['seen']:,} | {r['lost']:,} "
            f"| {r['rss_first_mib']:.1f} | {r['rss_25pct_mib']:.1f} | {r['rss_last_mib']:.1f} "
            f"| {r['rss_max_mib']:.1f} | {r['growth_25pct_to_end_mib']:+.1f} "
            f"| {r['slope_second_half_mib_per_min']:+.2f} | {'yes' if r['flat'] else 'NO'} "
            f"| {'yes' if r['rss_max_mib'] <= 50 else 'NO'} | {r['tracer_cpu_pct']:.1f} |"
        )
    lines += method_lines(
        [
            "`whyrestart record --all` pinned to CPU {tool_cpu}, proven attached with markers "
            "(start-to-first-event against bpftrace and exitsnoop is in the storm section); then "
            "build/bench/wr-storm paced at {soak_rate:,.0f} exits/s (batches of 10, sleeping to an "
            "absolute schedule) on CPU {storm_cpu} for {soak_seconds:g} s, with the storm's usual "
            "exit codes (i & 0xff: 255 in 256 are failures, whose verdicts it keeps up to its "
            "cap) and, with --soak-exits zero, children that exit 0. The recorder's VmRSS "
            "(/proc/PID/status) is read every second from the storm's start, and once more "
            "after {drain:g} s of drain. **first**: the first sample; **at 25%**: the sample "
            "a quarter of the way in (after warm-up); "
            "**growth**: last minus that; **slope**: least-squares over the second half, "
            "per minute. **flat** = |growth| <= 2 MB and |slope| <= 1 MB/min. **seen**: exit "
            "records with comm wr-storm; **tracer CPU %**: its utime+stime over the sampled "
            "span. Samples are in --json.",
        ],
        opts,
    )
    return Section("\n".join(lines) + "\n", {"runs": runs})
