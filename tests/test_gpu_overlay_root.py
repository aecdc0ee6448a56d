"""Tier 3 (root, real kernel): one driver library seen through many overlay mounts (one per
container start of an image that carries it) is held for, probed and recorded once (issue 31
item 2).

Each overlay mount here is what a container runtime makes of an image layer holding the
stand-in libcuda.so.1: the same real file, a new st_dev per mount. The programs
(tests/gpu/fast.c) find it through LD_LIBRARY_PATH, one program per mount, one after the other.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests import podmanimg
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
            # (lazily where still busy: a failed run may leave a uprobe on the path)
            if subprocess.run(["umount", str(m)], check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(m)], check=False)


PODMAN_STARTS = 5
PROGRAM = "wrguard-prog"  # its comm tells its records from any other process's on the host


def test_container_starts_of_an_image_with_libcuda_cost_no_descriptor_and_one_record_each(
    tmp_path: Path,
) -> None:
    """As the agent sees them (every process watched): each start is a new overlay mount of
    the image's layer; one set of uprobes for its libcuda, each cuInit failure recorded once."""
    image = f"localhost/guard-cuda-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "rootfs"
    root.mkdir()
    with podmanimg.busybox_image(
        root, image, ("sh",), prepare=lambda: build.cuda_rootfs(root, tmp_path, PROGRAM)
    ):
        side = GpuSide(filter_all=True, memcg_v1=True, attach_host=False)
        events: list[Event] = []
        stop = threading.Event()

        def loop() -> None:  # the recorder's loop: resumes holds while podman runs
            while not stop.is_set():
                events.extend(side.poll(boottime_ns()))
                time.sleep(0.01)

        poller = threading.Thread(target=loop)
        poller.start()
        fds: list[tuple[int, int]] = []  # (descriptors, library files known) after each
        try:
            for _ in range(PODMAN_STARTS):
                r = podmanimg.run_failing_cuinit(image, PROGRAM)
                assert r.returncode == 3, r.stderr  # cuInit failed: CUDA_ERROR_NO_DEVICE
                time.sleep(0.1)  # its record drained
                fds.append((_fds(), len(side.libraries.probed)))
        finally:
            stop.set()
            poller.join()
            side.close()
        calls = [e for e in events if isinstance(e, GpuCallFailure) and e.comm == PROGRAM]
        assert len(calls) == PODMAN_STARTS
        assert len({e.pid for e in calls}) == PODMAN_STARTS
        # one library file attached for all the starts (old: one per start) ...
        ours = [lib for lib in side.libraries.probed.values() if lib.path == "/cuda/libcuda.so.1"]
        assert len(ours) == 1
        # ... and not one descriptor more per start: the agent sees every process of this
        # shared host, so a library file of someone else's may come in between, and only then
        grew = [(a, b) for a, b in itertools.pairwise(fds) if a[0] != b[0]]
        assert all(a[1] != b[1] for a, b in grew), fds
