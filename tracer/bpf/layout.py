"""Python mirror of ``bpf/events.h``: one ctypes structure per C struct, nothing else.

tests/test_layout.py checks every size and offset here against the BTF of the compiled object,
so a change on one side without the other fails a test instead of corrupting events. The
decoder derives its ``struct`` formats from these definitions, so the layout exists once.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

COMM_LEN = 16
FILENAME_LEN = 128

EV_EXIT, EV_SIGNAL, EV_OOM, EV_FORK, EV_EXEC, EV_STALL, EV_CGROUP_MKDIR = 1, 2, 3, 4, 5, 6, 7
CGROUP_PATH_LEN = 256
SIGF_SENDER_EXITING = 1  # WR_SIGF_SENDER_EXITING: wr_signal.flags
SIG_SLOTS = 65  # WR_SIG_SLOTS: signals_unsent's slots (signal numbers 1..64; 0: out of range)

STALL_KINDS = {1: "memcg", 2: "direct", 3: "high", 4: "external"}

RUNG_NAMES = {1: "fentry", 2: "kprobe", 3: "tp_btf", 4: "tracepoint"}

# wr_oom.constraint (enum wr_oom_constraint): the kernel's oom_constraint, "" where not read
OOM_CONSTRAINTS = {0: "", 1: "none", 2: "cpuset", 3: "mempolicy", 4: "memcg"}
OOM_EXITING = 1  # wr_oom.flags: the victim was already exiting by itself (marked, not killed)
OOM_MEMSW = 2  # wr_oom.flags: limit and usage are the memory+swap counter's (v1 memsw)

u16, u32, s32, u64 = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64


class WrHdr(ctypes.Structure):
    _fields_ = [
        ("type", u16),
        ("size", u16),
        ("rung", u16),
        ("_pad", u16),
        ("ts_ns", u64),
        ("pid", u32),
        ("tgid", u32),
        ("cgroup_id", u64),
        ("comm", ctypes.c_char * COMM_LEN),
    ]


class WrExit(ctypes.Structure):
    _fields_ = [("h", WrHdr), ("exit_code", u32), ("ppid", u32), ("start_ns", u64)]


class WrSignal(ctypes.Structure):
    _fields_ = [
        ("h", WrHdr),
        ("target_pid", u32),
        ("sig", s32),
        ("si_code", s32),
        ("result", s32),
        ("group", u32),
        ("flags", u32),
        ("target_comm", ctypes.c_char * COMM_LEN),
    ]


class WrOom(ctypes.Structure):
    _fields_ = [
        ("h", WrHdr),
        ("victim_pid", u32),
        ("memcg", u32),
        ("victim_cgroup_id", u64),
        ("limit_cgroup_id", u64),
        ("limit_pages", u64),
        ("usage_pages", u64),
        ("victim_comm", ctypes.c_char * COMM_LEN),
        ("constraint", u32),
        ("flags", u32),
    ]


class WrFork(ctypes.Structure):
    _fields_ = [("h", WrHdr), ("child_pid", u32), ("_pad", u32)]


class WrExec(ctypes.Structure):
    _fields_ = [("h", WrHdr), ("filename", ctypes.c_char * FILENAME_LEN)]


class WrStall(ctypes.Structure):
    _fields_ = [
        ("h", WrHdr),
        ("memcg_id", u64),
        ("duration_ns", u64),
        ("reclaimed_pages", u64),
        ("kind", u32),
        ("_pad", u32),
    ]


class WrCgroupMkdir(ctypes.Structure):
    _fields_ = [
        ("h", WrHdr),
        ("id", u64),
        ("level", u32),
        ("hierarchy_id", u32),
        ("path", ctypes.c_char * CGROUP_PATH_LEN),
    ]


class WrReclaimKey(ctypes.Structure):
    _fields_ = [("cgroup_id", u64), ("kind", u32), ("_pad", u32)]


class WrReclaimStats(ctypes.Structure):
    _fields_ = [
        ("count", u64),
        ("total_ns", u64),
        ("max_ns", u64),
        ("reclaimed_pages", u64),
    ]


class WrConfig(ctypes.Structure):
    _fields_ = [
        ("filter_all", u32),
        ("memcg_v1", u32),
        ("self_tgid", u32),
        ("watch_cgroups", u32),
        ("stall_threshold_ns", u64),
        ("follow_cgroups", u32),
        ("hierarchy_id", u32),
        ("agent_filter", u32),
        ("_pad", u32),
    ]


class CgroupKey(ctypes.Structure):
    """A map key that is a cgroup id (clean_exits)."""

    _fields_ = [("id", u64)]


# --- GPU: bpf/gpu.bpf.c, a separate object (its records share WrHdr) --------------------------

EV_GPU_ALLOC_FAIL, EV_GPU_ALLOC_RECOVERED, EV_GPU_CALL_FAIL = 16, 17, 18
RUNG_UPROBE = 5  # WR_RUNG_UPROBE: the hdr.rung of gpu.bpf.o's records
RUNG_NAMES[RUNG_UPROBE] = "uprobe"

# enum wr_gpu_func -> the libcuda entry point it stands for
GPU_FUNCS = {
    1: "cuMemAlloc_v2",
    2: "cuMemAllocManaged",
    3: "cuMemAllocPitch_v2",
    4: "cuMemAllocAsync",
    5: "cuMemAllocAsync_ptsz",
    6: "cuMemAllocFromPoolAsync",
    7: "cuMemAllocFromPoolAsync_ptsz",
    8: "cuMemCreate",
    9: "cuInit",
    10: "cuDevicePrimaryCtxRetain",
    11: "cuCtxCreate_v2",
    12: "cuCtxCreate_v3",
    13: "cuCtxCreate_v4",
}


class WrGpuAlloc(ctypes.Structure):
    _fields_ = [
        ("h", WrHdr),
        ("requested", u64),
        ("held_bytes", u64),
        ("peak_bytes", u64),
        ("failures", u64),
        ("func", u32),
        ("result", s32),
    ]


class WrGpuStats(ctypes.Structure):
    _fields_ = [
        ("held_bytes", u64),
        ("peak_bytes", u64),
        ("allocs", u64),
        ("failures", u64),
        ("pending", u64),
        ("untracked", u64),
        ("call_failures", u64),
    ]


class WrGpuLiveKey(ctypes.Structure):
    _fields_ = [("tgid", u32), ("_pad", u32), ("ptr", u64)]


class WrGpuFile(ctypes.Structure):
    _fields_ = [("dev", u64), ("ino", u64)]


class WrGpuHold(ctypes.Structure):
    _fields_ = [("file", WrGpuFile), ("ts_ns", u64), ("fd", s32), ("_pad", u32)]


class WrGpuPeerKey(ctypes.Structure):
    _fields_ = [("tgid", u32), ("holder", u32)]


class WrGpuConfig(ctypes.Structure):
    _fields_ = [
        ("filter_all", u32),
        ("memcg_v1", u32),
        ("self_tgid", u32),
        ("watch_cgroups", u32),
        ("holder", u32),
        ("_pad", u32),
    ]


# C struct name -> mirror, for the layout test.
STRUCTS: dict[str, type[ctypes.Structure]] = {
    "wr_hdr": WrHdr,
    "wr_exit": WrExit,
    "wr_signal": WrSignal,
    "wr_oom": WrOom,
    "wr_fork": WrFork,
    "wr_exec": WrExec,
    "wr_stall": WrStall,
    "wr_cgroup_mkdir": WrCgroupMkdir,
    "wr_reclaim_key": WrReclaimKey,
    "wr_reclaim_stats": WrReclaimStats,
    "wr_config": WrConfig,
}

# The GPU object's structs, checked against bpf/gpu.bpf.o's BTF (wr_hdr is in both objects).
GPU_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "wr_hdr": WrHdr,
    "wr_gpu_alloc": WrGpuAlloc,
    "wr_gpu_stats": WrGpuStats,
    "wr_gpu_live_key": WrGpuLiveKey,
    "wr_gpu_file": WrGpuFile,
    "wr_gpu_hold": WrGpuHold,
    "wr_gpu_peer_key": WrGpuPeerKey,
    "wr_gpu_config": WrGpuConfig,
}
STRUCTS.update(GPU_STRUCTS)

_CODES: dict[Any, str] = {u16: "H", u32: "I", s32: "i", u64: "Q"}


def _format_of(cls: type[ctypes.Structure]) -> str:
    out = ""
    for spec in cls._fields_:
        ctype = spec[1]
        if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
            out += _format_of(ctype)
        elif isinstance(ctype, type) and issubclass(ctype, ctypes.Array):
            out += f"{ctypes.sizeof(ctype)}s"
        else:
            out += _CODES[ctype]
    return out


def struct_of(cls: type[ctypes.Structure]) -> struct.Struct:
    """A native-order ``struct.Struct`` with the same layout (checked: sizes must agree)."""
    st = struct.Struct("=" + _format_of(cls))
    if st.size != ctypes.sizeof(cls):
        raise AssertionError(f"{cls.__name__}: padding the struct format does not express")
    return st
