"""Tier 3 (root, real kernel): the first driver call of a program that loads libcuda from a path
nobody probed (LD_LIBRARY_PATH) is caught, with no cooperation from the program.

The programs (tests/gpu/fast.c) are linked against the stand-in libcuda.so.1 and found by the
dynamic loader through LD_LIBRARY_PATH; they call the driver at once and exit within
milliseconds, waiting for nothing. The kernel holds each one (SIGSTOP) as its executable mmap of
the library returns, until the recorder has probed the file; the guard process resumes held
processes when the recorder cannot.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests.gpu import build
from tests.mt.program import the_program
from tracer.bpf import layout
from tracer.bpf.gpuhooks import GpuHooks
from tracer.clock import boottime_ns
from tracer.events import Event, Exit, GpuAllocFailure, GpuCallFailure, GpuLibrary, GpuOomRecovered
from tracer.gpu import holdguard
from tracer.gpu.side import GpuSide
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.trace.reader import read_trace

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(build.gcc() is None, reason="no C compiler (gcc) to build the stand-ins"),
]

MiB = 1 << 20


@dataclass(frozen=True)
class Fast:
    libdir: Path
    program: Path


@pytest.fixture
def fast(tmp_path: Path) -> Fast:
    """A stand-in and its program per test: a new library file, so nothing has probed it."""
    libdir = tmp_path / "lib"
    libdir.mkdir()
    build.libcuda(libdir)
    return Fast(libdir, build.fast(tmp_path, libdir))


def record(
    tmp_path: Path,
    fast: Fast,
    monkeypatch: pytest.MonkeyPatch,
    *args: str,
    program: Path | None = None,
) -> tuple[RecordResult, list[Event], dict[str, int]]:
    """Record ``program`` (fast's by default) with ``args``, the stand-in found through
    LD_LIBRARY_PATH and a 1 MiB budget."""
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fast.libdir))
    monkeypatch.setenv("FAKE_CUDA_BUDGET_BYTES", str(MiB))
    argv = [str(program or fast.program), *args]
    res = Recorder(str(tmp_path / "run.trace"), Targets(command=argv), duration=120).run()
    assert res.path is not None
    trace = read_trace(res.path)
    events = list(trace.events)
    assert trace.footer is not None
    return res, events, trace.footer.extra["gpu_holds"]


T = TypeVar("T", bound=Event)


def of(kind: type[T], events: list[Event]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]


def the_refused_allocation(events: list[Event], ex: Exit, fast: Fast) -> GpuAllocFailure:
    """The one 2 MiB cuMemAlloc_v2 refused in the process of ``ex``, in the library it opened."""
    [lib] = of(GpuLibrary, events)
    assert (lib.pid, lib.path, lib.error) == (ex.pid, str(fast.libdir / "libcuda.so.1"), "")
    [fail] = of(GpuAllocFailure, events)
    assert (fail.pid, fail.function, fail.requested_bytes, fail.result) == (
        ex.pid,
        "cuMemAlloc_v2",
        2 * MiB,
        2,
    )
    return fail


def test_a_program_that_fails_at_once_and_exits_2_is_gpu_oom(
    tmp_path: Path, fast: Fast, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, events, holds = record(tmp_path, fast, monkeypatch, "fail")
    [ex] = of(Exit, events)
    assert ex.wait.code == 2
    the_refused_allocation(events, ex, fast)
    [v] = res.verdicts
    assert (v.pid, v.cause, v.exit_code, v.confidence) == (ex.pid, "gpu_oom", 2, "high")
    # held once, by the kernel, and resumed by the recorder
    assert (holds["taken"], holds["not_taken"], holds["resumed_by_recorder"]) == (1, 0, 1)
    assert res.header.extra["gpu"]["hold"] == "ready"
    assert res.header.extra["gpu"]["pid_filter"] == "shared"
    assert res.header.extra["gpu"]["hold_peers"] == "shared"


def test_a_library_probed_at_start_holds_nobody(
    tmp_path: Path, fast: Fast, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's libcuda is probed before the command starts: loading it costs no hold."""
    from tracer.gpu import libcuda

    monkeypatch.setattr(libcuda, "host_libraries", lambda: [str(fast.libdir / "libcuda.so.1")])
    res, events, holds = record(tmp_path, fast, monkeypatch, "fail")
    [ex] = of(Exit, events)
    [fail] = of(GpuAllocFailure, events)
    assert (fail.pid, ex.wait.code) == (ex.pid, 2)
    assert (holds["taken"], holds["not_taken"]) == (0, 0)
    assert res.header.extra["gpu"]["host_libcuda"] == {
        str(fast.libdir / "libcuda.so.1"): "8/8 allocation entry points"
    }


def test_the_same_failure_recovered_and_exit_0_is_not_gpu_oom(
    tmp_path: Path, fast: Fast, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, events, holds = record(tmp_path, fast, monkeypatch, "recover")
    [ex] = of(Exit, events)
    assert ex.wait.code == 0
    [fail] = of(GpuAllocFailure, events)
    [rec] = of(GpuOomRecovered, events)
    assert (fail.pid, rec.pid, rec.requested_bytes, rec.failures) == (ex.pid, ex.pid, MiB // 2, 1)
    [v] = res.verdicts
    assert (v.pid, v.cause, v.exit_code) == (ex.pid, "app_exit", 0)
    assert "recovered GPU OOM" in v.summary
    assert holds["taken"] == 1


def test_cuinit_failing_is_named_in_the_verdict(
    tmp_path: Path, fast: Fast, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUDA_INIT_RESULT", "100")
    res, events, _ = record(tmp_path, fast, monkeypatch, "noinit")
    [ex] = of(Exit, events)
    assert ex.wait.code == 3
    [call] = of(GpuCallFailure, events)
    assert (call.pid, call.function, call.result, call.failures) == (ex.pid, "cuInit", 100, 1)
    assert of(GpuAllocFailure, events) == []
    [v] = res.verdicts
    assert (v.cause, v.exit_code) == ("app_exit", 3)
    assert v.summary.startswith("CUDA could not initialise: CUDA_ERROR_NO_DEVICE (cuInit ")
    assert "CUDA_VISIBLE_DEVICES" in v.advice
    assert any("cuInit returned CUDA_ERROR_NO_DEVICE (100)" in text for _, text in v.evidence)


def test_a_fork_storm_of_such_programs_has_every_failure_counted(
    tmp_path: Path, fast: Fast, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 100
    res, events, holds = record(tmp_path, fast, monkeypatch, "storm", str(n))
    exits = of(Exit, events)
    [parent] = [e for e in exits if e.wait.code != 2]
    assert parent.wait.code == 0  # every child saw its allocation refused and exited 2
    children = {e.pid for e in exits if e.wait.code == 2}
    assert len(children) == n
    fails = of(GpuAllocFailure, events)
    caught = {f.pid for f in fails}
    assert len(fails) == len(caught) and caught <= children
    # every failure caught, or the misses counted: holds not taken, records lost
    missed = holds["not_taken"] + res.lost
    if missed == 0:
        assert caught == children
    else:
        assert len(caught) + missed >= n
    gpu_oom = {v.pid for v in res.verdicts if v.cause == "gpu_oom"}
    assert gpu_oom == caught


# -- multi-threaded twins (issue 23): tests/mt/mtwork.c, threads named wrk1, wrk2, ... --------


@pytest.mark.parametrize(
    ("mode", "in_worker", "sig"),
    [
        # the headline: the main thread catches a CUDA OOM, then starts its threads, then
        # exits 1. A record describing the thread that passed exit last (a worker started after
        # the failure) kept no evidence from before that worker's start: app_exit.
        ("gpu-late", False, None),
        ("gpu-exit", True, None),  # a worker's allocation is refused; it calls exit(1)
        ("gpu-abort", True, signal.SIGABRT),  # ... and calls abort(): a core dump
    ],
)
def test_a_multithreaded_program_refused_device_memory_is_one_gpu_oom(
    tmp_path: Path,
    fast: Fast,
    monkeypatch: pytest.MonkeyPatch,
    mtwork: Path,
    mode: str,
    in_worker: bool,
    sig: signal.Signals | None,
) -> None:
    monkeypatch.setenv("MT_DIR", str(tmp_path))  # a core file lands there
    res, events, holds = record(tmp_path, fast, monkeypatch, mode, "5", program=mtwork)
    [(v, ex)] = the_program(events, res.verdicts)
    fail = the_refused_allocation(events, ex, fast)
    # the thread that was refused: the main thread, or the last worker (wrk4 of 5 threads)
    assert (fail.tid != ex.pid, fail.comm) == (in_worker, "wrk4" if in_worker else "mtwork")
    assert (v.cause, v.confidence) == ("gpu_oom", "high")
    if sig is None:
        assert (ex.wait.code, v.exit_code, res.command_status) == (1, 1, 1)
    else:  # what wait() reports: the signal with the core-dump bit
        assert (ex.status, v.signal) == (sig | 0x80, sig.name)
    assert holds["taken"] == 1


# -- the guard ----------------------------------------------------------------------------------


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_for(pred: object, timeout: float = 30.0) -> None:
    assert callable(pred)
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _guard(hooks: GpuHooks, max_hold_ns: int) -> tuple[subprocess.Popen[bytes], int]:
    fd, peers = hooks.held_map.fd, hooks.peers.fd
    r, w = os.pipe()
    args = [str(fd), str(r), str(peers), str(hooks.config.holder), str(max_hold_ns)]
    try:
        guard = subprocess.Popen(
            [sys.executable, "-I", "-S", holdguard.__file__, *args], pass_fds=(fd, r, peers)
        )
    finally:
        os.close(r)
    return guard, w


def _hold(probe: GpuHooks, pid: int) -> None:
    hold = layout.WrGpuHold(ts_ns=boottime_ns(), fd=3)
    probe.held_map.update(ctypes.c_uint32(pid), hold)
    os.kill(pid, signal.SIGSTOP)
    _wait_for(lambda: _state(pid) == "T")


def test_the_guard_resumes_held_processes_when_the_recorder_is_gone() -> None:
    probe = GpuHooks(layout.WrGpuConfig(filter_all=0, memcg_v1=0, self_tgid=os.getpid()))
    sleeper = subprocess.Popen(["sleep", "0.1"])
    try:
        # a bound far away: only the end of the pipe can resume it
        guard, w = _guard(probe, 10**15)
        _hold(probe, sleeper.pid)
        os.close(w)  # what the recorder's death does
        assert sleeper.wait(timeout=30) == 0
        assert guard.wait(timeout=30) == 0  # (the parent that forked the guard)
        assert probe.held() == []
    finally:
        sleeper.kill()
        probe.close()


def test_the_guard_ends_a_hold_past_its_bound_while_the_recorder_lives() -> None:
    probe = GpuHooks(layout.WrGpuConfig(filter_all=0, memcg_v1=0, self_tgid=os.getpid()))
    sleeper = subprocess.Popen(["sleep", "0.1"])
    w = -1
    try:
        _, w = _guard(probe, 1)
        _hold(probe, sleeper.pid)
        assert sleeper.wait(timeout=30) == 0
        # the guard resumes, then forgets the hold (a guard killed in between leaves a record,
        # not a stopped process): on a loaded host the sleeper can end in between
        _wait_for(lambda: probe.held() == [])
    finally:
        sleeper.kill()
        if w >= 0:
            os.close(w)
        probe.close()


def test_a_recorder_killed_while_a_process_is_held_leaves_it_running(
    tmp_path: Path, fast: Fast
) -> None:
    """A process tree watched by pid (as an attached recorder or the agent watches a service):
    its program is held, the recorder is stopped so that it cannot resume it, then killed."""
    go, rcfile, trace = tmp_path / "go", tmp_path / "rc", tmp_path / "run.trace"
    script = (
        f"while [ ! -e {go} ]; do sleep 0.01; done; "
        f"LD_LIBRARY_PATH={fast.libdir} FAKE_CUDA_BUDGET_BYTES={MiB} {fast.program} fail; "
        f"echo $? > {rcfile}.tmp; mv {rcfile}.tmp {rcfile}"
    )
    service = subprocess.Popen(["sh", "-c", script])
    whyrestart = os.path.join(os.path.dirname(sys.executable), "whyrestart")
    recorder = subprocess.Popen(
        [whyrestart, "record", "-o", str(trace), "--pid", str(service.pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # the header is written once every source is set up, the GPU side's guard included
        _wait_for(lambda: trace.exists() and trace.stat().st_size > 0)
        # the recorder can no longer resume anything: the program is held until it dies
        recorder.send_signal(signal.SIGSTOP)
        go.touch()

        def held() -> bool:
            with open(f"/proc/{service.pid}/task/{service.pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
            return any(_state(k) == "T" for k in kids)

        _wait_for(held)
        recorder.kill()
        recorder.wait(timeout=30)
        assert service.wait(timeout=60) == 0
        assert rcfile.read_text().strip() == "2"  # it ran on: its allocation failed, exit 2
    finally:
        for p in (recorder, service):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_recorders_holding_one_process_both_catch_its_first_call(
    tmp_path: Path, fast: Fast
) -> None:
    """Each recorder holds the process; the first to have probed the file does not resume it
    while the other still holds it (the holds map both share in bpffs): both catch the call."""
    go = tmp_path / "go"
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(fast.libdir),
        "FAKE_CUDA_BUDGET_BYTES": str(MiB),
    }
    script = f"while [ ! -e {go} ]; do sleep 0.01; done; exec {fast.program} fail"
    sides = [GpuSide(filter_all=False, memcg_v1=True, attach_host=False) for _ in range(2)]
    proc: subprocess.Popen[bytes] | None = None
    try:
        for side in sides:
            assert side.describe()["hold"] == "ready", side.warnings
        proc = subprocess.Popen(["sh", "-c", script], env=env)
        for side in sides:
            side.watch([proc.pid])
        go.touch()
        _wait_for(lambda: _state(proc.pid) == "T")
        now = boottime_ns()
        seen: list[list[Event]] = [sides[0].poll(now), []]
        # probed and done with it, but the other recorder still holds it: still stopped
        assert [e.pid for e in seen[0] if isinstance(e, GpuLibrary)] == [proc.pid]
        assert _state(proc.pid) == "T"
        seen[1] += sides[1].poll(now)
        assert proc.wait(timeout=30) == 2
        for side, events in zip(sides, seen, strict=True):
            events += side.poll(boottime_ns(), final=True)
            assert [(e.pid, e.result) for e in events if isinstance(e, GpuAllocFailure)] == [
                (proc.pid, 2)
            ]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for side in sides:
            side.close()


# Everything done to a libcuda file short of loading it, each step in a child of its own that
# this program waits for with WUNTRACED (any hold shows as a stop: exit 3): cp of the real
# library (it reads it), ldconfig reading its ELF header, a checksum through a read-only mmap, a
# dpkg-style replacement (write a temporary file, rename it over the library), a writer, a
# read-write opener and an O_PATH opener. The programs cp and ldconfig are exec'd as they are.
_NOT_A_LOADER = r"""
import mmap, os, shutil, sys
src, lib = sys.argv[1], sys.argv[2]
libdir = os.path.dirname(lib)

def checksum():
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        sum(m[:4096])

def replace():
    fd = os.open(lib + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, open(lib, "rb").read())
    os.close(fd)
    os.rename(lib + ".new", lib)

def openers():
    fd = os.open(lib, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"x")
    os.close(fd)
    os.close(os.open(lib, os.O_RDWR))
    os.close(os.open(lib, os.O_PATH))

steps = [
    ["cp", src, lib], [shutil.which("ldconfig") or "/sbin/ldconfig", "-n", libdir],
    checksum, replace, openers,
]
for step in steps:
    pid = os.fork()
    if pid == 0:
        if callable(step):
            step()
            os._exit(0)
        os.execvp(step[0], step)
    _, status = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        os.kill(pid, 18)
        os.waitpid(pid, 0)
        print("stopped", step, status, flush=True)
        sys.exit(3)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(4)
"""


def test_copiers_ldconfig_writers_and_o_path_openers_of_a_libcuda_are_never_held(
    tmp_path: Path, fast: Fast, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "copy" / "libcuda.so.1"
    lib.parent.mkdir()
    program = tmp_path / "not_a_loader.py"
    program.write_text(_NOT_A_LOADER)
    _res, events, holds = record(
        tmp_path,
        fast,
        monkeypatch,
        str(program),
        str(fast.libdir / "libcuda.so.1"),
        str(lib),
        program=Path(sys.executable),
    )
    exits = of(Exit, events)
    assert sorted(e.wait.code for e in exits) == [0] * 6, exits
    assert (holds["taken"], holds["not_taken"]) == (0, 0)
    assert of(GpuLibrary, events) == []
