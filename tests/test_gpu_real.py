"""The real NVIDIA driver library and the real CUDA runtime, on a machine without a GPU.

Debian's non-free libcuda1 (driver 535, fetched by scripts/fetch-cuda into .cache/cuda) is the
stripped libcuda.so.1 every GPU host has; PyPI's nvidia-cuda-runtime-cu12 (the dev extra) is the
libcudart.so.12 real programs use. Without a device, cuInit returns 100 (CUDA_ERROR_NO_DEVICE)
and every later call 3 (CUDA_ERROR_NOT_INITIALIZED): what is tested here is what needs no
device — symbol offsets read from the real file, uprobes attached by name, and a program's
failing calls (its own, and the runtime's, which reaches the driver through cuGetProcAddress)
caught with their codes and named in the verdict.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import pytest

from tests.gpu import build
from tracer.bpf import gpuhooks
from tracer.events import Event, Exit, GpuAllocFailure, GpuCallFailure, GpuLibrary
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.trace.reader import read_trace

LIBCUDA_DIR = build.real_libcuda_dir()
pytestmark = pytest.mark.skipif(LIBCUDA_DIR is None, reason=build.why_no_real_libcuda())

MiB = 1 << 20
T = TypeVar("T", bound=Event)
needs_gcc = pytest.mark.skipif(build.gcc() is None, reason="no C compiler (gcc)")


@pytest.fixture
def cudart() -> Path:
    """The directory of PyPI's libcudart.so.12 (the dev extra)."""
    found = build.cudart_dir()
    if found is None:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed (the dev extra): run scripts/setup")
    return found


def real_libcuda() -> Path:
    assert LIBCUDA_DIR is not None
    return LIBCUDA_DIR / "libcuda.so.1"


def of(kind: type[T], events: list[Event]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]


def test_every_entry_point_is_found_in_the_stripped_library() -> None:
    path = real_libcuda()
    offsets = gpuhooks.read_symbol_offsets(str(path), tuple(gpuhooks.PROGRAMS))
    # driver 535 is CUDA 12.2: cuCtxCreate_v4 came with 12.5; everything else is exported
    assert set(gpuhooks.PROGRAMS) - set(offsets) == {"cuCtxCreate_v4"}
    # no two entry points share code (the _ptsz twins are functions of their own here)
    assert len(set(offsets.values())) == len(offsets)
    # the file offsets fall inside the file, in its executable part
    size = path.stat().st_size
    assert all(0 < off < size for off in offsets.values())


def record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: Path, libpath: str
) -> tuple[RecordResult, list[Event]]:
    monkeypatch.setenv("LD_LIBRARY_PATH", libpath)
    res = Recorder(str(tmp_path / "run.trace"), Targets(command=[str(program)]), duration=120).run()
    assert res.path is not None
    return res, list(read_trace(res.path).events)


def check_library(events: list[Event], pid: int) -> None:
    libs = [lib for lib in of(GpuLibrary, events) if lib.pid == pid]
    assert libs, "the real library was not reported probed"
    lib = libs[0]
    assert lib.path.endswith("/nvidia/current/libcuda.so.535.261.03") or lib.path.endswith(
        "libcuda.so.1"
    )
    assert (lib.missing, lib.error) == ("cuCtxCreate_v4", "")
    probed = set(lib.probed.split(","))
    assert probed == set(gpuhooks.PROGRAMS) - {"cuCtxCreate_v4"}


def failed_exit(events: list[Event], first_call: str) -> Exit:
    """The program's exit: status 2 where ``first_call`` failed for want of a device (a
    machine with a GPU skips), its process's library probed."""
    [ex] = of(Exit, events)
    if ex.wait.code == 0:
        pytest.skip(f"this machine has a GPU: {first_call} succeeded")
    assert ex.wait.code == 2
    check_library(events, ex.pid)
    return ex


@pytest.mark.root
@needs_gcc
def test_a_driver_program_s_failing_calls_are_caught_with_their_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert LIBCUDA_DIR is not None
    program = build.driver_api(tmp_path, LIBCUDA_DIR)
    res, events = record(tmp_path, monkeypatch, program, str(LIBCUDA_DIR))
    ex = failed_exit(events, "cuInit")
    fails = of(GpuCallFailure, events)
    calls = [(c.function, c.result, c.requested_bytes, c.failures) for c in fails]
    assert calls == [
        ("cuInit", 100, 0, 1),
        ("cuDevicePrimaryCtxRetain", 3, 0, 2),
        ("cuCtxCreate_v2", 3, 0, 3),
        ("cuMemAlloc_v2", 3, MiB, 4),
        # through cuGetProcAddress_v2: the driver hands out its exported entry points
        ("cuMemAlloc_v2", 3, 2 * MiB, 5),
        ("cuMemAllocAsync", 3, 3 * MiB, 6),
    ]
    assert {c.pid for c in of(GpuCallFailure, events)} == {ex.pid}
    assert of(GpuAllocFailure, events) == []  # not an out of memory
    [v] = res.verdicts
    assert (v.pid, v.cause, v.exit_code) == (ex.pid, "app_exit", 2)
    assert v.summary == (
        "CUDA could not initialise: CUDA_ERROR_NO_DEVICE (cuInit returned 100), then it exited "
        "with code 2"
    )
    assert "NVIDIA_VISIBLE_DEVICES" in v.advice


@pytest.mark.root
@needs_gcc
def test_the_real_cuda_runtime_reaching_the_real_driver_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cudart: Path
) -> None:
    assert LIBCUDA_DIR is not None
    program = build.runtime_api(tmp_path, cudart)
    # libcudart dlopens libcuda.so.1 by name: the loader finds the real one here
    res, events = record(tmp_path, monkeypatch, program, f"{cudart}{os.pathsep}{LIBCUDA_DIR}")
    ex = failed_exit(events, "cudaMalloc")
    calls = of(GpuCallFailure, events)
    # the runtime initialises the driver once, through the entry point cuGetProcAddress gave
    # it, and gives up before any allocation reaches the driver
    assert [(c.pid, c.function, c.result) for c in calls] == [(ex.pid, "cuInit", 100)]
    [v] = res.verdicts
    assert (v.cause, v.exit_code) == ("app_exit", 2)
    assert v.summary.startswith("CUDA could not initialise: CUDA_ERROR_NO_DEVICE (cuInit ")
    assert any("cuInit returned CUDA_ERROR_NO_DEVICE (100)" in text for _, text in v.evidence)


def test_libcuda_lists_match_the_real_header(cudart: Path) -> None:
    """The CUresult names are cuda.h's (the runtime wheel ships the driver's header)."""
    import re

    from tracer.parse import cuda

    header = (cudart.parent / "include" / "cuda.h").read_text()
    codes = {
        int(m.group(2)): m.group(1)
        for m in re.finditer(r"^\s+(CUDA_(?:SUCCESS|ERROR_\w+))\s+=\s+(\d+)", header, re.M)
    }
    assert {k: codes[k] for k in cuda.NAMES} == cuda.NAMES
    # and every probed entry point is declared there under that very name (but the one that
    # came after this 12.2 header: cuCtxCreate_v4, CUDA 12.5)
    for name in (*cuda.ALLOC_FUNCTIONS, *cuda.FREE_FUNCTIONS, *cuda.INIT_FUNCTIONS):
        if name == "cuCtxCreate_v4":
            continue
        base = name.removesuffix("_ptsz")
        assert re.search(rf"\b{base}\b", header), name
