"""Tier 3 (root, real kernel): one driver library seen through many overlay mounts (one per
container start of an image that carries it) is held for, probed and recorded once (issue 31
item 2).

Each overlay mount here is what a container runtime makes of an image layer holding the
stand-in libcuda.so.1: the same real file, a new st_dev per mount. The programs
(tests/gpu/fast.c) find it through LD_LIBRARY_PATH, one program per mount, one after the other.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.gpu import build
from tests.test_gpu_hold_root import MiB
from tracer.clock import boottime_ns
from tracer.events import Event, GpuAllocFailure, GpuCallFailure
from tracer.gpu.side import GpuSide

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(build.gcc() is None, reason="no C compiler (gcc) to build the stand-ins"),
]

MOUNTS = 6


def _overlay(tmp_path: Path, lower: Path, i: int) -> Path:
    up, work, merged = (tmp_path / f"{k}{i}" for k in ("up", "work", "ovl"))
    for d in (up, work, merged):
        d.mkdir()
    opts = f"lowerdir={lower},upperdir={up},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    return merged


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_one_library_in_many_overlay_mounts_is_probed_once_and_each_failure_recorded_once(
    tmp_path: Path,
) -> None:
    lower = tmp_path / "layer"
    lower.mkdir()
    build.libcuda(lower)
    program = build.fast(tmp_path, lower)
    mounts: list[Path] = []
    side = GpuSide(filter_all=False, memcg_v1=True, attach_host=False)
    try:
        assert side.describe()["hold"] == "ready", side.warnings
        assert side.hooks is not None
        for i in range(MOUNTS):
            mounts.append(_overlay(tmp_path, lower, i))
        assert len({os.stat(m / "libcuda.so.1").st_dev for m in mounts}) == MOUNTS
        # per program: its failing call's records (a refused allocation, or cuInit failing)
        records: dict[int, list[Event]] = {}
        fds: list[int] = []
        for i, merged in enumerate(mounts):
            go = tmp_path / f"go{i}"
            mode, want = ("fail", 2) if i % 2 == 0 else ("noinit", 3)
            env = {
                **os.environ,
                "LD_LIBRARY_PATH": str(merged),
                "FAKE_CUDA_BUDGET_BYTES": str(MiB),
                "FAKE_CUDA_INIT_RESULT": "100" if mode == "noinit" else "0",
            }
            script = f"while [ ! -e {go} ]; do sleep 0.01; done; exec {program} {mode}"
            proc = subprocess.Popen(["sh", "-c", script], env=env)
            side.watch([proc.pid])
            go.touch()
            events: list[Event] = []
            while proc.poll() is None:
                events += side.poll(boottime_ns())
                time.sleep(0.01)
            assert proc.returncode == want
            events += side.poll(boottime_ns())
            records[proc.pid] = [
                e
                for e in events
                if isinstance(e, GpuAllocFailure | GpuCallFailure) and e.pid == proc.pid
            ]
            fds.append(_fds())
        # every failing call caught, and recorded once (one set of uprobes on the real file)
        assert {pid: len(r) for pid, r in records.items()} == dict.fromkeys(records, 1)
        # no descriptor more after the first container's start: no second set of uprobes
        assert fds[1:] == fds[:1] * (MOUNTS - 1), fds
        # the first container's start held its program; none after it
        taken, *_ = side.hooks.hold_counts_now()
        assert taken == 1
    finally:
        side.close()
        for m in mounts:
            subprocess.run(["umount", str(m)], check=False)
