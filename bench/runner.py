"""One run of a variant under a workload (start, prove attached, measure, stop, count), and
the round-robin that runs every variant of a section once per round."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from bench.helpers import MARKER, MARKER_PREFIX
from bench.machine import bpf_progs, code_fingerprint
from bench.options import ROOT, SECTION_VARIANTS, Options
from bench.procs import (
    HelperFailed,
    Output,
    Popen,
    boottime_ns,
    kill_all,
    proc_cpu_s,
    proc_status_kb,
    reap,
    say,
    spawn,
    tail,
)
from bench.records import Run
from bench.report import fmt
from bench.tools import Bare, Markers, Variant, make_variant
from bench.workloads import Workload


@dataclass
class Context:
    """What the sections share: the helpers built, and the versions of the tools they ran."""

    helpers: dict[str, str]
    versions: dict[str, str] = field(default_factory=dict)


@dataclass
class Started:
    tool: Popen
    t_start: int  # boottime ns just before the tool was spawned
    visible: int | None  # boottime ns a marker showed in its output (None: never)
    marks: dict[int, tuple[int, int]]  # marker index -> (forked, reaped) boottime ns


def wait_visible(opts: Options, tool: Popen, path: Path, t_start: int) -> int | None:
    """Poll the tool's output file until a marker shows up; the boottime it did, or None."""
    offset = 0
    carry = b""
    deadline = t_start + int(opts.startup_cap * 1e9)
    needle = MARKER_PREFIX.encode()
    while boottime_ns() < deadline:
        if tool.poll() is not None:
            return None
        with contextlib.suppress(OSError), open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
            if data:
                offset += len(data)
                if needle in carry + data:
                    return boottime_ns()
                carry = data[-len(needle) :]
        time.sleep(0.005)
    return None


