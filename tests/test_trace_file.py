"""Tests for tracer.trace: the trace file format, writer and reader.

Tier 1 runs everywhere: round trips of every event kind, a trace cut at every byte offset (plain
and zstd), damaged and foreign files, the writer's refusals (symlink, missing or unwritable
directory) and its rollback on injected write faults. The root tier (``@pytest.mark.root``)
fills a real 64 KiB tmpfs to get a real ENOSPC. zstd tests skip with the reason when the optional
``zstandard`` package is missing.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer.trace.writer as writer_mod
from tracer.errors import OutputError, TraceFileError
from tracer.events import (
    KINDS,
    CgroupInfo,
    CgroupMkdir,
    CgroupSample,
    EffectiveLimit,
    Event,
    Exec,
    Exit,
    Fork,
    GpuAllocFailure,
    GpuCallFailure,
    GpuLibrary,
    GpuLost,
    GpuOomRecovered,
    GpuProcessSample,
    GpuSample,
    GpuXid,
    HostSample,
    KmsgOom,
    Lost,
    OomKill,
    OomKillCount,
    ProbeSample,
    ProcessSample,
    ReclaimStall,
    ReclaimSummary,
    RuntimeExit,
    RuntimeSample,
    SampleError,
    Signal,
    TmpfsFull,
    UnitInfo,
    from_record,
)
from tracer.trace.format import (
    MAX_LINE_BYTES,
    SCHEMA_VERSION,
    FormatError,
    TraceFooter,
    TraceHeader,
)
from tracer.trace.reader import READ_BLOCK, TraceReader, _decode_block, _decode_line, read_trace
from tracer.trace.writer import TraceWriter

HAVE_ZSTD = importlib.util.find_spec("zstandard") is not None
needs_zstd = pytest.mark.skipif(
    not HAVE_ZSTD, reason="zstandard is not installed (optional; pip install zstandard)"
)

# ---------------------------------------------------------------------------------------------
# Fixtures

HEADER = TraceHeader(
    tool_version="0.1.0",
    host="gpu-node-7",
    kernel="6.1.0-18-amd64",
    cgroup={"mode": "v2", "unified": "/sys/fs/cgroup"},
    clock_offset_ns=1_732_950_000_000_000_000,
    hooks={"exit": "tp_btf", "signal": "tp_btf", "oom": "kprobe", "reclaim": None},
    targets={"cgroups": ["/kubepods.slice/pod-1"], "pids": [4242]},
    started_ns=12_000_000_000,
    extra={"samplers": {"memory_ms": 100, "psi_ms": 1000}, "command": ["python3", "serve.py"]},
)

# One event of every kind, with values in the shape the kernel and parsers produce.
SAMPLES: list[Event] = [
    Exit(
        ts=12_000_100_000,
        pid=4242,
        ppid=1,
        comm="python3",
        cgroup_id=8812,
        status=9,  # killed by SIGKILL
        start_ns=11_000_000_000,
        rung="tp_btf",
    ),
    Signal(
        ts=12_000_090_000,
        sender_pid=0,
        sender_tid=0,
        sender_comm="swapper/0",
        sender_cgroup_id=1,
        target_pid=4242,
        target_comm="python3",
        sig=9,
        si_code=0x80,
        result=0,
        group=True,
    ),
    OomKill(
        ts=12_000_080_000,
        victim_pid=4242,
        victim_comm="python3",
        victim_cgroup_id=8812,
        trigger_pid=4243,
        trigger_comm="python3",
        memcg=True,
        limit_cgroup_id=8800,
        limit_bytes=8 << 30,
        usage_bytes=(8 << 30) - 4096,
        rung="kprobe",
    ),
    Fork(ts=12_000_010_000, parent_pid=4242, child_pid=4243, comm="python3", cgroup_id=8812),
    Exec(ts=12_000_020_000, pid=4243, comm="sh", filename="/bin/sh", cgroup_id=8812),
    KmsgOom(
        ts=12_000_085_000,
        victim_pid=4242,
        victim_comm="python3",
        constraint="CONSTRAINT_MEMCG",
        oom_memcg="/kubepods.slice/pod-1",
        task_memcg="/kubepods.slice/pod-1/ctr",
        total_vm_kb=10_485_760,
        anon_rss_kb=8_388_000,
        file_rss_kb=None,  # older kernels print fewer fields
        shmem_rss_kb=0,
        oom_score_adj=None,
        memcg=True,
    ),
    CgroupInfo(
        ts=12_000_000_500,
        cgroup_id=8812,
        path="/kubepods.slice/pod-1/ctr",
        hierarchy="unified",
        limit_bytes=None,
    ),
    Lost(ts=12_000_095_000, count=3),
    ReclaimStall(
        ts=12_000_070_000,
        pid=4242,
        comm="python3",
        cgroup_id=8800,
        task_cgroup_id=8812,
        kind="memcg",
        duration_ns=42_000_000,
        reclaimed_bytes=1 << 20,
        rung="tracepoint",
    ),
    ReclaimSummary(
        ts=12_000_075_000,
        cgroup_id=8800,
        kind="memcg",
        count=17,
        total_ns=95_000_000,
        max_ns=42_000_000,
        reclaimed_bytes=12 << 20,
        interval_ns=1_000_000_000,
    ),
    CgroupSample(
        ts=12_000_060_000,
        cgroup_id=8800,
        path="/kubepods.slice/pod-1",
        usage_bytes=(8 << 30) - (3 << 20),
        limit_bytes=8 << 30,
        high_bytes=None,  # "max"
        peak_bytes=(8 << 30) - 4096,
        failcnt=None,  # v2 has none
        events={"low": 0, "high": 0, "max": 212, "oom": 1, "oom_kill": 1, "oom_group_kill": 0},
        stat={"anon": 7 << 30, "file": 900 << 20, "file_mapped": 300 << 20, "shmem": 0},
        psi_some_avg10=12.5,
        psi_full_avg10=9.75,
        psi_some_total_us=3_101_221,
        psi_full_total_us=2_500_100,
    ),
    EffectiveLimit(
        ts=12_000_000_600,
        cgroup_id=8812,
        path="/kubepods.slice/pod-1/ctr",
        limit_bytes=8 << 30,
        set_by="/kubepods.slice/pod-1",
    ),
    HostSample(
        ts=12_000_060_000,
        mem_total=64 << 30,
        mem_available=41 << 30,  # "the host says memory is free"
        mem_free=30 << 30,
        cached=10 << 30,
        swap_free=None,
        psi_some_avg10=0.0,
        psi_full_avg10=0.0,
        psi_some_total_us=38_121,
        psi_full_total_us=21_260,
    ),
    ProcessSample(
        ts=12_000_060_000,
        pid=4242,
        rss_anon=(7 << 30) + (512 << 20),
        rss_file=120 << 20,
        rss_shmem=0,
        vm_swap=0,
    ),
    SampleError(
        ts=12_000_000_700,
        source="cgroup",
        target="memory.peak",
        message="memory.peak missing: added in Linux 5.19",
    ),
    CgroupMkdir(ts=12_000_000_800, cgroup_id=9001, path="/libpod_parent/libpod-abc", level=2),
    UnitInfo(
        ts=12_000_000_900,
        cgroup_id=9001,
        kind="podman",
        unit_id="abc" * 21 + "d",
        name="model",
        pod="",
    ),
    RuntimeSample(
        ts=12_000_001_000,
        unit="podman model",
        source="podman",
        restart_count=2,
        state="running",
        exit_code=None,
        oom_killed=False,
    ),
    ProbeSample(
        ts=12_000_001_100,
        target="http://127.0.0.1:8080/health",
        unit="podman model",
        latency_ns=1_000_000_000,
        ok=False,
        timed_out=True,
        status=None,
        error="timed out",
    ),
    RuntimeExit(
        ts=12_000_100_000,
        cgroup_id=8812,
        unit="podman model",
        source="podman",
        exit_code=137,
        pid=0,
        oom_killed=False,
    ),
    OomKillCount(
        ts=11_000_000_000, cgroup_id=8812, path="/machine/model", count=2, read_ns=13_000_000_000
    ),
    GpuAllocFailure(
        ts=12_000_050_000,
        pid=4242,
        tid=4250,
        comm="pt_main_thread",
        cgroup_id=8812,
        function="cuMemAlloc_v2",
        requested_bytes=2 << 30,
        result=2,  # CUDA_ERROR_OUT_OF_MEMORY
        held_bytes=78 << 30,
        peak_bytes=78 << 30,
        failures=1,
    ),
    GpuOomRecovered(
        ts=12_000_051_000,
        pid=4242,
        tid=4250,
        comm="pt_main_thread",
        cgroup_id=8812,
        function="cuMemAllocAsync",
        requested_bytes=1 << 30,
        held_bytes=70 << 30,
        peak_bytes=78 << 30,
        failures=1,
    ),
    GpuCallFailure(
        ts=12_000_001_500,
        pid=4243,
        tid=4243,
        comm="python3",
        cgroup_id=8812,
        function="cuInit",
        result=100,
        requested_bytes=0,
        failures=1,
    ),
    TmpfsFull(
        ts=12_000_001_900,
        pid=4243,
        mount_point="/dev/shm",
        fs_type="tmpfs",
        size_bytes=64 << 20,
        used_bytes=64 << 20,
        avail_bytes=0,
        mapped=True,
        via_pid=0,
    ),
    GpuLibrary(
        ts=12_000_002_000,
        pid=4242,
        path="/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        probed="cuMemFree_v2,cuMemAlloc_v2,cuMemCreate",
        missing="cuMemAllocAsync_ptsz",
        error="",
    ),
    GpuSample(
        ts=12_000_049_000,
        index=0,
        uuid="GPU-5a1e7c3e-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3",
        total_bytes=80 << 30,
        used_bytes=79 << 30,
        free_bytes=(1 << 30) - (512 << 20),
        reserved_bytes=512 << 20,
    ),
    GpuProcessSample(ts=12_000_049_000, index=0, pid=4242, used_bytes=78 << 30, kind="compute"),
    GpuXid(
        ts=12_000_099_000,
        xid=79,
        device="0000:3b:00",
        device_index=None,
        pid=4242,
        proc_name="python3",
        message="GPU has fallen off the bus.",
        source="kmsg",
    ),
    GpuLost(
        ts=12_000_099_500,
        device="GPU-5a1e7c3e",
        device_index=0,
        reason="gpu_is_lost",
        source="nvml",
    ),
]


def test_samples_cover_every_kind() -> None:
    # A new event kind must get a sample here, so that the round trip below covers it.
    assert sorted(e.KIND for e in SAMPLES) == sorted(KINDS)


def write_trace(
    path: Path, events: list[Event], *, footer: bool = True, **kwargs: int
) -> TraceWriter:
    w = TraceWriter.open(path, HEADER, **kwargs)
    w.write_many(events)
    if footer:
        w.close(w.make_footer("command exited", ended_ns=13_000_000_000))
    else:
        w.abort()
    return w


def small_trace(path: Path) -> tuple[bytes, list[Event]]:
    """A few records, each flushed on its own (so a zstd file has one frame per record)."""
    events = SAMPLES[:4]
    write_trace(path, events, flush_every=1)
    return path.read_bytes(), events


def read_all(path: Path) -> tuple[list[Event], TraceReader]:
    reader = TraceReader(path)
    return list(reader), reader


# ---------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("name", ["t.trace", pytest.param("t.trace.zst", marks=needs_zstd)])
def test_round_trip_every_kind(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    w = write_trace(path, SAMPLES)
    assert w.closed
    assert w.bytes_written == path.stat().st_size
    t = read_trace(path)
    assert t.header == HEADER
    assert t.events == SAMPLES
    assert [type(e) for e in t.events] == [type(e) for e in SAMPLES]
    assert t.warnings == []
    assert t.footer is not None
    assert t.footer.counts == {k: 1 for k in KINDS}
    assert t.footer.lost == 3
    assert t.footer.exit == "command exited"
    assert t.footer.ended_ns == 13_000_000_000


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.KIND)
def test_fast_decoders_agree_with_from_record(event: Event) -> None:
    line = orjson.dumps(event.to_record())
    rec = orjson.loads(line)
    assert _decode_line(line) == _decode_block(b"[" + line + b"]")[0] == from_record(rec) == event
    assert type(_decode_line(line)) is type(event)


CONTROLS = 'a\x00b\x1b[2J\u2028"\\/\x7f\U0001f600'  # what a hostile process name holds


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.KIND)
def test_each_line_written_is_the_records_json(tmp_path: Path, event: Event) -> None:
    """The writer encodes the Struct itself (msgspec, in C): its line is byte for byte the
    documented ``to_record()`` as orjson writes it, strings with controls included; a string
    that is not Unicode (a lone surrogate) is refused, as orjson refused it."""
    strings = [f for f in event.__struct_fields__ if isinstance(getattr(event, f), str)]
    hostile = msgspec.structs.replace(event, **{f: CONTROLS for f in strings})
    for i, ev in enumerate((event, hostile)):
        path = tmp_path / f"{ev.KIND}-{i}.trace"
        write_trace(path, [ev])
        want = orjson.dumps(ev.to_record(), option=orjson.OPT_APPEND_NEWLINE)
        assert path.read_bytes().splitlines(keepends=True)[1] == want
    if strings:
        broken = msgspec.structs.replace(event, **{strings[0]: "x\udcff"})
        with pytest.raises(ValueError, match="cannot write"):
            write_trace(tmp_path / f"{event.KIND}-broken.trace", [broken])


def test_default_field_may_be_absent_and_unknown_fields_are_ignored(tmp_path: Path) -> None:
    rec = SAMPLES[0].to_record()
    del rec["rung"]  # has a default
    rec["added_later"] = 1  # a field a newer minor version could add
    lines = [orjson.dumps(HEADER.to_record()), orjson.dumps(rec)]
    path = tmp_path / "t.trace"
    path.write_bytes(b"\n".join(lines) + b"\n")
    events, reader = read_all(path)
    fields = {k: v for k, v in SAMPLES[0].to_record().items() if k not in ("t", "rung")}
    assert events == [Exit(**fields)]  # rung took its default, ""
    assert reader.warnings == ["no footer: the recording did not finish"]


def test_header_and_footer_round_trip() -> None:
    assert TraceHeader.from_record(orjson.loads(orjson.dumps(HEADER.to_record()))) == HEADER
    rec = HEADER.to_record()
    assert rec["t"] == "header"
    assert rec["schema"] == SCHEMA_VERSION
    assert rec["tool"] == "whyrestart"
    assert rec["clock"] == "boottime"
    assert rec["samplers"] == {"memory_ms": 100, "psi_ms": 1000}  # extra keys sit at top level
    footer = TraceFooter(
        ended_ns=5, exit="interrupted", counts={"exit": 2}, lost=1, warnings=("a", "b")
    )
    assert TraceFooter.from_record(orjson.loads(orjson.dumps(footer.to_record()))) == footer
    assert TraceFooter(ended_ns=5, exit="x", warnings=["a"]).warnings == ("a",)
    assert HEADER.realtime_ns(1) == 1 + HEADER.clock_offset_ns


def test_header_extra_may_not_shadow_fields() -> None:
    with pytest.raises(ValueError, match="clash"):
        TraceHeader(
            tool_version="0",
            host="h",
            kernel="k",
            cgroup={},
            clock_offset_ns=0,
            hooks={},
            targets={},
            started_ns=0,
            extra={"host": "other"},
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"started_ns": "12"}, "'started_ns' must be an integer, got string"),
        ({"started_ns": True}, "'started_ns' must be an integer, got boolean"),
        ({"hooks": {"exit": 1}}, "hooks['exit'] must be a string or null"),
        ({"cgroup": []}, "'cgroup' must be an object, got array"),
        ({"tool": "other"}, "written by 'other'"),
    ],
)
def test_malformed_header_record(change: dict[str, object], message: str) -> None:
    with pytest.raises(FormatError, match=message.replace("[", r"\[")):
        TraceHeader.from_record(HEADER.to_record() | change)


def test_malformed_footer_record() -> None:
    good = TraceFooter(ended_ns=1, exit="x").to_record()
    with pytest.raises(FormatError, match="counts"):
        TraceFooter.from_record(good | {"counts": {"exit": "3"}})
    with pytest.raises(FormatError, match="warnings"):
        TraceFooter.from_record(good | {"warnings": [1]})
    with pytest.raises(FormatError, match="'exit'"):
        TraceFooter.from_record({k: v for k, v in good.items() if k != "exit"})


# ---------------------------------------------------------------------------------------------
# Writer


def test_file_mode_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        write_trace(tmp_path / "new.trace", SAMPLES)
        existing = tmp_path / "old.trace"
        existing.write_bytes(b"old")
        existing.chmod(0o644)
        with pytest.raises(OutputError, match="exists"):
            write_trace(existing, SAMPLES)  # never written through
        assert existing.read_bytes() == b"old"
        w = TraceWriter.open(existing, HEADER, overwrite=True)
        w.write_many(SAMPLES)
        w.close(w.make_footer("command exited", ended_ns=13_000_000_000))
    finally:
        os.umask(old)
    for name in ("new.trace", "old.trace"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert read_trace(existing).events == SAMPLES  # replaced, not appended to


def test_a_hard_link_planted_at_the_path_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.link(victim, tmp_path / "t.trace")
    with pytest.raises(OutputError, match="exists"):
        write_trace(tmp_path / "t.trace", SAMPLES)
    w = TraceWriter.open(tmp_path / "t.trace", HEADER, overwrite=True)
    w.close(w.make_footer("command exited", ended_ns=13_000_000_000))
    assert victim.read_bytes() == b"precious"


def test_symlink_at_the_path_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "t.trace"
    link.symlink_to(victim)
    with pytest.raises(OutputError, match="symbolic link") as info:
        TraceWriter.open(link, HEADER)
    assert info.value.fix and "link" in info.value.fix
    assert victim.read_bytes() == b"precious"
    assert stat.S_IMODE(victim.stat().st_mode) != 0o600 or os.geteuid() != 0


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"directory .* does not exist") as info:
        TraceWriter.open(tmp_path / "nope" / "t.trace", HEADER)
    assert info.value.fix and "mkdir -p" in info.value.fix


def test_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="is a directory"):
        TraceWriter.open(tmp_path, HEADER)


def test_directory_that_makes_no_files() -> None:
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    with pytest.raises(OutputError, match="/proc/self does not accept new files"):
        TraceWriter.open("/proc/self/t.trace", HEADER)


def _open_as_nobody(path: str) -> str:
    """Try TraceWriter.open as uid 65534 in a forked child (root may write anywhere)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                TraceWriter.open(path, HEADER).abort()
                result = "opened"
            except OutputError as exc:
                result = str(exc)
            os.write(write_fd, result.encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        result = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return result


def test_unwritable_directory() -> None:
    # Not tmp_path: an unprivileged child must be able to reach the directory to be refused
    # by its mode rather than by a parent's.
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        locked = os.path.join(top, "locked")
        os.mkdir(locked, 0o555)
        os.chmod(locked, 0o555)
        path = os.path.join(locked, "t.trace")
        if os.geteuid() == 0:
            message = _open_as_nobody(path)
        else:
            with pytest.raises(OutputError) as info:
                TraceWriter.open(path, HEADER)
            message = str(info.value)
        assert "permission denied: choose a writable path" in message
        assert path in message
        assert not os.path.exists(path)


def test_flush_rules_and_whole_lines_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    w = TraceWriter.open(path, HEADER, flush_every=3)
    header_size = w.bytes_written
    assert header_size == path.stat().st_size > 0  # the header is on disk at once
    w.write(SAMPLES[0])
    w.write(SAMPLES[1])
    assert path.stat().st_size == header_size  # buffered
    assert w.counts == {"exit": 1, "signal": 1}  # counts include what is buffered
    w.write(SAMPLES[2])  # the third record flushes
    assert path.stat().st_size == w.bytes_written > header_size
    assert w.events_written == 3
    data = path.read_bytes()
    assert data.endswith(b"\n")
    w.write(SAMPLES[7])
    w.flush()
    assert w.lost == 3
    # A reader in the middle of a recording sees whole records and no footer.
    events, reader = read_all(path)
    assert events == [SAMPLES[0], SAMPLES[1], SAMPLES[2], SAMPLES[7]]
    assert reader.warnings == ["no footer: the recording did not finish"]
    w.close(w.make_footer("interrupted"))
    w.close(w.make_footer("twice"))  # closing twice does nothing
    footer = read_trace(path).footer
    assert footer is not None
    assert (footer.exit, footer.counts, footer.lost) == (
        "interrupted",
        {"exit": 1, "signal": 1, "oom": 1, "lost": 1},
        3,
    )
    with pytest.raises(ValueError, match="closed"):
        w.write(SAMPLES[0])


def test_writer_refuses_what_the_reader_would(tmp_path: Path) -> None:
    class Stranger(Lost):
        KIND = "stranger"

    w = TraceWriter.open(tmp_path / "t.trace", HEADER)
    with pytest.raises(ValueError, match="not a registered event kind"):
        w.write(Stranger(ts=1, count=1))
    with pytest.raises(ValueError, match="limit"):
        w.write(Exec(ts=1, pid=1, comm="x", filename="/" * MAX_LINE_BYTES, cgroup_id=1))
    with pytest.raises(ValueError, match="64-bit"):
        w.write(Lost(ts=1, count=1 << 70))
    w.close(w.make_footer("command exited"))
    t = read_trace(tmp_path / "t.trace")
    assert t.events == []
    assert t.warnings == []


def test_context_manager_without_close_leaves_no_footer(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    with pytest.raises(RuntimeError), TraceWriter.open(path, HEADER) as w:
        w.write_many(SAMPLES[:2])
        raise RuntimeError("the recorder died")
    events, reader = read_all(path)
    assert events == SAMPLES[:2]  # buffered events were still written
    assert reader.footer is None
    assert reader.warnings == ["no footer: the recording did not finish"]


class FaultyWrite:
    """An os.write that writes part of its first call, then fails with ``fault``."""

    def __init__(self, fault: BaseException, partial: int) -> None:
        self.fault = fault
        self.partial = partial
        self.calls = 0

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        self.calls += 1
        if self.calls == 1:
            return os.write(fd, data[: self.partial])
        raise self.fault


@pytest.mark.parametrize("name", ["t.trace", pytest.param("t.trace.zst", marks=needs_zstd)])
def test_eio_mid_chunk_leaves_whole_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / name
    w = TraceWriter.open(path, HEADER, flush_every=1000)
    w.write_many(SAMPLES[:2])
    w.flush()
    size_before = path.stat().st_size
    w.write_many(SAMPLES[2:6])
    first = len(orjson.dumps(SAMPLES[2].to_record())) + 1
    # Part of the chunk lands (one whole record and a torn one), then the disk fails.
    monkeypatch.setattr(writer_mod, "_os_write", FaultyWrite(OSError(errno.EIO, "EIO"), first + 9))
    with pytest.raises(OutputError, match=r"I/O error \(EIO\)") as info:
        w.flush()
    kept = 3 if name.endswith(".trace") else 2  # a partial zstd frame is cut off whole
    assert f"keeps its first {kept} records" in str(info.value)
    assert path.stat().st_size == w.bytes_written >= size_before
    events, reader = read_all(path)
    assert events == SAMPLES[:kept]
    assert reader.warnings == ["no footer: the recording did not finish"]
    # The writer is dead: later calls repeat the error instead of writing after a gap.
    with pytest.raises(OutputError, match="I/O error"):
        w.write(SAMPLES[7])
    with pytest.raises(OutputError, match="I/O error"):
        w.close(w.make_footer("command exited"))
    assert w.closed


@pytest.mark.parametrize("name", ["t.trace", pytest.param("t.trace.zst", marks=needs_zstd)])
def test_interrupt_mid_chunk_is_rolled_back_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / name
    w = TraceWriter.open(path, HEADER, flush_every=1000)
    w.write_many(SAMPLES)
    monkeypatch.setattr(writer_mod, "_os_write", FaultyWrite(KeyboardInterrupt(), 200))
    with pytest.raises(KeyboardInterrupt):
        w.flush()
    monkeypatch.setattr(writer_mod, "_os_write", os.write)
    # Ctrl-C while writing: nothing torn is left, nothing buffered is lost, close still works.
    w.close(w.make_footer("interrupted"))
    t = read_trace(path)
    assert t.events == SAMPLES
    assert t.warnings == []
    assert t.footer is not None
    assert t.footer.exit == "interrupted"


def test_zstd_without_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if HAVE_ZSTD:
        zst = tmp_path / "t.trace.zst"
        write_trace(zst, SAMPLES)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail
    path = tmp_path / "new.trace.zst"
    with pytest.raises(OutputError, match="zstandard") as info:
        TraceWriter.open(path, HEADER)
    assert info.value.fix and "pip install zstandard" in info.value.fix
    assert not path.exists()
    if HAVE_ZSTD:
        with pytest.raises(TraceFileError, match="needs the zstandard package"):
            TraceReader(zst)


# ---------------------------------------------------------------------------------------------
# Reader: cuts


def test_cut_at_every_byte_plain(tmp_path: Path) -> None:
    full = tmp_path / "full.trace"
    data, events = small_trace(full)
    ends = [i for i, b in enumerate(data) if b == ord("\n")]  # offset of each line's newline
    header_end, footer_end = ends[0], ends[-1]
    cut_path = tmp_path / "cut.trace"
    for cut in range(len(data) + 1):
        cut_path.write_bytes(data[:cut])
        if cut == 0:
            with pytest.raises(TraceFileError, match="is empty: the recording wrote nothing"):
                TraceReader(cut_path)
            continue
        if cut < header_end:
            with pytest.raises(TraceFileError, match="the header is incomplete"):
                TraceReader(cut_path)
            continue
        got, reader = read_all(cut_path)
        # A record counts once its text is whole, newline or not.
        whole = sum(1 for end in ends[1:-1] if end <= cut)
        assert got == events[:whole], cut
        assert reader.header == HEADER
        tail_start = data.rfind(b"\n", 0, cut) + 1
        torn = cut > tail_start and cut not in ends
        warnings = list(reader.warnings)
        if torn:
            assert warnings.pop(0) == (
                f"trace ends mid-record at byte {tail_start} (the recording was cut); "
                f"replaying the {whole} whole records before it"
            ), cut
        if cut >= footer_end:
            assert reader.footer is not None
            assert warnings == [], cut
        else:
            assert reader.footer is None
            assert warnings == ["no footer: the recording did not finish"], cut


@needs_zstd
def test_cut_at_every_byte_zstd(tmp_path: Path) -> None:
    full = tmp_path / "full.trace.zst"
    data, events = small_trace(full)
    assert data.count(b"\x28\xb5\x2f\xfd") >= 6  # a frame per flushed chunk
    cut_path = tmp_path / "cut.trace.zst"
    seen = set()
    for cut in range(len(data) + 1):
        cut_path.write_bytes(data[:cut])
        try:
            got, reader = read_all(cut_path)
        except TraceFileError as exc:
            assert cut == 0 or "the header is incomplete" in str(exc), (cut, str(exc))
            continue
        assert got == events[: len(got)], cut
        seen.add(len(got))
        if cut < len(data):
            assert reader.warnings, cut
            assert any("recording" in w for w in reader.warnings)
        else:
            assert reader.warnings == []
    assert seen == set(range(len(events) + 1))


@needs_zstd
def test_damaged_zstd_frame_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.trace.zst"
    data, _ = small_trace(path)
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(TraceFileError, match="damaged zstd data"):
        read_all(path)


@needs_zstd
def test_zstd_bomb_stops_at_the_line_cap(tmp_path: Path) -> None:
    import zstandard

    path = tmp_path / "t.trace.zst"
    header = orjson.dumps(HEADER.to_record()) + b"\n"
    path.write_bytes(zstandard.ZstdCompressor().compress(header + b"x" * (64 << 20)))
    assert path.stat().st_size < 64 << 10
    with pytest.raises(TraceFileError, match="line 2: line longer than 1 MiB"):
        read_all(path)


# ---------------------------------------------------------------------------------------------
# Reader: damaged, foreign, missing


def trace_with_line(tmp_path: Path, bad: bytes, at: int = 3) -> Path:
    """A finished trace of SAMPLES with ``bad`` inserted as line ``at``."""
    path = tmp_path / "t.trace"
    write_trace(path, SAMPLES)
    lines = path.read_bytes().split(b"\n")
    lines.insert(at - 1, bad)
    path.write_bytes(b"\n".join(lines))
    return path


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"garbage", "line 3: not JSON: b'garbage'"),
        (b'{"t":"exit","ts":1', "line 3: not JSON"),
        (b'{"t":"foo","ts":1}', "line 3: unknown event kind 'foo'"),
        (b"[1,2]", "line 3: a JSON array, not a record"),
        (b"", "line 3: empty line"),
        (b'{"ts":1}', 'line 3: a record without a kind \\("t"\\)'),
        (b'{"t":7}', "line 3: the kind"),
        (b'{"t":"lost","ts":1}', "line 3: lost record lacks field 'count'"),
        (b'{"t":"lost","ts":1,"count":"2"}', "line 3: lost field 'count' must be an integer"),
        (b'{"t":"lost","ts":1,"count":true}', "got boolean"),
        (b'{"t":"lost","ts":1.5,"count":1}', "lost field 'ts' must be an integer, got number"),
        (b'{"t":"lost","ts":18446744073709551616,"count":1}', "'ts' must be an integer"),
        (b'{"t":"lost","ts":1,"count":-9223372036854775809}', "'count' must be an integer"),
        (b'{"t":"signal"}', "signal record lacks field 'ts'"),
        (b'{"t":"cgroup","ts":1,"cgroup_id":1,"path":"/","hierarchy":"x","limit_bytes":"1"}',
         "'limit_bytes' must be an integer or null, got string"),
        (b'{"t":"header","schema":1}', "line 3: a second header"),
        (b'{"t":"footer","ended_ns":1}', "line 3: malformed footer"),
        (b'{"t":"lost","ts":1,"count":1,"pad":"' + b"x" * MAX_LINE_BYTES + b'"}',
         "line 3: line longer than 1 MiB"),
        # what a block decoded as one JSON array (lines joined by commas) must not let through
        (b'{"t":"lost","ts":1,"count":1},{"t":"lost","ts":2,"count":1}', "line 3: not JSON"),
        (b'{"t":"lost","ts":1,"count":1}{"t":"lost","ts":2,"count":1}', "line 3: not JSON"),
        (b'{"t":"cg_sample","ts":1,"events":{"a":1\n"b":2}}', "line 3: not JSON"),
        (b"   ", "line 3: not JSON"),
        (b'{"t":"cg_sample","ts":1,"cgroup_id":1,"path":"/","usage_bytes":1,"limit_bytes":null,'
         b'"high_bytes":null,"peak_bytes":null,"failcnt":null,"events":{"oom_kill":1.5},'
         b'"stat":{},"psi_some_avg10":null,"psi_full_avg10":null,"psi_some_total_us":null,'
         b'"psi_full_total_us":null}',
         "line 3: malformed cg_sample record"),
    ],
)  # fmt: skip
def test_damage_in_the_middle_names_the_line(tmp_path: Path, bad: bytes, message: str) -> None:
    path = trace_with_line(tmp_path, bad)
    with pytest.raises(TraceFileError, match=message) as info:
        read_all(path)
    assert str(path) in str(info.value)
    assert info.value.fix is not None


