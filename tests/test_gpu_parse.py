"""Tier 1: the pure GPU parsers: the driver's Xid kernel-log lines, /proc/PID/maps and ldconfig
for libcuda, the ELF symbol lookup that places the uprobes, and the GPU ring-buffer decoders."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.gpu import build
from tracer.bpf import gpuhooks, layout
from tracer.bpf.decode import Decoder
from tracer.events import GpuAllocFailure, GpuCallFailure, GpuLost, GpuOomRecovered, GpuXid
from tracer.gpu import libcuda
from tracer.parse import cuda, elf, xid
from tracer.parse import libcuda as parse_libcuda
from tracer.parse.kmsg import parse_record

# -- Xid lines -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            xid.XidLine(79, "0000:3b:00", 1234, "python3", "GPU has fallen off the bus."),
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 31, pid=2279, name=python, Ch 00000008, intr 00000000."
            " MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2b_4a000000.",
            xid.XidLine(
                31,
                "0000:3b:00",
                2279,
                "python",
                "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted"
                " @ 0x7f2b_4a000000.",
            ),
        ),
        (
            "NVRM: Xid (PCI:0000:00:1e): 43, pid=3415, Ch 00000010",
            xid.XidLine(43, "0000:00:1e", 3415, "", "Ch 00000010"),
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception",
            xid.XidLine(13, "0000:3b:00", None, "", "Graphics Exception"),
        ),
        (
            # older drivers name no process
            "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            xid.XidLine(79, "0000:3b:00", None, "", "GPU has fallen off the bus."),
        ),
        (
            "NVRM: Xid (0000:86:00): 119, pid=88, name=nvidia-smi, Timeout waiting for RPC",
            xid.XidLine(119, "0000:86:00", 88, "nvidia-smi", "Timeout waiting for RPC"),
        ),
        ("[  123.456] NVRM: Xid (PCI:0000:3b:00): 48", xid.XidLine(48, "0000:3b:00", None, "", "")),
    ],
)
def test_xid_lines(line: str, expected: xid.XidLine) -> None:
    assert xid.parse_xid_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:3b:00: GPU-2c3f...",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: Xid (PCI:0000:3b:00): not-a-number",
        "usb 1-1: new high-speed USB device",
        "",
    ],
)
def test_other_lines_are_not_xids(line: str) -> None:
    assert xid.parse_xid_line(line) is None


def test_fallen_off_the_bus_line() -> None:
    assert xid.parse_lost_line("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.") == (
        "0000:3b:00.0"
    )
    assert xid.parse_lost_line("NVRM: GPU 0000:3b:00.0: RmInitAdapter failed!") is None


def test_kernel_log_records_become_events() -> None:
    rec = parse_record(
        b"3,1201,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=77, name=python3, "
        b"GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    )
    assert rec is not None
    assert xid.event_from_kmsg(rec, 42) == GpuXid(
        ts=42,
        xid=79,
        device="0000:3b:00",
        device_index=None,
        pid=77,
        proc_name="python3",
        message="GPU has fallen off the bus.",
        source="kmsg",
    )
    rec = parse_record(b"4,1202,5000100,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    assert rec is not None
    assert xid.event_from_kmsg(rec, 43) == GpuLost(
        ts=43, device="0000:3b:00.0", device_index=None, reason="fallen_off_bus", source="kmsg"
    )
    rec = parse_record(b"6,1203,5000200,-;eth0: link up")
    assert rec is not None and xid.event_from_kmsg(rec, 44) is None


def test_lines_written_from_user_space_are_ignored() -> None:
    # <11> = LOG_USER | LOG_ERR: what `echo '<3>NVRM: ...' > /dev/kmsg` becomes (the kernel
    # forces the user facility), so nobody forges a device reset into a verdict
    rec = parse_record(b"11,1204,5000300,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off")
    assert rec is not None and rec.facility == 1
    assert xid.event_from_kmsg(rec, 45) is None


def test_xid_catalogue_classes() -> None:
    assert {31, 43} == set(xid.APP_FAULT_XIDS)
    assert 79 in xid.DEVICE_LOST_XIDS
    assert "fallen off the bus" in xid.xid_meaning(79)
    assert "catalogue" in xid.xid_meaning(9999)


# -- /proc/PID/maps and ldconfig ---------------------------------------------------------------

MAPS = """\
55d1c2a00000-55d1c2a01000 r--p 00000000 fd:01 1311 /usr/bin/python3.11
7f1a20000000-7f1a20400000 r--p 00000000 fd:01 2645170 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f1a20400000-7f1a21c00000 r-xp 00400000 fd:01 2645170 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f1a30000000-7f1a30010000 r-xp 00000000 00:2e 77 /opt/app/lib/libcuda.so.1 (deleted)
7f1a40000000-7f1a40001000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libcudart.so.12.2.140
7f1a50000000-7f1a50001000 r-xp 00000000 fd:01 98 /usr/lib/x86_64-linux-gnu/libcuda_fake_helper.so
7f1a60000000-7f1a60001000 rw-p 00000000 00:00 0 [heap]
7ffd0000-7ffd1000 rw-p 00000000 00:00 0
garbage line
"""


def test_maps_finds_each_libcuda_file_once() -> None:
    found = parse_libcuda.parse_maps(MAPS)
    assert [(m.path, m.inode, m.start, m.end, m.deleted) for m in found] == [
        (
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
            2645170,
            0x7F1A20000000,
            0x7F1A20400000,
            False,
        ),
        ("/opt/app/lib/libcuda.so.1", 77, 0x7F1A30000000, 0x7F1A30010000, True),
    ]
    assert found[0].key == (os.makedev(0xFD, 0x01), 2645170)
    assert found[1].dev == os.makedev(0, 0x2E)


def test_libcuda_names() -> None:
    assert parse_libcuda.is_libcuda("/usr/lib64/libcuda.so")
    assert parse_libcuda.is_libcuda("libcuda.so.1")
    assert not parse_libcuda.is_libcuda("/usr/lib/libcudart.so.12")
    assert not parse_libcuda.is_libcuda("/usr/lib/libcuda.so.1.bak")


def test_ldconfig_output() -> None:
    text = """\
