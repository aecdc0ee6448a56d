"""main: check the machine, build the helpers, run the sections asked for, print the report."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from bench.helpers import BuildFailed, build_helpers
from bench.machine import (
    code_fingerprint,
    cpu_snapshot,
    foreign_cpu,
    foreign_tracers,
    machine_note,
    machine_text,
)
from bench.options import WHYRESTART_ONLY, Options, parse_args
from bench.procs import kill_all, loadavg, say
from bench.records import Section
from bench.runner import Context
from bench.sections import RUNS


def _refusal(opts: Options) -> str | None:
    """Why the bench cannot run here, or None."""
    if os.geteuid() != 0:
        return "scripts/bench must run as root: the tracers load BPF programs (sudo scripts/bench)"
    ncpu = os.cpu_count() or 1
    if max(opts.tool_cpu, opts.storm_cpu) >= ncpu or opts.tool_cpu == opts.storm_cpu:
        return (
            f"scripts/bench: needs two distinct CPUs (--tool-cpu {opts.tool_cpu}, --storm-cpu "
            f"{opts.storm_cpu}, nproc {ncpu})"
        )
    if not shutil.which("taskset"):
        return "scripts/bench: taskset is needed (util-linux)"
    return None


def _run_section(opts: Options, name: str, tmp: Path, ctx: Context) -> Section:
    if name in WHYRESTART_ONLY and opts.only and "whyrestart" not in opts.only:
        return Section(f"## {name}\n\nskipped: whyrestart not in --only\n")
    try:
        return RUNS[name](opts, tmp, ctx)
    except Exception as exc:  # a failed section is reported, the others go on
        return Section(f"## {name}\n\nfailed: {exc!r}\n", {"error": repr(exc)})
    finally:
        kill_all()


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    refusal = _refusal(opts)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2

    def on_term(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    # Also when started in the background by a script, where SIGINT comes in ignored (and the
    # tools would inherit that): Ctrl-C or kill -INT stops the bench and everything it started.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    tmp = Path(tempfile.mkdtemp(prefix="wr-bench-"))
    stats_prev = None
    t0 = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    texts: dict[str, str] = {}
    timings: dict[str, float] = {}
    try:
        try:
            helpers = build_helpers()
        except BuildFailed as exc:
            print(f"scripts/bench: {exc}", file=sys.stderr)
            return 2
        foreign_progs, foreign_procs = foreign_tracers()
        machine = machine_note(helpers, foreign_progs, foreign_procs)
        machine["code_at_start"] = code_fingerprint()
        ctx = Context(helpers)
        machine["versions"] = ctx.versions
        if foreign_procs:
            say("other tracers are running (they slow every variant, bare included):")
            for p in foreign_procs:
                say(f"  {p}")
        say(f"load average at start: {loadavg()}; sections: {', '.join(opts.sections)}")
        if opts.bpf_stats:
            stats_prev = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
            Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
        # The bench only waits and counts; keep it off the tracer's CPU.
        os.sched_setaffinity(0, {opts.storm_cpu})
        for name in opts.sections:
            d = tmp / name
            d.mkdir()
            ts = time.monotonic()
            la = loadavg()
            cpu0 = cpu_snapshot()
            section = _run_section(opts, name, d, ctx)
            timings[name] = time.monotonic() - ts
            texts[name] = section.text
            results[name] = {
                "text": section.text,
                **section.data,
                "loadavg_before": la,
                "foreign_cpu": foreign_cpu(cpu0),
            }
            say(
                f"{name}: done in {timings[name]:.0f} s (load average before: {la}; CPU not "
                f"ours: {results[name]['foreign_cpu']['other_s']:.1f} s)"
            )
        elapsed = time.monotonic() - t0
        machine["code_at_end"] = code_fingerprint()
        with contextlib.suppress(OSError):
            machine["loadavg_at_end"] = Path("/proc/loadavg").read_text().strip()
        title = "# whyrestart benchmark: " + ", ".join(opts.sections)
        text = "\n".join([title, "", *(texts[n] for n in opts.sections)])
        loads = {n: results[n]["loadavg_before"] for n in opts.sections}
        foreign = {n: results[n]["foreign_cpu"] for n in opts.sections}
        text += "\n" + machine_text(opts, machine, elapsed, timings, loads, foreign)
        sys.stdout.write(text)
        sys.stdout.flush()
        if opts.json_path:
            doc = {
                "schema": 2,
                "config": vars(opts),
                "machine": machine,
                "sections": results,
                "timings_s": timings,
                "elapsed_s": elapsed,
            }
            Path(opts.json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
            say(f"raw numbers written to {opts.json_path}")
        return 0
    finally:
        kill_all()
        if stats_prev is not None:
            with contextlib.suppress(OSError):
                Path("/proc/sys/kernel/bpf_stats_enabled").write_text(stats_prev)
        if opts.keep_tmp:
            say(f"temp files kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run() -> int:
    """main, with Ctrl-C reported as such (main's finally has killed the tools and removed
    the temp dir by then)."""
    try:
        return main()
    except KeyboardInterrupt:
        say("interrupted: every process it started is killed, temp files removed")
        return 130