@pytest.mark.parametrize("value", [2**64 - 1, -(2**63), 10**19, -(10**18), 10**18, -(10**17)])
def test_integers_at_the_edges_of_64_bits_read_back(tmp_path: Path, value: int) -> None:
    """What orjson writes, the reader reads: on the slow path from 20 digits (or a minus and
    19) on, on the block-at-once path below."""
    events = [msgspec.structs.replace(e, ts=value) for e in SAMPLES]
    path = tmp_path / "t.trace"
    write_trace(path, events)
    got, reader = read_all(path)
    assert got == events
    assert reader.warnings == []


def _many(n: int) -> list[Event]:
    """n events of every kind, in time order: several 1 MiB blocks of trace."""
    return [
        msgspec.structs.replace(SAMPLES[i % len(SAMPLES)], ts=12_000_000_000 + i) for i in range(n)
    ]


def test_a_trace_of_many_blocks_reads_back_whole(tmp_path: Path) -> None:
    events = _many(40_000)
    path = tmp_path / "t.trace"
    write_trace(path, events)
    assert path.stat().st_size > 3 * READ_BLOCK  # (the block-at-once path, several times)
    got, reader = read_all(path)
    assert got == events
    assert [type(e) for e in got] == [type(e) for e in events]
    assert reader.footer is not None and reader.counts == reader.footer.counts
    assert reader.warnings == []


