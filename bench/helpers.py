"""The C workloads (bench/c/*.c), compiled with gcc into build/bench/ at the start of each run,
and the Go one (bench/go/gobusy.go), built with Debian's golang when the agent section wants it."""

from __future__ import annotations

import os
import shutil
import subprocess

from bench.options import ROOT

SRC = ROOT / "bench" / "c"
BUILD = ROOT / "build" / "bench"
STORM = BUILD / "wr-storm"
MARKER = BUILD / "wr-marker"
SIGSTORM = BUILD / "wr-sigstorm"
RECLAIM = BUILD / "wr-reclaim"
FAIL = BUILD / "wr-fail"
SIGPROF = BUILD / "wr-sigprof"
GOBUSY = BUILD / "wr-gobusy"
STORM_COMM = "wr-storm"  # what every storm child's exit carries (children never exec)
FAIL_COMM = "wr-fail"  # the agent section's OOM victims and fatal-signal deaths
MARKER_PREFIX = "wrmk"  # marker children name themselves wrmk%05d


class BuildFailed(RuntimeError):
    pass


def build_helpers() -> dict[str, str]:
    """Compile every helper; their names -> "static" or "dynamic" (for the report)."""
    gcc = shutil.which("gcc")
    if not gcc:
        raise BuildFailed("gcc is needed to build the storm (apt-get install gcc)")
    BUILD.mkdir(parents=True, exist_ok=True)
    info: dict[str, str] = {}
    for src, out in (
        ("storm.c", STORM),
        ("marker.c", MARKER),
        ("sigstorm.c", SIGSTORM),
        ("reclaim.c", RECLAIM),
        ("fail.c", FAIL),
        ("sigprof.c", SIGPROF),
    ):
        base = [gcc, "-O2", "-Wall", "-Wextra", "-o", str(out), str(SRC / src)]
        # Static: no dynamic loader work in the children, and a higher storm rate.
        r = subprocess.run([*base[:2], "-static", *base[2:]], capture_output=True)
        static = r.returncode == 0
        if not static:
            r = subprocess.run(base, capture_output=True)
        if r.returncode != 0:
            raise BuildFailed(f"building {src} failed:\n{r.stderr.decode(errors='replace')}")
        info[out.name] = "static" if static else "dynamic"
    return info


def build_gobusy() -> str | None:
    """Build wr-gobusy; None when it is built, else why not (the phase that needs it says so)."""
    go = shutil.which("go")
    if not go:
        return "no Go toolchain (apt-get install golang; scripts/setup installs it)"
    BUILD.mkdir(parents=True, exist_ok=True)
    cache = BUILD / "gocache"  # (root's HOME may be unset or read-only: a cache of its own)
    env = {
        **os.environ,
        "GOCACHE": str(cache),
        "GOPATH": str(BUILD / "gopath"),
        "GO111MODULE": "off",
    }
    src = ROOT / "bench" / "go" / "gobusy.go"
    r = subprocess.run([go, "build", "-o", str(GOBUSY), str(src)], capture_output=True, env=env)
    if r.returncode != 0:
        return f"building gobusy.go failed: {r.stderr.decode(errors='replace')[-500:]}"
    return None
