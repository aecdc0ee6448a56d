"""Tier 3 (root, real kernel): GPU allocation failures caught by real uprobes on a stand-in
libcuda.so.1, and the verdicts they lead to; the stand-in NVML reporting Xid 79 and a lost GPU.

The stand-ins and workloads are C, built here with gcc (tests/gpu/). A workload dlopens the
stand-in, then waits for a go file that the test creates when the recorder reports the library
probed (its GpuLibrary event): only then does it allocate, so every failure must be caught and
the counts are exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gpu import build
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.bpf import layout
from tracer.bpf.decode import Decoder
from tracer.bpf.gpuhooks import GpuHooks
from tracer.bpf.libbpf import RingBuffer
from tracer.events import (
    Event,
    Exit,
    GpuAllocFailure,
    GpuLibrary,
    GpuLost,
    GpuOomRecovered,
    GpuXid,
)
from tracer.parse import cuda
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.trace.reader import read_trace

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(build.gcc() is None, reason="no C compiler (gcc) to build the stand-ins"),
]

MiB = 1 << 20
ALL_PROBED = ",".join((*cuda.FREE_FUNCTIONS, *cuda.ALLOC_FUNCTIONS, *cuda.INIT_FUNCTIONS))


@dataclass(frozen=True)
class Bins:
    libcuda: Path
    nvml: Path
    workload: Path


@pytest.fixture(scope="module")
def bins(tmp_path_factory: pytest.TempPathFactory) -> Bins:
    d = tmp_path_factory.mktemp("gpu-bins")
    return Bins(build.libcuda(d), build.nvml(d), build.workload(d))


def go_when_probed(*go_files: Path) -> Callable[[Event | None, list[Verdict]], None]:
    """An on_event callback: create the go files once the recorder says a library is probed."""

    def on_event(ev: Event | None, _verdicts: list[Verdict]) -> None:
        if isinstance(ev, GpuLibrary) and ev.probed:
            for f in go_files:
                f.touch()

    return on_event


def record(
    tmp_path: Path,
    bins: Bins,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    budget: int,
    *,
    targets: Targets | None = None,
    extra_go: tuple[Path, ...] = (),
) -> tuple[RecordResult, list[Event]]:
    go = tmp_path / "go"
    monkeypatch.setenv("WR_LIBCUDA", str(bins.libcuda))
    monkeypatch.setenv("WR_GO_FILE", str(go))
    monkeypatch.setenv("FAKE_CUDA_BUDGET_BYTES", str(budget))
    res = Recorder(
        str(tmp_path / f"{mode}.trace"),
        targets or Targets(command=[str(bins.workload), mode]),
        duration=60,
        on_event=go_when_probed(go, *extra_go),
    ).run()
    assert res.path is not None
    return res, list(read_trace(res.path).events)


def started(bins: Bins, mode: str, go: Path, budget: int) -> subprocess.Popen[bytes]:
    """The workload started outside the recorder, waiting for the file ``go`` to appear."""
    env = {
        **os.environ,
        "WR_LIBCUDA": str(bins.libcuda),
        "WR_GO_FILE": str(go),
        "FAKE_CUDA_BUDGET_BYTES": str(budget),
    }
    return subprocess.Popen([str(bins.workload), mode], env=env)


def of(kind: type[Event], events: list[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, kind)]


def the_workload(events: list[Event]) -> Exit:
    [ex] = of(Exit, events)
    assert isinstance(ex, Exit)
    return ex


def check_library(events: list[Event], pid: int, bins: Bins) -> None:
    [lib] = of(GpuLibrary, events)
    assert isinstance(lib, GpuLibrary)
    assert (lib.pid, lib.path, lib.probed, lib.missing, lib.error) == (
        pid,
        str(bins.libcuda),
        ALL_PROBED,
        "",
        "",
    )


def test_abort_after_allocating_until_failure_is_gpu_oom(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, events = record(tmp_path, bins, monkeypatch, "abort", 10 * MiB)
    ex = the_workload(events)
    assert ex.wait.signal == signal.SIGABRT
    check_library(events, ex.pid, bins)
    [fail] = of(GpuAllocFailure, events)
    assert isinstance(fail, GpuAllocFailure)
    assert (fail.pid, fail.function, fail.requested_bytes, fail.result) == (
        ex.pid,
        "cuMemAlloc_v2",
        MiB,
        2,
    )
    # ten 1 MiB allocations succeeded before: the probes kept count of what it held
    assert (fail.held_bytes, fail.peak_bytes, fail.failures) == (10 * MiB, 10 * MiB, 1)
    assert of(GpuOomRecovered, events) == []
    [v] = res.verdicts
    assert (v.pid, v.cause, v.signal, v.confidence) == (ex.pid, "gpu_oom", "SIGABRT", "high")
    assert v.peak_bytes == 10 * MiB
    assert res.header.hooks["gpu_alloc"] == "uprobe"
    assert res.lost == 0


def test_recovered_gpu_oom_is_an_event_not_a_verdict(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, events = record(tmp_path, bins, monkeypatch, "recover", 4 * MiB)
    ex = the_workload(events)
    assert ex.wait.code == 0
    [fail] = of(GpuAllocFailure, events)
    [rec] = of(GpuOomRecovered, events)
    assert isinstance(fail, GpuAllocFailure) and isinstance(rec, GpuOomRecovered)
    assert (fail.pid, fail.requested_bytes, fail.held_bytes, fail.failures) == (
        ex.pid,
        MiB,
        4 * MiB,
        1,
    )
    # two freed, then the retry: 2 MiB held before it, one failure behind it
    assert (rec.pid, rec.requested_bytes, rec.held_bytes, rec.failures, rec.peak_bytes) == (
        ex.pid,
        MiB,
        2 * MiB,
        1,
        4 * MiB,
    )
    assert fail.ts < rec.ts
    [v] = res.verdicts
    assert (v.pid, v.cause, v.exit_code) == (ex.pid, "app_exit", 0)
    assert "recovered GPU OOM" in v.summary


def test_exit_1_after_one_failure_is_gpu_oom(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, events = record(tmp_path, bins, monkeypatch, "exit1", MiB)
    ex = the_workload(events)
    [fail] = of(GpuAllocFailure, events)
    assert isinstance(fail, GpuAllocFailure)
    assert (fail.pid, fail.requested_bytes, fail.held_bytes, fail.failures) == (
        ex.pid,
        2 * MiB,
        0,
        1,
    )
    [v] = res.verdicts
    assert (v.pid, v.cause, v.exit_code, v.confidence) == (ex.pid, "gpu_oom", 1, "high")
    assert res.command_status == 1


def test_every_entry_point_is_caught_once_and_replay_agrees(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, events = record(tmp_path, bins, monkeypatch, "every", 16 * MiB)
    ex = the_workload(events)
    assert ex.wait.code == 3  # the workload checked every call returned what it should
    fails = of(GpuAllocFailure, events)
    assert [f.function for f in fails if isinstance(f, GpuAllocFailure)] == list(
        cuda.ALLOC_FUNCTIONS
    )
    # one success per entry point (8 MiB held at the peak), all freed by the matching frees,
    # then 2 MiB held; each refused 15 MiB (the pitch request is width * height)
    assert {
        (f.pid, f.requested_bytes, f.held_bytes, f.peak_bytes)
        for f in fails
        if isinstance(f, GpuAllocFailure)
    } == {(ex.pid, 15 * MiB, 2 * MiB, 8 * MiB)}
    assert [f.failures for f in fails if isinstance(f, GpuAllocFailure)] == list(range(1, 9))
    [v] = res.verdicts
    assert (v.cause, v.exit_code) == ("gpu_oom", 3)
    assert "8 device allocations failed (last: cuMemCreate of 15.0 MiB" in v.summary
    replayed = Analyzer().feed_all(events)
    assert [r.to_json() for r in replayed] == [r.to_json() for r in res.verdicts]


def test_an_unwatched_process_using_the_same_library_is_filtered_in_the_kernel(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch
) -> None:
    go2 = tmp_path / "go-stranger"
    stranger = started(bins, "exit1", go2, MiB)
    try:
        res, events = record(tmp_path, bins, monkeypatch, "exit1", MiB, extra_go=(go2,))
    finally:
        # the stranger's allocation failed too (its exit code says so), unseen
        assert stranger.wait(timeout=60) == 1
    ex = the_workload(events)
    assert [f.pid for f in of(GpuAllocFailure, events) if isinstance(f, GpuAllocFailure)] == [
        ex.pid
    ]
    assert stranger.pid not in {v.pid for v in res.verdicts}


def test_a_process_already_running_is_probed_when_watched_by_pid(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = started(bins, "exit1", tmp_path / "go", MiB)
    try:
        res, events = record(
            tmp_path, bins, monkeypatch, "exit1", MiB, targets=Targets(pids=[proc.pid])
        )
    finally:
        proc.wait(timeout=60)
    assert res.reason == "watched processes exited"
    assert [f.pid for f in of(GpuAllocFailure, events) if isinstance(f, GpuAllocFailure)] == [
        proc.pid
    ]
    [v] = res.verdicts
    assert (v.pid, v.cause, v.exit_code) == (proc.pid, "gpu_oom", 1)


@pytest.fixture
def nvml_stand_in(bins: Bins, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in NVML inside this process (WHYRESTART_NVML_LIBRARY). pynvml keeps its library
    in module globals: they are saved and put back, so later tests see this machine's NVML."""
    import pynvml

    saved = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    monkeypatch.setenv("WHYRESTART_NVML_LIBRARY", str(bins.nvml))
    try:
        yield
    finally:
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])
        pynvml._nvmlLib_refcount = saved[2]


