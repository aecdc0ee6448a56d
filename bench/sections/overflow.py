"""Section overflow: the ring buffer overflowed on purpose (the recorder SIGSTOPped during a
storm); every event it could not take must be counted in the trace (footer `lost`)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

from bench.options import ROOT, MiB, Options
from bench.procs import HelperFailed, key_values, kill_all, proc_status_kb, reap, say, spawn, tail
from bench.records import Run, Section
from bench.report import method_lines
from bench.runner import Context, count_output, start_tool, stop_tool
from bench.tools import Whyrestart
from bench.workloads import StormWork, memory_cgroup, parse_storm, remove_cgroup
from tracer.sources.cgroupfs import ChildCgroup


def ring_size() -> str:
    """The events ring buffer's size as bpf/whyrestart.bpf.c declares it."""
    try:
        src = (ROOT / "bpf" / "whyrestart.bpf.c").read_text()
    except OSError:
        return "?"
    m = re.search(r"BPF_MAP_TYPE_RINGBUF\);\s*__uint\(max_entries,\s*([^)]+)\)", src)
    if not m:
        return "?"
    expr = m.group(1).strip()
    try:
        size = 1
        for factor in expr.split("*"):
            size *= int(factor)
    except ValueError:
        return f"{expr} byte"
    return f"{size / MiB:g} MiB" if size % MiB == 0 else f"{size:,} byte"


def overflow_run(opts: Options, tmp: Path, mode: str) -> Run:
    """One storm with the recorder stopped in the middle (see METHOD)."""
    cg: ChildCgroup | None = None
    env: dict[str, str] | None = None
    targets: tuple[str, ...] = ("--all",)
    res: Run = {"mode": mode}
    try:
        if mode == "cgroup":
            cg = memory_cgroup(f"wr-bench-overflow-{os.getpid()}")
            cg.__enter__()
            env = {"WR_JOIN_CGROUP": os.path.join(cg.abs_path, "cgroup.procs")}
            targets = ("--cgroup", cg.path)
            res["cgroup"] = cg.path
        v = Whyrestart(opts, "overflow", targets)
        st = start_tool(opts, v, tmp, env)
        tool = st.tool
        if tool.poll() is not None or st.visible is None:
            raise HelperFailed(f"whyrestart did not start: {tail(tmp / 'tool.stderr')}")
        time.sleep(opts.settle)
        work = StormWork(seconds=opts.overflow_seconds, env=env)
        with open(tmp / "storm.out", "wb") as fo, open(tmp / "storm.err", "wb") as fe:
            storm = spawn(
                work.command(opts), stdout=fo, stderr=fe, env={**os.environ, **(env or {})}
            )
            time.sleep(opts.overflow_at)
            os.kill(tool.pid, signal.SIGSTOP)
            res["stopped_at_s"] = opts.overflow_at
            time.sleep(opts.overflow_stop)
            os.kill(tool.pid, signal.SIGCONT)
            rc, _, killed = reap(storm, opts.overflow_seconds + 120)
        if rc != 0 or killed:
            raise HelperFailed(f"the storm failed (rc {rc}): {tail(tmp / 'storm.err')}")
        res["work"] = parse_storm(key_values((tmp / "storm.out").read_text()))
        time.sleep(opts.drain)
        res["vmhwm_kb"] = proc_status_kb(tool.pid, "VmHWM")
        res.update(stop_tool(opts, tool))
        count_output(v, tmp, res)
        made = res["work"]["exits"]
        exits, own_exit = res["storm_exits_seen"], res["storm_self_exit_seen"]
        # (+1: the storm process's own exit, which can be lost too when the ring is still
        # full as the storm ends)
        if mode == "cgroup":
            # every storm child is one fork record and one exit record, nothing else in there
            res["expected"] = 2 * made + 1
            res["seen_events"] = exits + res["storm_forks_seen"] + own_exit
        else:
            res["expected"] = made + 1
            res["seen_events"] = exits + own_exit
        res["missing"] = res["expected"] - res["seen_events"]
        return res
    finally:
        kill_all()
        if cg is not None:
            remove_cgroup(cg)


