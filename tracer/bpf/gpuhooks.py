"""The loader of bpf/gpu.bpf.o: uprobes on CUDA driver libraries, and the object's maps.

A second object beside the main one (``tracer.bpf.hooks.KernelHooks``), through the same libbpf
wrapper: nothing here can keep the main hooks from loading. Libraries are attached one file at
a time, for every process (pid -1): the kernel keys uprobes by inode, so a library is attached
once however many processes map it, and the programs filter on ``gpu_watched``.

Per entry point, the return probe is attached before the entry probe and a pair is attached
all or nothing; frees are attached before allocations, so that no allocation the probes saw
can be freed unseen.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass, field

from tracer.bpf import layout
from tracer.bpf.libbpf import BpfObject, Link, Map
from tracer.errors import BpfError
from tracer.parse.elf import ElfError, symbol_offsets

DEFAULT_OBJECT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "bpf",
    "gpu.bpf.o",
)

# entry point -> (entry program, return program or None for frees); frees first (they are
# attached first). tracer.gpu.libcuda lists the same entry points (a test holds them equal).
PROGRAMS: dict[str, tuple[str, str | None]] = {
    "cuMemFree_v2": ("mem_free", None),
    "cuMemFreeAsync": ("mem_free_async", None),
    "cuMemFreeAsync_ptsz": ("mem_free_async_ptsz", None),
    "cuMemRelease": ("mem_release", None),
    "cuMemAlloc_v2": ("mem_alloc", "mem_alloc_ret"),
    "cuMemAllocManaged": ("mem_alloc_managed", "mem_alloc_managed_ret"),
    "cuMemAllocPitch_v2": ("mem_alloc_pitch", "mem_alloc_pitch_ret"),
    "cuMemAllocAsync": ("mem_alloc_async", "mem_alloc_async_ret"),
    "cuMemAllocAsync_ptsz": ("mem_alloc_async_ptsz", "mem_alloc_async_ptsz_ret"),
    "cuMemAllocFromPoolAsync": ("mem_alloc_pool", "mem_alloc_pool_ret"),
    "cuMemAllocFromPoolAsync_ptsz": ("mem_alloc_pool_ptsz", "mem_alloc_pool_ptsz_ret"),
    "cuMemCreate": ("mem_create", "mem_create_ret"),
}


def object_path() -> str:
    return os.environ.get("WHYRESTART_GPU_BPF_OBJECT", DEFAULT_OBJECT)


@dataclass
class AttachedLibrary:
    """What attaching one library gave: entry points probed, missing from it, or sharing the
    code of another (probed once, under the first name), and any error."""

    path: str
    probed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def allocations_probed(self) -> int:
        return sum(1 for f in self.probed if PROGRAMS[f][1] is not None)


class GpuHooks:
    """gpu.bpf.o loaded, with the libraries attached so far; the only owner of its links."""

    def __init__(self, config: layout.WrGpuConfig, path: str | None = None) -> None:
        self.path = path or object_path()
        self.config = config
        self._links: list[Link] = []
        self.obj = BpfObject(self.path)
        try:
            rodata = self.obj.map(".rodata").initial_value()
            want = ctypes.sizeof(config)
            if len(rodata) < want:
                raise BpfError(f"configuring {self.path}: .rodata is {len(rodata)} bytes", 22)
            ctypes.memmove(rodata, ctypes.byref(config), want)
            self.obj.load()
        except BpfError:
            self.obj.close()
            raise
        self.events: Map = self.obj.map("gpu_events")
        self.watched: Map = self.obj.map("gpu_watched")
        self.lost: Map = self.obj.map("gpu_lost")
        self.stats_map: Map = self.obj.map("gpu_stats")
        self.live: Map = self.obj.map("gpu_live")

    def attach_library(self, path: str, shown_as: str | None = None) -> AttachedLibrary:
        """Probe every entry point ``path`` exports. ``shown_as`` names the file in messages
        (path is often a /proc/PID/map_files link)."""
        res = AttachedLibrary(shown_as or path)
        try:
            offsets = read_symbol_offsets(path, tuple(PROGRAMS))
        except (OSError, ElfError) as exc:
            res.errors.append(f"reading {res.path}: {exc}")
            return res
        by_offset: dict[int, str] = {}
        for func, (entry, ret) in PROGRAMS.items():
            off = offsets.get(func)
            if off is None:
                res.missing.append(func)
                continue
            if off in by_offset:
                res.aliases[func] = by_offset[off]
                continue
            by_offset[off] = func
            links: list[Link] = []
            try:
                if ret is not None:
                    links.append(self.obj.program(ret).attach_uprobe(path, off, retprobe=True))
                links.append(self.obj.program(entry).attach_uprobe(path, off, retprobe=False))
            except BpfError as exc:
                for link in links:
                    link.destroy()
                res.errors.append(f"{func}: {exc.message}")
                continue
            self._links.extend(links)
            res.probed.append(func)
        return res

    # -- maps -------------------------------------------------------------------------------

    def watch_pid(self, pid: int) -> None:
        self.watched.update(ctypes.c_uint32(pid), ctypes.c_uint8(1))

    def forget_pid(self, pid: int) -> None:
        """A process ended: stop watching its pid (it may be reused) and drop its bookkeeping."""
        self.watched.delete(ctypes.c_uint32(pid))
        if self.stats(pid) is None:
            return
        self.stats_map.delete(ctypes.c_uint32(pid))
        for key in self.live.keys(layout.WrGpuLiveKey):
            assert isinstance(key, layout.WrGpuLiveKey)
            if key.tgid == pid:
                self.live.delete(key)

    def stats(self, pid: int) -> layout.WrGpuStats | None:
        st = layout.WrGpuStats()
        return st if self.stats_map.lookup(ctypes.c_uint32(pid), st) else None

    def lost_count(self) -> int:
        return self.lost.percpu_sum_u64(0)

    def close(self) -> None:
        for link in self._links:
            link.destroy()
        self._links.clear()
        self.obj.close()


def read_symbol_offsets(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """``symbol_offsets`` of a file, mapped rather than read: libcuda is tens of MiB and only
    its headers and symbol tables are looked at."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 64:
            raise ElfError("not an ELF file")
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            return symbol_offsets(mm, names)