def test_xid_79_and_a_lost_gpu_around_the_exit_is_device_reset(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch, nvml_stand_in: None
) -> None:
    monkeypatch.setenv("FAKE_NVML_XID", "79")
    monkeypatch.setenv("FAKE_NVML_TRIGGER", str(tmp_path / "trigger"))
    monkeypatch.setenv("FAKE_NVML_LOST_AFTER_XID", "1")
    monkeypatch.setenv("FAKE_NVML_LOST_ACK", str(tmp_path / "lost"))
    res, events = record(tmp_path, bins, monkeypatch, "lost", 16 * MiB)
    ex = the_workload(events)
    assert ex.wait.code == 1
    gpu = res.header.extra["gpu"]
    assert (gpu["nvml"], gpu["devices"]) == (
        "present",
        [{"index": 0, "uuid": "GPU-fake-0000", "name": "Fake GPU 0"}],
    )
    [x] = of(GpuXid, events)
    [lost] = of(GpuLost, events)
    assert isinstance(x, GpuXid) and isinstance(lost, GpuLost)
    assert (x.xid, x.source, x.device_index) == (79, "nvml", 0)
    assert (lost.reason, lost.source) == ("gpu_is_lost", "nvml")
    assert x.ts < lost.ts < ex.ts
    [v] = res.verdicts
    assert (v.pid, v.cause, v.confidence, v.exit_code) == (ex.pid, "device_reset", "high", 1)