@pytest.mark.parametrize("name", ["t.trace", pytest.param("t.trace.zst", marks=needs_zstd)])
def test_a_small_read_block_reads_the_same_events(tmp_path: Path, name: str) -> None:
    """The agent cuts incidents with a small block (less memory at once): lines cut across
    blocks, and zstd frames across reads, still give every event, in order."""
    events = _many(5_000)
    path = tmp_path / name
    write_trace(path, events)
    with TraceReader(path, block_bytes=1000) as reader:
        got = list(reader)
    assert got == events
    assert reader.footer is not None and reader.counts == reader.footer.counts
    assert reader.warnings == []


def test_damage_deep_in_a_long_trace_names_its_line(tmp_path: Path) -> None:
    events = _many(40_000)
    path = tmp_path / "t.trace"
    write_trace(path, events)
    lines = path.read_bytes().split(b"\n")
    lines[30_001] = b"garbage"  # line 30,002: header, then 30,000 events, then this
    path.write_bytes(b"\n".join(lines))
    seen: list[Event] = []
    with pytest.raises(TraceFileError, match="line 30002: not JSON"):
        seen.extend(TraceReader(path))
    assert seen == events[:30_000]


def test_damage_fix_says_how_to_salvage(tmp_path: Path) -> None:
    path = trace_with_line(tmp_path, b"garbage", at=5)
    with pytest.raises(TraceFileError) as info:
        read_all(path)
    assert info.value.fix is not None
    assert f"head -n 4 {path}" in info.value.fix


