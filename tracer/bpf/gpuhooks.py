"""The loader of bpf/gpu.bpf.o: uprobes on CUDA driver libraries, the hold of processes that
open an unprobed one, and the object's maps.

A second object beside the main one (``tracer.bpf.hooks.KernelHooks``), through the same libbpf
wrapper: nothing here can keep the main hooks from loading. Libraries are attached one file at
a time, for every process (pid -1): the kernel keys uprobes by inode, so a library is attached
once however many processes map it, and the programs filter on the watched set. That set is the
main object's own maps when their descriptors are given (``shared``): a process is watched here
from the fork the kernel saw, not from when user space decodes it.

Per entry point, the return probe is attached before the entry probe and a pair is attached
all or nothing; frees are attached before allocations, so that no allocation the probes saw
can be freed unseen. Init entry points (cuInit, contexts) have a return probe only.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import time
from dataclasses import dataclass, field

from tracer.bpf import layout
from tracer.bpf.libbpf import BpfObject, Link, Map
from tracer.bpf.objects import default_object
from tracer.errors import BpfError
from tracer.parse.elf import ElfError, symbol_offsets

DEFAULT_OBJECT = default_object("gpu.bpf.o")

# entry point -> (entry program or None, return program or None): frees (entry only) first
# (they are attached first), then allocations (both), then CUDA starting (return only).
# tracer.gpu.libcuda lists the same entry points (a test holds them equal).
PROGRAMS: dict[str, tuple[str | None, str | None]] = {
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
    "cuInit": (None, "init_ret"),
    "cuDevicePrimaryCtxRetain": (None, "primary_ctx_retain_ret"),
    "cuCtxCreate_v2": (None, "ctx_create_ret"),
    "cuCtxCreate_v3": (None, "ctx_create_v3_ret"),
    "cuCtxCreate_v4": (None, "ctx_create_v4_ret"),
}

# Where a process about to run an unprobed libcuda is stopped: its executable mmap (gpu.bpf.c).
HOLD_PROGRAMS = ("hold_mmap",)
# Every recorder's holds (gpu.bpf.c), pinned in bpffs by this name so that recorders share it.
PEERS_MAP = "wr_gpu_peers"
# Another recorder's hold older than this is ignored (that recorder is stuck or gone, and its
# guard ends holds at this age anyway: tracer/gpu/holdguard.py MAX_HOLD_NS).
PEER_STALE_NS = 2_000_000_000
# A share whose holder is ending it (it has probed the file and is about to resume): the others
# no longer wait for it, and a holder that dies right there leaves a leftover, not nothing.
RESOLVING = 1 << 63
# A share older than this is a leftover: every live holder's guard ends its holds at
# PEER_STALE_NS (checking every 0.5 s), so its holder and its guard are gone (killed together,
# or an OOM of their cgroup) and nobody else will resume the process.
LEFTOVER_NS = 5_000_000_000


class _U32Key(ctypes.Structure):
    _fields_ = [("v", ctypes.c_uint32)]


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
    opened: bool = True  # False: the file was gone before it could be read or attached to

    @property
    def allocations_probed(self) -> int:
        return sum(1 for f in self.probed if None not in PROGRAMS[f])


class GpuHooks:
    """gpu.bpf.o loaded, with the libraries attached so far; the only owner of its links."""

    def __init__(
        self,
        config: layout.WrGpuConfig,
        path: str | None = None,
        shared: dict[str, int] | None = None,
        pin_dir: str | None = None,
    ) -> None:
        """``shared``: map name (watched_pids, watched_cgroups: defined alike in both objects)
        -> the main object's descriptor of it.
        ``pin_dir``: the bpffs directory where PEERS_MAP is shared with other recorders (None:
        a map of its own; two recorders holding one process then do not wait for each
        other)."""
        self.path = path or object_path()
        self.config = config
        self.shared = dict(shared or {})
        self._links: list[Link] = []
        self._hold_links: list[Link] = []
        self.obj = BpfObject(self.path)
        try:
            for name, fd in self.shared.items():
                self.obj.map(name).reuse_fd(fd)
            self.obj.map(PEERS_MAP).set_pin_path(f"{pin_dir}/{PEERS_MAP}" if pin_dir else None)
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
        self.watched: Map = self.obj.map("watched_pids")
        self.lost: Map = self.obj.map("gpu_lost")
        self.held_map: Map = self.obj.map("gpu_held")
        self.probed_files: Map = self.obj.map("gpu_probed_files")
        self.hold_on: Map = self.obj.map("gpu_hold_on")
        self.hold_counts: Map = self.obj.map("gpu_hold_counts")
        self.peers: Map = self.obj.map(PEERS_MAP)
        self.peers_shared = pin_dir is not None
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
                if entry is not None:
                    links.append(self.obj.program(entry).attach_uprobe(path, off, retprobe=False))
            except BpfError as exc:
                for link in links:
                    link.destroy()
                res.errors.append(f"{func}: {exc.message}")
                continue
            self._links.extend(links)
            res.probed.append(func)
        return res

    # -- holds ------------------------------------------------------------------------------

    def enable_holds(self) -> list[str]:
        """Attach the hold program (at the executable mmap) and switch holding on; what failed to
        attach (holding stays off then)."""
        errors: list[str] = []
        for name in HOLD_PROGRAMS:
            try:
                self._hold_links.append(self.obj.program(name).attach())
            except BpfError as exc:
                errors.append(exc.message)
        if self._hold_links:
            self.heartbeat()
        return errors

    def heartbeat(self) -> None:
        """Say we are resuming holds (now): the kernel takes a hold only while this is fresh
        (gpu.bpf.c WR_HEARTBEAT_STALE_NS), so a recorder that stops beating holds nobody."""
        now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        self.hold_on.update(ctypes.c_uint32(0), ctypes.c_uint64(now))

    def disable_holds(self) -> None:
        """No new hold from here on (the ones taken are still in ``held``)."""
        self.hold_on.update(ctypes.c_uint32(0), ctypes.c_uint64(0))
        for link in self._hold_links:
            link.destroy()
        self._hold_links.clear()

    def held(self) -> list[tuple[int, layout.WrGpuHold]]:
        out: list[tuple[int, layout.WrGpuHold]] = []
        for key in self.held_map.keys(_U32Key):
            assert isinstance(key, _U32Key)
            hold = layout.WrGpuHold()
            if self.held_map.lookup(ctypes.c_uint32(key.v), hold):
                out.append((key.v, hold))
        return out

    def resume(self, pid: int, now_ns: int) -> bool:
        """End this recorder's hold of ``pid``: mark its share of it as ending (RESOLVING),
        resume it (SIGCONT) unless another recorder still holds it fresh (that one resumes it),
        then forget the share and the hold. True when it was resumed here. In that order a
        death half-way leaves an entry the guard resumes from, or a share that
        ``sweep_leftovers`` finds, never a process nobody will resume; and of two recorders
        ending their holds at once, neither waits for the other."""
        me = layout.WrGpuPeerKey(tgid=pid, holder=self.config.holder)
        since = ctypes.c_uint64()
        with contextlib.suppress(BpfError):
            if self.peers.lookup(me, since):
                self.peers.update(me, ctypes.c_uint64(since.value | RESOLVING))
        if not self.held_by_others(pid, now_ns):
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, signal.SIGCONT)
            resumed = True
        else:
            resumed = False
        with contextlib.suppress(BpfError):
            self.peers.delete(me)
        with contextlib.suppress(BpfError):
            self.held_map.delete(ctypes.c_uint32(pid))
        return resumed

    def _shares(self) -> list[tuple[layout.WrGpuPeerKey, int]]:
        """Every recorder's shares of holds: (key, when it was taken | RESOLVING)."""
        out: list[tuple[layout.WrGpuPeerKey, int]] = []
        try:
            keys = self.peers.keys(layout.WrGpuPeerKey)
        except BpfError:
            return out
        for key in keys:
            assert isinstance(key, layout.WrGpuPeerKey)
            since = ctypes.c_uint64()
            if self.peers.lookup(key, since):
                out.append((key, since.value))
        return out

    def held_by_others(self, pid: int, now_ns: int) -> bool:
        for key, since in self._shares():
            if key.tgid != pid or key.holder == self.config.holder or since & RESOLVING:
                continue
            if now_ns - since < PEER_STALE_NS:
                return True
        return False

    def sweep_leftovers(self, now_ns: int, proc: str = "/proc") -> list[int]:
        """Resume the processes that a dead recorder's hold left stopped (its shares older than
        LEFTOVER_NS), and forget those shares; the pids resumed. Only a stop that is ours: the
        share says a hold of ours was taken at ``since`` and never ended, the process started
        before it (not a reused pid), and it is still in a plain group stop (state T) with no
        tracer. A debugger's stop (state t, TracerPid) or a stop of a process we never held is
        left alone (``ours_stopped``)."""
        resumed: list[int] = []
        for key, since in self._shares():
            if key.holder == self.config.holder:
                continue
            taken = since & ~RESOLVING
            if now_ns - taken < LEFTOVER_NS:
                continue
            if ours_stopped(key.tgid, taken, proc):
                with contextlib.suppress(OSError):
                    os.kill(key.tgid, signal.SIGCONT)
                    resumed.append(key.tgid)
            with contextlib.suppress(BpfError):
                self.peers.delete(key)
        return resumed

    def mark_probed(self, dev: int, ino: int) -> None:
        """No more holds for this file (as the kernel names it: a hold's ``file``)."""
        self.probed_files.update(layout.WrGpuFile(dev=dev, ino=ino), ctypes.c_uint8(1))

    def hold_counts_now(self) -> tuple[int, int, int, int]:
        """(holds taken, holds that could not be taken, openers spared because our heartbeat
        was stale, openers spared because they are traced) so far."""
        return (
            self.hold_counts.percpu_sum_u64(0),
            self.hold_counts.percpu_sum_u64(1),
            self.hold_counts.percpu_sum_u64(2),
            self.hold_counts.percpu_sum_u64(3),
        )

    # -- maps -------------------------------------------------------------------------------

    def watch_pid(self, pid: int) -> None:
        self.watched.update(ctypes.c_uint32(pid), ctypes.c_uint8(1))

    def forget_pid(self, pid: int) -> None:
        """A process ended: stop watching its pid (it may be reused) and drop its bookkeeping.
        The pid filter is left alone when it is the main object's (it forgets exits itself)."""
        if "watched_pids" not in self.shared:
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
        links = self._hold_links + self._links
        self._hold_links.clear()
        self._links.clear()
        # (one after the other: each detach waits for the kernel, ~80 ms here, and detaching
        # from several threads at once was no faster: the kernel serialises them)
        for link in links:
            link.destroy()
        self.obj.close()


def ours_stopped(pid: int, held_at_ns: int, proc: str = "/proc") -> bool:
    """``pid`` is the process a hold taken at ``held_at_ns`` (CLOCK_BOOTTIME) stopped, and it
    is still in that stop: a group stop (state T; a ptrace stop is t) with no tracer attached,
    of a process that started before the hold (its pid not reused since)."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"{proc}/{pid}/status") as f:
            tracer = next((ln.split()[1] for ln in f if ln.startswith("TracerPid:")), "0")
    except (OSError, IndexError):
        return False
    # fields[0] is stat's 3rd field (state); starttime is the 22nd: clock ticks since boot,
    # CLOCK_BOOTTIME like the hold's time
    started_ns = int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return fields[0] == "T" and tracer == "0" and started_ns <= held_at_ns


def read_symbol_offsets(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """``symbol_offsets`` of a file, mapped rather than read: libcuda is tens of MiB and only
    its headers and symbol tables are looked at."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 64:
            raise ElfError("not an ELF file")
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            return symbol_offsets(mm, names)