def test_no_nvml_is_said_in_the_header_not_an_error(
    tmp_path: Path, bins: Bins, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctypes.util

    import pynvml

    if ctypes.util.find_library("nvidia-ml") is not None or pynvml.nvmlLib is not None:
        pytest.skip("this machine has NVML")
    res, _ = record(tmp_path, bins, monkeypatch, "recover", 4 * MiB)
    gpu = res.header.extra["gpu"]
    assert (gpu["nvml"], gpu["reason"]) == (
        "absent",
        "libnvidia-ml.so.1 not found: no NVIDIA driver installed",
    )
    assert gpu["uprobes"] == "ready"
    assert not any("NVML" in w or "nvml" in w for w in res.warnings)


# -- the loader on its own ----------------------------------------------------------------------


def run_against(probe: GpuHooks, lib: Path, mode: str, budget: int, workload: Path) -> list[Event]:
    rb = RingBuffer(probe.events)
    try:
        proc = subprocess.Popen(
            [str(workload), mode],
            env={**os.environ, "WR_LIBCUDA": str(lib), "FAKE_CUDA_BUDGET_BYTES": str(budget)},
        )
        proc.wait(timeout=60)  # the probe filters nothing (filter_all): no race to lose
        return Decoder().decode_batch(rb.drain(0))
    finally:
        rb.free()


def test_aliases_are_probed_once_and_missing_entry_points_are_listed(
    tmp_path: Path, bins: Bins
) -> None:
    aliased = build.libcuda(tmp_path, "FAKE_CUDA_ALIASES")
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    old = build.libcuda(old_dir, "FAKE_CUDA_OLD_DRIVER")
    probe = GpuHooks(layout.WrGpuConfig(filter_all=1, memcg_v1=0, self_tgid=os.getpid()))
    try:
        res = probe.attach_library(str(aliased))
        assert res.aliases == {"cuMemAllocAsync_ptsz": "cuMemAllocAsync"}
        assert "cuMemAllocAsync_ptsz" not in res.probed
        assert (res.missing, res.errors) == ([], [])
        res = probe.attach_library(str(old))
        assert res.missing == [
            "cuMemFreeAsync",
            "cuMemFreeAsync_ptsz",
            "cuMemRelease",
            "cuMemAllocAsync",
            "cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz",
            "cuMemCreate",
            "cuCtxCreate_v3",
            "cuCtxCreate_v4",
        ]
        assert res.probed == [
            "cuMemFree_v2",
            "cuMemAlloc_v2",
            "cuMemAllocManaged",
            "cuMemAllocPitch_v2",
            "cuInit",
            "cuDevicePrimaryCtxRetain",
            "cuCtxCreate_v2",
        ]
        assert res.allocations_probed == 3
        # a call through the alias fires one program, not two: one failure, one record
        events = run_against(probe, aliased, "every", 16 * MiB, bins.workload)
        fails = [e for e in events if isinstance(e, GpuAllocFailure)]
        assert [f.function for f in fails] == [
            "cuMemAlloc_v2",
            "cuMemAllocManaged",
            "cuMemAllocPitch_v2",
            "cuMemAllocAsync",
            "cuMemAllocAsync",  # the _ptsz call, reported under the name probed
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz",
            "cuMemCreate",
        ]
        assert probe.lost_count() == 0
    finally:
        probe.close()


def test_a_file_that_is_no_library_is_an_error_not_a_crash(tmp_path: Path) -> None:
    bogus = tmp_path / "libcuda.so.1"
    bogus.write_bytes(b"#!/bin/sh\n" * 10)
    probe = GpuHooks(layout.WrGpuConfig(filter_all=0, memcg_v1=0, self_tgid=os.getpid()))
    try:
        res = probe.attach_library(str(bogus))
        assert res.probed == [] and len(res.errors) == 1
        assert "not an ELF file" in res.errors[0]
    finally:
        probe.close()