def test_events_before_the_damage_were_yielded(tmp_path: Path) -> None:
    path = trace_with_line(tmp_path, b"garbage", at=4)
    seen: list[Event] = []
    with pytest.raises(TraceFileError, match="line 4"):
        seen.extend(TraceReader(path))
    assert seen == SAMPLES[:2]


def test_record_after_the_footer(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    write_trace(path, SAMPLES)
    with path.open("ab") as f:
        f.write(orjson.dumps(SAMPLES[0].to_record()) + b"\n")
    with pytest.raises(TraceFileError, match=f"line {len(SAMPLES) + 3}: data after the footer"):
        read_all(path)
    path.write_bytes(path.read_bytes()[:-1] + b"\nx")  # unterminated junk too
    with pytest.raises(TraceFileError, match="data after the footer"):
        read_all(path)


def test_footer_counts_that_disagree_are_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    w = TraceWriter.open(path, HEADER)
    w.write_many(SAMPLES[:2])
    w.close(TraceFooter(ended_ns=1, exit="command exited", counts={"exit": 5}))
    events, reader = read_all(path)
    assert events == SAMPLES[:2]
    assert reader.warnings == [
        "the footer counts 5 exit but the trace holds 1 exit, 1 signal: records were lost or "
        "added after recording"
    ]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.trace"
    with pytest.raises(TraceFileError, match=f"no such trace file: {path}") as info:
        TraceReader(path)
    assert info.value.fix


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFileError, match="is a directory"):
        TraceReader(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    path.write_bytes(b"")
    with pytest.raises(TraceFileError, match=f"{path} is empty: the recording wrote nothing"):
        TraceReader(path)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (bytes(range(256)) * 64, "line 1: not JSON"),
        (b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 4000, "line 1: not JSON: b'\\x7fELF"),
        (b"\x1f\x8b\x08\x00rest", "gzip-compressed"),
        (b"x" * (MAX_LINE_BYTES + 10), "no line end in the first 1 MiB"),
        (b'{"level":"info","msg":"hello"}\n', "line 1: a None record, not a header"),
        (b'{"t":"exit","ts":1}\n', "line 1: a 'exit' record, not a header"),
        (b'{"t":"header","tool":"other"}\n', "line 1: a header written by 'other'"),
        (b"[1]\n", "line 1: a JSON array"),
        (b"\n\n", "line 1: empty line"),
        (b"hello world\n", "line 1: not JSON: b'hello world'"),
    ],
    ids=lambda v: v[:12].hex() if isinstance(v, bytes) else None,
)
def test_foreign_files(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "t.trace"
    path.write_bytes(content)
    with pytest.raises(TraceFileError, match="is not a whyrestart trace") as info:
        TraceReader(path)
    assert why in str(info.value)


def test_random_binary_garbage(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    path.write_bytes(os.urandom(1 << 16).replace(b"\x28\xb5", b"").lstrip(b"\x1f"))
    with pytest.raises(TraceFileError, match="is not a whyrestart trace"):
        TraceReader(path)


def test_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    rec = HEADER.to_record() | {"schema": SCHEMA_VERSION + 1, "new_thing": {}}
    path.write_bytes(orjson.dumps(rec) + b"\n")
    with pytest.raises(TraceFileError) as info:
        TraceReader(path)
    message = str(info.value)
    assert f"schema {SCHEMA_VERSION + 1}" in message
    assert f"schema {SCHEMA_VERSION} at most" in message
    assert "upgrade whyrestart" in message


def test_malformed_header(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    path.write_bytes(orjson.dumps(HEADER.to_record() | {"schema": "1"}) + b"\n")
    with pytest.raises(TraceFileError, match="line 1: malformed header: 'schema'"):
        TraceReader(path)
    rec = HEADER.to_record()
    del rec["host"]
    path.write_bytes(orjson.dumps(rec) + b"\n")
    with pytest.raises(TraceFileError, match="line 1: malformed header: 'host' must be a string"):
        TraceReader(path)


def test_reader_iterates_once_and_closes(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    write_trace(path, SAMPLES)
    with TraceReader(path) as reader:
        assert next(iter(reader)) == SAMPLES[0]
        with pytest.raises(RuntimeError, match="once"):
            iter(reader)
    assert reader._file.closed


def test_header_only_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    TraceWriter.open(path, HEADER).abort()
    t = read_trace(path)
    assert (t.header, t.events, t.footer) == (HEADER, [], None)
    assert t.warnings == ["no footer: the recording did not finish"]


# ---------------------------------------------------------------------------------------------
# Property: whatever follows a valid header, the reader answers cleanly

HEADER_LINE = orjson.dumps(HEADER.to_record()) + b"\n"
RECORD_LINES = [orjson.dumps(e.to_record()) for e in SAMPLES] + [
    orjson.dumps(TraceFooter(ended_ns=1, exit="x").to_record())
]
_tmpdir = tempfile.TemporaryDirectory(prefix="whyrestart-trace-test-")


def _check_tail(tail: bytes) -> None:
    path = os.path.join(_tmpdir.name, "prop.trace")
    with open(path, "wb") as f:
        f.write(HEADER_LINE + tail)
    try:
        reader = TraceReader(path)
        events = list(reader)
    except TraceFileError:
        return
    assert all(isinstance(e, Event) for e in events)
    assert reader.footer is not None or reader.warnings


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_any_bytes_after_a_header(tail: bytes) -> None:
    _check_tail(tail)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)  # what orjson can write
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
plausible_lines = st.one_of(
    st.sampled_from(RECORD_LINES),
    st.sampled_from(RECORD_LINES).flatmap(
        lambda line: st.integers(0, len(line)).map(lambda n: line[:n])
    ),
    st.dictionaries(
        st.sampled_from(["t", "ts", "count", "pid", "comm", "counts", "exit"]), json_values
    ).map(orjson.dumps),
    st.fixed_dictionaries(
        {"t": st.sampled_from([*KINDS, "footer", "header"])},
        optional={"ts": json_values, "count": json_values, "ended_ns": json_values},
    ).map(orjson.dumps),
    st.binary(max_size=20),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(plausible_lines, max_size=8), st.booleans())
def test_plausible_lines_after_a_header(lines: list[bytes], final_newline: bool) -> None:
    _check_tail(b"\n".join(lines) + (b"\n" if final_newline and lines else b""))


# ---------------------------------------------------------------------------------------------
# Root tier: a real full disk


@pytest.fixture
def tiny_fs() -> Iterator[Path]:
    """A 64 KiB tmpfs, mounted for the test and unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs for a real ENOSPC")
    with tempfile.TemporaryDirectory(prefix="whyrestart-enospc-") as top:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", top],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        try:
            yield Path(top)
        finally:
            subprocess.run(["umount", top], check=True)


@pytest.mark.root
@pytest.mark.parametrize("name", ["t.trace", pytest.param("t.trace.zst", marks=needs_zstd)])
def test_root_disk_full(tiny_fs: Path, name: str) -> None:
    path = tiny_fs / name
    w = TraceWriter.open(path, HEADER, flush_every=7)
    written: list[Event] = []
    with pytest.raises(OutputError) as info:
        for i in range(1_000_000):
            # Varied names so that zstd cannot shrink the records to nothing.
            event = Exec(
                ts=i, pid=i, comm="sh", filename=f"/bin/{os.urandom(8).hex()}", cgroup_id=i
            )
            written.append(event)
            w.write(event)
    message = str(info.value)
    assert "disk full (ENOSPC)" in message
    assert info.value.fix and "free space" in info.value.fix
    kept = w.events_written
    assert f"keeps its first {kept} records" in message
    assert kept > 0
    assert path.stat().st_size == w.bytes_written
    events, reader = read_all(path)
    assert events == written[:kept]
    assert reader.warnings == ["no footer: the recording did not finish"]
    if name.endswith(".trace"):
        assert path.read_bytes().endswith(b"\n")
    with pytest.raises(OutputError, match="disk full"):
        w.close(w.make_footer("command exited"))
