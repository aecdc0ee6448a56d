"""Section replay: a synthetic 1,000,000-event trace read by TraceReader alone, by `whyrestart
replay --verdicts-only`, and by `jq -c .`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NotRequired, TypedDict

from bench.options import MiB, Options
from bench.procs import say
from bench.records import GenResult, ReadResult, Section
from bench.report import fmt, median_run, method_lines
from bench.runner import Context, Timed, run_pyside, timed


class Row(TypedDict):
    what: str
    seconds: float
    cpu_s: float | None
    maxrss_mib: float | None
    events_per_s: float
    events_per_s_ex_startup: NotRequired[float]


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    exe = opts.whyrestart_exe()
    trace = tmp / "synthetic.trace"
    gen: GenResult = run_pyside(opts, tmp, "gen", str(trace), str(opts.replay_events), "1")
    n = gen["events"]
    say(f"replay: wrote {n:,} events ({gen['bytes'] / MiB:.0f} MiB) in {gen['write_s']:.1f} s")
    # warm the page cache for everyone alike
    with open(trace, "rb") as f:
        while f.read(MiB):
            pass
    # each reader runs --rounds times, alternating, and the median run is reported: on a VM
    # whose speed drifts, one run each would compare moments, not readers
    rounds = max(1, opts.rounds)
    jq = shutil.which("jq")
    reads: list[ReadResult] = []
    reps: list[Timed] = []
    jqs: list[Timed] = []
    startup = timed(opts.pinned([exe, "--version"]), tmp, "startup", subprocess.DEVNULL)
    for i in range(rounds):
        reads.append(run_pyside(opts, tmp, "read", str(trace)))
        with open(tmp / "verdicts.txt", "wb") as out:
            reps.append(
                timed(
                    opts.pinned([exe, "replay", "--verdicts-only", str(trace)]),
                    tmp,
                    "replay",
                    out,
                )
            )
        if jq:
            jqs.append(
                timed(opts.pinned([jq, "-c", ".", str(trace)]), tmp, "jq", subprocess.DEVNULL)
            )
        say(
            f"replay [{i + 1}/{rounds}]: TraceReader {reads[-1]['events_per_s']:,.0f}, "
            f"whyrestart replay {n / reps[-1]['wall_s']:,.0f}"
            + (f", jq {n / jqs[-1]['wall_s']:,.0f}" if jqs else "")
            + " events/s"
        )
    read = median_run(reads, lambda r: r["seconds"])
    rep = median_run(reps, lambda r: r["wall_s"])
    rows: list[Row] = [
        {
            "what": "(a) TraceReader iteration alone",
            "seconds": read["seconds"],
            "cpu_s": None,
            "maxrss_mib": read["maxrss_mib"],
            "events_per_s": read["events_per_s"],
        }
    ]
    with open(tmp / "verdicts.txt", "rb") as f:
        verdict_lines = sum(1 for _ in f)
    rows.append(
        {
            "what": "(b) `whyrestart replay --verdicts-only` (reading + full analysis + "
            f"verdict table, {verdict_lines:,} lines)",
            "seconds": rep["wall_s"],
            "cpu_s": rep["cpu_s"],
            "maxrss_mib": rep["maxrss_mib"],
            "events_per_s": n / rep["wall_s"],
            "events_per_s_ex_startup": n / max(rep["wall_s"] - startup["wall_s"], 1e-9),
        }
    )
    if jqs:
        j = median_run(jqs, lambda r: r["wall_s"])
        ver = subprocess.run([jq or "jq", "--version"], capture_output=True, text=True).stdout
        ctx.versions.setdefault("jq", ver.strip())
        rows.append(
            {
                "what": f"(c) `jq -c . FILE > /dev/null` ({ver.strip()})",
                "seconds": j["wall_s"],
                "cpu_s": j["cpu_s"],
                "maxrss_mib": j["maxrss_mib"],
                "events_per_s": n / j["wall_s"],
            }
        )
    target = 300_000
    lines = [
        f"## Replay throughput ({n:,}-event synthetic trace, {gen['bytes'] / MiB:.0f} MiB)",
        "",
        "| what | seconds | events/s | CPU s | peak RSS MB | >= 300,000/s? |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        eps = r["events_per_s"]
        extra = ""
        if "events_per_s_ex_startup" in r:
            extra = (
                f" ({r['events_per_s_ex_startup']:,.0f} without the "
                f"{startup['wall_s']:.2f} s start-up)"
            )
        lines.append(
            f"| {r['what']} | {r['seconds']:.2f} | {eps:,.0f}{extra} | {fmt(r['cpu_s'], '.2f')} "
            f"| {fmt(r['maxrss_mib'], '.0f')} | {'yes' if eps >= target else 'no'} |"
        )
    if not jq:
        lines.append("| (c) `jq -c .` | jq not installed | | | | |")
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(gen["kinds"].items(), key=lambda x: -x[1]))
    lines += method_lines(
        [
            "**trace**: written by `python -m bench.pyside gen` with "
            "`tracer.trace.writer.TraceWriter` (plain JSON lines, header and footer): 24 "
            "services (systemd-unit cgroups), each a long-lived main process starting "
            "short-lived children (fork, exec for 60%, exit; 8% get SIGTERM or SIGKILL from the "
            "parent first and exit by it; 7% exit 1), samples of the host, 6 cgroups and 4 "
            "processes every 100 ms of trace time and a reclaim summary a second, at 20,000 "
            "events per trace second. Kinds: {kinds}. Writing it took {write:.1f} s "
            "({wps:,.0f} events/s).",
            "Each reader ran {rounds} time(s), the three alternating, pinned to CPU {storm_cpu}, "
            "after "
            "the file was read once to put it in the page cache; the median run of each is "
            "shown. **seconds**: wall time from spawn to wait4 (for (a) the "
            "iteration only, timed inside the process); CPU s and peak RSS from wait4's rusage. "
            "(b) is the whole command, including Python start-up and imports "
            "(`whyrestart --version` takes {startup:.2f} s here) and writing the verdict table "
            "to a file. (c) parses and re-serialises every line: no analysis at all.",
        ],
        opts,
        kinds=kinds,
        write=gen["write_s"],
        wps=gen["write_events_per_s"],
        startup=startup["wall_s"],
        rounds=rounds,
    )
    if not opts.keep_tmp:
        trace.unlink(missing_ok=True)
    return Section(
        "\n".join(lines) + "\n",
        {
            "gen": gen,
            "rows": rows,
            "startup": startup,
            "runs": {"read": reads, "replay": reps, "jq": jqs},
        },
    )