METHOD = [
    "**how**: `whyrestart record` pinned to CPU {tool_cpu} is started and proven attached "
    "(markers, as in the storm section); then the unpaced fork/exit storm runs for "
    "{overflow_seconds:g} s on CPU {storm_cpu}, and {overflow_at:g} s into it the recorder gets "
    "SIGSTOP, and "
    "SIGCONT {overflow_stop:g} s later: meanwhile the kernel keeps filling the {ring} ring "
    "buffer until reservations fail. After the storm, {drain:g} s of drain, then SIGINT.",
    "**--all**: only exits are recorded (no fork records under --all). Events expected: the "
    "exits the storm counted, plus the storm process's own exit; seen: exit records with "
    "comm wr-storm; missing = expected - seen. "
    "`lost` (the footer's, which must equal the sum of the trace's `lost` records) also "
    "counts the events of every other process that ended or was signalled during the stop, "
    "which nothing can count from outside: so the check is missing <= lost, and the "
    "difference is other processes' events.",
    "**--cgroup**: the storm (and the markers) run in a child memory cgroup made for the run, "
    "and whyrestart records only that cgroup: each storm child is exactly one fork record and "
    "one exit record, and nothing else happens in there during the storm but the storm's own "
    "exit. The check is exact: seen + lost = expected (2 x exits made + 1).",
]


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    v = Whyrestart(opts, "overflow")
    if v.missing():
        return Section(f"## Ring-buffer overflow\n\nwhyrestart {v.missing()}\n", {"runs": []})
    ctx.versions.setdefault("whyrestart", v.version())
    runs = []
    for mode in ("all", "cgroup"):
        d = tmp / f"overflow-{mode}"
        d.mkdir()
        try:
            res = overflow_run(opts, d, mode)
        except Exception as exc:
            res = {"mode": mode, "error": repr(exc)}
        runs.append(res)
        say(
            f"overflow --{mode}: "
            + (
                f"made {res['work']['exits']:,}, seen {res['seen_events']:,}, lost {res['lost']:,}"
                if "error" not in res
                else f"FAILED {res['error'][:200]}"
            )
        )
        if not opts.keep_tmp:
            shutil.rmtree(d, ignore_errors=True)
    lines = [
        f"## Ring-buffer overflow on purpose (recorder SIGSTOPped {opts.overflow_stop:g} s "
        "mid-storm)",
        "",
        "| recording | storm children made | events expected | events seen | missing "
        "| lost (footer) | lost records sum | every lost event counted? | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in runs:
        label = "--all" if r["mode"] == "all" else "--cgroup (storm only)"
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error'][:100]} | | | | | | | |")
            continue
        lost, missing = r["lost"], r["missing"]
        if r["mode"] == "cgroup":
            ok = r["seen_events"] + lost == r["expected"]
            verdict = (
                "yes: seen + lost = expected"
                if ok
                else f"NO: seen + lost - expected = {r['seen_events'] + lost - r['expected']:+,}"
            )
        else:
            ok = missing <= lost
            verdict = (
                f"yes: missing <= lost ({lost - missing:,} lost events of other processes)"
                if ok
                else f"NO: {missing - lost:,} storm exits missing beyond `lost`"
            )
        consistent = r["lost_records_sum"] == lost
        notes = []
        if not r.get("footer"):
            notes.append("no footer")
        if not consistent:
            notes.append("footer lost != sum of lost records")
        if lost == 0:
            notes.append("the ring did not overflow: stop longer (--overflow-stop)")
        notes.extend(sorted(set(r.get("footer_warnings") or []))[:2])
        r["all_counted"] = ok and consistent
        lines.append(
            f"| {label} | {r['work']['exits']:,} | {r['expected']:,} | {r['seen_events']:,} "
            f"| {missing:,} | {lost:,} | {r['lost_records_sum']:,} | {verdict} "
            f"| {'; '.join(notes)} |"
        )
    lines += method_lines(METHOD, opts, ring=ring_size())
    return Section("\n".join(lines) + "\n", {"runs": runs})