1024 libs found in cache `/etc/ld.so.cache'
\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
"""
    assert parse_libcuda.parse_ldconfig(text) == [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/i386-linux-gnu/libcuda.so.1",
    ]


def test_maps_of_this_process_and_of_a_missing_one() -> None:
    assert libcuda.mappings_of(os.getpid()) == []  # the test runner maps no libcuda
    assert libcuda.mappings_of(2**22 + 12345) == []  # no such process


# -- ELF symbol offsets ------------------------------------------------------------------------

needs_gcc = pytest.mark.skipif(build.gcc() is None, reason="no C compiler (gcc) to build .so")

ALIASES_C = """
int real_one(int x) { return x * 3 + 1; }
int alias_one(int x) __attribute__((alias("real_one")));
int other(int x) { return x - 7; }
static int hidden(int x) { return x; }
int (*keep)(int) = hidden;
"""


def _readelf_offsets(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    """Symbol file offsets as binutils sees them (vaddr translated through the PT_LOADs)."""
    syms = subprocess.run(
        ["readelf", "-sW", "--dyn-syms", str(path)], check=True, capture_output=True, text=True
    ).stdout
    loads = []
    for line in subprocess.run(
        ["readelf", "-lW", str(path)], check=True, capture_output=True, text=True
    ).stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD":
            loads.append((int(parts[2], 16), int(parts[5], 16), int(parts[1], 16)))
    out: dict[str, int] = {}
    for line in syms.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "FUNC" and parts[6] != "UND":
            name = parts[7].split("@")[0]
            if name in names and name not in out:
                value = int(parts[1], 16)
                for vaddr, size, off in loads:
                    if vaddr <= value < vaddr + size:
                        out[name] = value - vaddr + off
    return out


@needs_gcc
@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")
def test_symbol_offsets_agree_with_binutils(tmp_path: Path) -> None:
    lib = build.libcuda(tmp_path)
    names = (*cuda.ALLOC_FUNCTIONS, *cuda.FREE_FUNCTIONS, "cuInit", "cuNoSuchThing")
    mine = gpuhooks.read_symbol_offsets(str(lib), names)
    assert set(mine) == set(names) - {"cuNoSuchThing"}
    assert mine == _readelf_offsets(lib, names)
    # the twins with identical bodies stayed apart (the stand-in is built for that)
    assert mine["cuMemAllocAsync"] != mine["cuMemAllocAsync_ptsz"]


@needs_gcc
def test_aliases_share_one_offset(tmp_path: Path) -> None:
    src = tmp_path / "a.c"
    src.write_text(ALIASES_C)
    so = tmp_path / "liba.so"
    subprocess.run(
        [str(build.gcc()), "-shared", "-fPIC", "-O1", "-o", str(so), str(src)], check=True
    )
    offs = gpuhooks.read_symbol_offsets(str(so), ("real_one", "alias_one", "other", "hidden"))
    assert offs["real_one"] == offs["alias_one"] != offs["other"]
    assert "hidden" not in offs  # a static function (in .symtab) is no entry point
    # the offset points at the code ctypes calls
    dll = ctypes.CDLL(str(so))
    assert dll.alias_one(4) == 13


def test_not_elf_and_wrong_class_are_errors(tmp_path: Path) -> None:
    with pytest.raises(elf.ElfError, match="not an ELF"):
        elf.symbol_offsets(b"#!/bin/sh\n" + b"\0" * 80, ("x",))
    with pytest.raises(elf.ElfError, match="64-bit"):
        elf.symbol_offsets(b"\x7fELF\x01\x01" + b"\0" * 80, ("x",))
    with pytest.raises(elf.ElfError, match="truncated"):
        # a 64-bit header whose program headers lie beyond the end
        head = bytearray(b"\x7fELF\x02\x01" + b"\0" * 58)
        head[32:40] = (10_000).to_bytes(8, "little")  # e_phoff
        head[54:56] = (56).to_bytes(2, "little")  # e_phentsize
        head[56:58] = (1).to_bytes(2, "little")  # e_phnum
        elf.symbol_offsets(bytes(head), ("x",))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(elf.ElfError):
        gpuhooks.read_symbol_offsets(str(empty), ("x",))


# -- ring-buffer records ------------------------------------------------------------------------


def _record(kind: int, func: int, result: int) -> bytes:
    rec = layout.WrGpuAlloc(
        h=layout.WrHdr(
            type=kind,
            size=ctypes.sizeof(layout.WrGpuAlloc),
            rung=layout.RUNG_UPROBE,
            ts_ns=5_000_000_000,
            pid=4243,
            tgid=4242,
            cgroup_id=777,
            comm=b"pt_main_thread",
        ),
        requested=2 << 30,
        held_bytes=78 << 30,
        peak_bytes=79 << 30,
        failures=3,
        func=func,
        result=result,
    )
    return bytes(rec)


# What every ``_record`` decodes to, whatever its kind (the thread's process is the pid)...
DECODED: dict[str, Any] = {
    "ts": 5_000_000_000,
    "pid": 4242,
    "tid": 4243,
    "comm": "pt_main_thread",
    "cgroup_id": 777,
    "requested_bytes": 2 << 30,
    "failures": 3,
}
# ... and the allocation kinds' bookkeeping as well
HELD = {"held_bytes": 78 << 30, "peak_bytes": 79 << 30}


def test_decode_failure() -> None:
    ev = Decoder().decode(_record(layout.EV_GPU_ALLOC_FAIL, 8, 2))
    assert ev == GpuAllocFailure(**DECODED, **HELD, function="cuMemCreate", result=2)


def test_decode_recovery() -> None:
    ev = Decoder().decode(_record(layout.EV_GPU_ALLOC_RECOVERED, 4, 0))
    assert ev == GpuOomRecovered(**DECODED, **HELD, function="cuMemAllocAsync")


def test_decode_unknown_function_and_short_record() -> None:
    d = Decoder()
    ev = d.decode(_record(layout.EV_GPU_ALLOC_FAIL, 99, 2))
    assert isinstance(ev, GpuAllocFailure) and ev.function == "func99"
    assert d.decode(_record(layout.EV_GPU_ALLOC_FAIL, 1, 2)[:-8]) is None
    assert (d.malformed, d.unknown) == (1, 0)


def test_every_function_number_has_a_probe_program() -> None:
    assert set(layout.GPU_FUNCS.values()) == {*cuda.ALLOC_FUNCTIONS, *cuda.INIT_FUNCTIONS}
    # the frees first: they are attached before the allocations
    assert tuple(gpuhooks.PROGRAMS) == (
        cuda.FREE_FUNCTIONS + cuda.ALLOC_FUNCTIONS + cuda.INIT_FUNCTIONS
    )
    assert all(ret is None for f, (_, ret) in gpuhooks.PROGRAMS.items() if f in cuda.FREE_FUNCTIONS)
    assert all(
        e is not None and re.fullmatch(r"mem_\w+", e)
        for f, (e, _) in gpuhooks.PROGRAMS.items()
        if f not in cuda.INIT_FUNCTIONS
    )
    # CUDA starting: only the result matters, a return probe alone
    assert all(gpuhooks.PROGRAMS[f][0] is None for f in cuda.INIT_FUNCTIONS)


def test_decode_call_failure() -> None:
    ev = Decoder().decode(_record(layout.EV_GPU_CALL_FAIL, 9, 100))
    assert ev == GpuCallFailure(**DECODED, function="cuInit", result=100)
