"""Section gpuhold: the window in which a GPU program's first driver call could be missed.

A program that loads libcuda from a path nobody probed (LD_LIBRARY_PATH) and fails its first
allocation at once: the kernel holds it as it maps the library's code (its executable mmap),
until the recorder has probed the file (tracer/gpu/holds.py). Measured: how many such programs
had their one failure caught (of the runs), how many holds were taken and not taken, and how
long a held program waited (the footer's ``gpu_holds``: the time from its stop to its
SIGCONT). The stand-in driver and the program are the tests' (tests/gpu/fake_cuda.c,
tests/gpu/fast.c), built here.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.options import ROOT, Options
from bench.procs import HelperFailed, say, tail
from bench.records import Section
from bench.report import method_lines
from bench.runner import Context
from tracer.events import GpuAllocFailure
from tracer.trace.reader import TraceReader

GPU_SRC = ROOT / "tests" / "gpu"
BUDGET = 1 << 20  # the stand-in refuses fast.c's 2 MiB request


def _build(gcc: str, args: list[str]) -> None:
    r = subprocess.run([gcc, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise HelperFailed(f"gcc {' '.join(args[-3:])}: {r.stderr[-500:]}")


def _library(gcc: str, d: Path) -> Path:
    """A fresh stand-in libcuda.so.1 in ``d``: a new inode, so nothing has probed it yet."""
    d.mkdir(parents=True, exist_ok=True)
    src = str(GPU_SRC / "fake_cuda.c")
    _build(gcc, ["-shared", "-fPIC", "-O2", "-fno-ipa-icf", "-o", str(d / "libcuda.so.1"), src])
    return d


def _record(opts: Options, tmp: Path, name: str, libdir: Path, *cmd: str) -> dict[str, Any]:
    trace = tmp / f"{name}.trace"
    env = {**os.environ, "LD_LIBRARY_PATH": str(libdir), "FAKE_CUDA_BUDGET_BYTES": str(BUDGET)}
    with open(tmp / f"{name}.err", "wb") as err:
        r = subprocess.run(
            [opts.whyrestart_exe(), "record", "-q", "--force", "-o", str(trace), "--", *cmd],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=300,
            check=False,
        )
    reader = TraceReader(str(trace))
    fails = {e.pid for e in reader if isinstance(e, GpuAllocFailure)}
    footer = reader.footer
    if footer is None or "gpu_holds" not in footer.extra:
        raise HelperFailed(
            f"{name}: no footer with gpu_holds (rc {r.returncode}): {tail(tmp / f'{name}.err')}"
        )
    return {
        "rc": r.returncode,
        "caught": len(fails),
        "holds": footer.extra["gpu_holds"],
        "lost": footer.lost,
    }


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    gcc = shutil.which("gcc")
    if not gcc:
        raise HelperFailed("gcc is needed to build the stand-in driver (apt-get install gcc)")
    first = _library(gcc, tmp / "lib0")
    fast = tmp / "fast"
    _build(
        gcc, ["-O1", "-o", str(fast), str(GPU_SRC / "fast.c"), "-L", str(first), "-l:libcuda.so.1"]
    )
    runs = []
    for i in range(opts.gpuhold_runs):
        libdir = first if i == 0 else _library(gcc, tmp / f"lib{i}")
        r = _record(opts, tmp, f"one{i}", libdir, str(fast), "fail")
        runs.append(r)
        say(
            f"gpuhold: run {i + 1}/{opts.gpuhold_runs}: caught {r['caught']}, "
            f"hold {r['holds']['max_ms']} ms"
        )
    storm = _record(
        opts,
        tmp,
        "storm",
        _library(gcc, tmp / "lib-storm"),
        str(fast),
        "storm",
        str(opts.gpuhold_storm),
    )
    waits = [r["holds"]["max_ms"] for r in runs if r["holds"]["resumed_by_recorder"]]
    caught = sum(min(r["caught"], 1) for r in runs)
    lines = [
        "## GPU: a program's first driver call, with libcuda from an unprobed path",
        "",
        "| what | programs | failures caught | holds taken | not taken | lost | "
        "held ms, median | held ms, max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| one program, fails at once, exits 2 ({len(runs)} recordings) | {len(runs)} | "
        f"{caught} | {sum(r['holds']['taken'] for r in runs)} | "
        f"{sum(r['holds']['not_taken'] for r in runs)} | {sum(r['lost'] for r in runs)} | "
        f"{statistics.median(waits) if waits else 0:.1f} | {max(waits, default=0):.1f} |",
        f"| fork storm of {opts.gpuhold_storm} such programs (one recording) | "
        f"{opts.gpuhold_storm} | {storm['caught']} | {storm['holds']['taken']} | "
        f"{storm['holds']['not_taken']} | {storm['lost']} | "
        f"{storm['holds']['mean_ms']:.1f} (mean) | {storm['holds']['max_ms']:.1f} |",
    ]
    lines += method_lines(
        [
            "Each recording is `whyrestart record -q -o T -- fast fail` with LD_LIBRARY_PATH "
            "pointing at a stand-in libcuda.so.1 built afresh for it (tests/gpu/fake_cuda.c, a "
            "new inode: nothing has probed it), FAKE_CUDA_BUDGET_BYTES={budget}; `fast` "
            "(tests/gpu/fast.c) is linked against it, calls cuInit and one 2 MiB cuMemAlloc_v2 "
            "at once, and exits 2 when it is refused, waiting for nothing.",
            "failures caught: recordings whose trace holds the program's gpu_alloc_fail "
            "(storm: distinct pids with one). holds taken / not taken / held ms: the "
            "footer's gpu_holds (a hold lasts from the kernel's SIGSTOP at the executable "
            "mmap's return to the recorder's SIGCONT once the file is probed; the storm's "
            "first program is held, and those loading the file while it is held; later ones "
            "find it probed). "
            "lost: the footer's lost records.",
            "The storm: `fast storm {gpuhold_storm}` starts {gpuhold_storm} copies of itself in "
            "`fail` mode at once "
            "(fork + exec), each with the same fresh library.",
        ],
        opts,
        budget=BUDGET,
    )
    data = {"runs": runs, "storm": storm}
    return Section("\n".join(lines) + "\n", data)