def start_tool(opts: Options, v: Variant, tmp: Path, env: dict[str, str] | None = None) -> Started:
    """Start the tool and the marker loop; return once a marker is visible in its output (or
    the start-up cap has passed, or the tool died). ``env`` goes to the marker loop."""
    with contextlib.ExitStack() as files:
        fo = files.enter_context(open(tmp / "tool.stdout", "wb"))
        fe = files.enter_context(open(tmp / "tool.stderr", "wb"))
        mo = files.enter_context(open(tmp / "marker.out", "wb"))
        t_start = boottime_ns()
        tool = spawn(["taskset", "-c", str(opts.tool_cpu), *v.command(tmp)], stdout=fo, stderr=fe)
        max_markers = int(opts.startup_cap * 1000 / opts.marker_ms) + 10
        marker = spawn(
            opts.pinned([str(MARKER), str(opts.marker_ms), str(max_markers), *v.marker_args]),
            stdout=mo,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        visible = wait_visible(opts, tool, v.events_file(tmp), t_start)
        with contextlib.suppress(ProcessLookupError):
            os.kill(marker.pid, signal.SIGTERM)
        reap(marker, 10)
    marks: dict[int, tuple[int, int]] = {}
    for line in (tmp / "marker.out").read_text().splitlines():
        i, a, b = (int(x) for x in line.split())
        marks[i] = (a, b)
    return Started(tool, t_start, visible, marks)


def first_event(st: Started, markers: Markers) -> Run:
    """Start-to-first-event from the markers the tool caught (see storm's METHOD)."""
    if not markers:
        return {}
    k = min(markers)
    reaped_k = st.marks.get(k, (0, 0))[1]
    # The tool saw marker k's exit but not marker k-1's: it became ready after marker k-1
    # was forked and before marker k's parent had reaped it.
    res: Run = {
        "first_marker": k,
        "start_to_first_event_s": (reaped_k - st.t_start) / 1e9 if reaped_k else None,
        "ready_lower_s": (st.marks[k - 1][0] - st.t_start) / 1e9 if k - 1 in st.marks else 0.0,
    }
    if markers[k]:
        res["first_marker_exit_ts_s"] = (markers[k] - st.t_start) / 1e9
    return res


def stop_tool(opts: Options, tool: Popen) -> Run:
    res: Run = {}
    t_stop = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(tool.pid, signal.SIGINT)
    rc, ru, killed = reap(tool, opts.stop_timeout)
    res["stop_s"] = time.monotonic() - t_stop
    res["tool_rc"] = rc
    res["tool_killed"] = killed
    if ru is not None:
        res["cpu_total_s"] = ru.ru_utime + ru.ru_stime
        res["ru_maxrss_kb"] = ru.ru_maxrss
    return res


def count_output(v: Variant, tmp: Path, res: Run, st: Started | None = None) -> None:
    """Add what the tool's output holds (and, given its start, start-to-first-event)."""
    counted, markers = v.count(tmp, res["work"])
    res.update(counted)
    res["stderr_tail"] = tail(tmp / "tool.stderr", 400)
    if st is not None:
        res.update(first_event(st, markers))


def run_one(opts: Options, v: Variant, rnd: int, tmp: Path, work: Workload) -> Run:
    res: Run = {"variant": v.name, "round": rnd}
    if isinstance(v, Bare):
        time.sleep(opts.settle)
        res["work"] = work.run(opts, tmp)
        return res

    res["code"] = str(code_fingerprint()["sha256"])
    before_ids = set(bpf_progs()) if opts.bpf_stats else set()
    st = start_tool(opts, v, tmp)
    tool = st.tool
    res["markers_started"] = len(st.marks)
    res["visible_s"] = (st.visible - st.t_start) / 1e9 if st.visible else None
    if tool.poll() is not None:
        rc, _, _ = reap(tool, 1)
        res["error"] = f"exited at start (rc {rc}): {tail(tmp / 'tool.stderr')}"
        return res
    if st.visible is None:
        res["note"] = f"no marker visible in the output within {opts.startup_cap}s"

    time.sleep(opts.settle)
    cpu0 = proc_cpu_s(tool.pid)
    progs0 = bpf_progs() if opts.bpf_stats else {}
    res["work"] = work.run(opts, tmp)
    time.sleep(opts.drain)  # let the tool catch up with what is still buffered
    cpu1 = proc_cpu_s(tool.pid)
    progs1 = bpf_progs() if opts.bpf_stats else {}
    res["vmhwm_kb"] = proc_status_kb(tool.pid, "VmHWM")
    res["vmrss_kb"] = proc_status_kb(tool.pid, "VmRSS")
    res["cpu_storm_s"] = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    res.update(stop_tool(opts, tool))
    if opts.bpf_stats:
        mine = set(progs1) - before_ids
        per: dict[str, dict[str, int]] = {}
        for pid_ in sorted(mine):
            a, b = progs0.get(pid_, {}), progs1[pid_]
            d_ns = int(b.get("run_time_ns", 0)) - int(a.get("run_time_ns", 0))
            d_cnt = int(b.get("run_cnt", 0)) - int(a.get("run_cnt", 0))
            if d_cnt:
                per[f"{b.get('name')}#{pid_}"] = {"run_ns": d_ns, "runs": d_cnt}
        res["bpf_progs"] = per
        res["bpf_ns_total"] = sum(x["run_ns"] for x in per.values())
    count_output(v, tmp, res, st)
    return res


def round_robin(
    opts: Options,
    section: str,
    objs: dict[str, Variant],
    active: list[str],
    make_work: Callable[[], Workload],
    tmp: Path,
    rounds: int,
    label: str = "",
) -> list[Run]:
    """Every active variant once per round, the order rotated each round."""
    runs: list[Run] = []
    total = rounds * len(active)
    n = 0
    for rnd in range(rounds):
        k = rnd % len(active) if active else 0
        for name in active[k:] + active[:k]:
            n += 1
            d = tmp / f"{section}{label}-r{rnd}-{name}"
            d.mkdir()
            work = make_work()
            try:
                res = run_one(opts, objs[name], rnd, d, work)
            except Exception as exc:  # a failed run is reported, the others go on
                res = {"variant": name, "round": rnd, "error": repr(exc)}
            finally:
                kill_all()
                work.cleanup()
            runs.append(res)
            w = res.get("work", {})
            msg = (
                f"{section}{label} [{n}/{total}] round {rnd + 1} {name}: "
                f"{w.get('per_s', 0):,.0f} {work.unit}"
            )
            if name != "bare" and "error" not in res:
                msg += (
                    f", seen {res.get('seen', 0):,}, lost {res.get('lost', 0)}, cpu "
                    f"{fmt(res.get('cpu_storm_s'), '.2f')} s, first event "
                    f"{fmt(res.get('start_to_first_event_s'), '.3f')} s, stop "
                    f"{fmt(res.get('stop_s'), '.2f')} s"
                )
            if "error" in res:
                msg += f" FAILED: {res['error'][:200]}"
            say(msg)
            if not opts.keep_tmp:
                shutil.rmtree(d, ignore_errors=True)
    return runs


@dataclass
class Lineup:
    """A section's variants: built, which run, which cannot (and why), in table order."""

    objs: dict[str, Variant]
    active: list[str]
    skipped: dict[str, str]
    variants: list[str]


def tool_setup(opts: Options, section: str, ctx: Context) -> Lineup:
    variants = [v for v in SECTION_VARIANTS[section] if not opts.only or v in opts.only]
    objs = {n: make_variant(n, section, opts) for n in variants}
    skipped = {n: why for n, o in objs.items() if (why := o.missing())}
    for n, why in skipped.items():
        say(f"{section}: {n}: {why}; reported as such")
    for n in variants:
        if n not in skipped and n != "bare":
            ctx.versions.setdefault(n, objs[n].version())
    return Lineup(objs, [n for n in variants if n not in skipped], skipped, variants)


class Timed(TypedDict):
    wall_s: float
    cpu_s: float | None
    maxrss_mib: float | None


def timed(cmd: list[str], tmp: Path, name: str, stdout: Output) -> Timed:
    """Run cmd to its end: wall time (monotonic, around spawn + wait4) and rusage."""
    with open(tmp / f"{name}.err", "wb") as fe:
        t0 = time.monotonic()
        p = spawn(cmd, stdout=stdout, stderr=fe)
        rc, ru, _ = reap(p, 3600)
        wall = time.monotonic() - t0
    if rc != 0:
        raise HelperFailed(f"{name} failed (rc {rc}): {tail(tmp / f'{name}.err')}")
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime if ru else None,
        "maxrss_mib": ru.ru_maxrss / 1024 if ru else None,
    }


def run_pyside(opts: Options, tmp: Path, *argv: str) -> Any:
    """`python -m bench.pyside ARGV` pinned to the workload CPU; its JSON result (the caller
    says which of bench.pyside's TypedDicts it is)."""
    cmd = opts.pinned([sys.executable, "-m", "bench.pyside", *argv])
    with open(tmp / "pyside.out", "wb") as fo, open(tmp / "pyside.err", "wb") as fe:
        p = spawn(cmd, stdout=fo, stderr=fe, cwd=str(ROOT))
        rc, _, _ = reap(p, 1800)
    if rc != 0:
        raise HelperFailed(f"pyside {argv[0]} failed (rc {rc}): {tail(tmp / 'pyside.err')}")
    return json.loads((tmp / "pyside.out").read_text())
