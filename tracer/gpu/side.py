"""The recorder's GPU side: one object that owns everything GPU during a recording.

``GpuSide`` loads bpf/gpu.bpf.o (``tracer.bpf.gpuhooks``), probes the host's libcuda.so.1 at
once, starts the NVML sampler (``tracer.gpu.nvml``), and then, from the recorder's loop:

* learns the watched processes (``watch`` for the seeds, ``track`` for the Fork/Exec/Exit events
  the main object sends) and mirrors them into the GPU object's pid filter;
* looks into /proc/PID/maps of watched processes for a libcuda they map (each new process at
  once, the others every second, a bounded number per call so a fork storm cannot stall the
  loop) and probes every library file it maps: a GPU process is covered from then on
  (each real file once: ``tracer.gpu.libraries``);
* resumes the processes the kernel held because they were loading a libcuda file nobody probed yet,
  once that file is probed (``tracer.gpu.holds``);
* hands back, from ``poll``, the GPU object's ring-buffer records, NVML's samples and events,
  and one ``GpuLibrary`` event per process that maps a driver library.

(The driver's kernel-log lines become Xid and lost-GPU events in the kernel-log source,
``tracer.pipeline.sources.KmsgSource``, through ``tracer.parse.xid``.)

Nothing here is fatal: without the BPF object, uprobes or NVML the recording goes on, and
``describe`` (written into the trace header) says what is missing and why.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from tracer.bpf import layout
from tracer.bpf.decode import Decoder
from tracer.bpf.gpuhooks import AttachedLibrary, GpuHooks
from tracer.bpf.libbpf import RingBuffer
from tracer.clock import boottime_ns
from tracer.errors import WhyrestartError
from tracer.events import (
    Event,
    Exec,
    Exit,
    Fork,
    GpuAllocFailure,
    GpuCallFailure,
    GpuLibrary,
    GpuOomRecovered,
    Lost,
)
from tracer.gpu import libcuda
from tracer.gpu.holds import Holds
from tracer.gpu.libraries import Libraries
from tracer.gpu.nvml import DEFAULT_INTERVAL_S, Clock, GpuSampler, open_nvml
from tracer.sources import system

__all__ = ["SCAN_INTERVAL_NS", "GpuSide"]

SCAN_INTERVAL_NS = 1_000_000_000
# /proc/PID/maps of a large process takes ~1 ms to read and parse: this many per call keeps a
# 10 ms loop responsive whatever the number of watched processes ...
MAX_SCANS_PER_POLL = 16
# ... and this many second looks per round bounds the cost on a host with thousands of
# processes (--all): they are looked at in turn, every few seconds each, instead.
MAX_RESCANS_PER_ROUND = 256
# A process not mapping libcuda is looked at again every round (every second) by default. With
# a longer ``rescan_max_gap_ns`` (the always-on agent's) the gap doubles after each look, up to
# it: a node's hundred long-running non-GPU servers are not read every second (a large
# process's maps take ~1 ms), and an unprobed libcuda loaded between looks is still held by
# the kernel until it is probed (``hold``).


class GpuSide:
    """See the module docstring. Always ``close()`` it. The GPU object, the library scans, the
    holds and NVML share one watched set and one pid filter: one owner (the recorder only sees
    its source, ``tracer.pipeline.sources.GpuSource``)."""

    def __init__(
        self,
        *,
        filter_all: bool,
        memcg_v1: bool,
        nvml_interval_s: float = DEFAULT_INTERVAL_S,
        nvml_library: str | None = None,
        object_path: str | None = None,
        attach_host: bool = True,
        proc: str = "/proc",
        clock: Clock = boottime_ns,
        shared_maps: dict[str, int] | None = None,
        watch_cgroups: bool = False,
        hold: bool = True,
        rescan_max_gap_ns: int = SCAN_INTERVAL_NS,
    ) -> None:
        """``shared_maps``: the main object's watched_pids / watched_cgroups descriptors (the
        GPU programs then watch exactly what it watches, from the fork on); without them this
        side fills its own pid filter from ``watch``/``track``. ``hold``: stop processes that
        load an unprobed libcuda until it is probed."""
        self.filter_all = filter_all
        self.shared = dict(shared_maps or {})
        self.proc = proc
        self.clock = clock
        self.warnings: list[str] = []
        self.decoder = Decoder()
        self.hooks: GpuHooks | None = None
        self.hooks_error: str | None = None
        self._rb: RingBuffer | None = None
        config = layout.WrGpuConfig(
            filter_all=int(filter_all),
            memcg_v1=int(memcg_v1),
            self_tgid=os.getpid(),
            watch_cgroups=int(watch_cgroups),
            # this recorder among those sharing the holds map (two in one process are two)
            holder=int.from_bytes(os.urandom(4), "little") | 1,
        )
        self._open_hooks(config, object_path, hold)
        self.libraries = Libraries(self.hooks, self.hooks_error, proc)
        self._host: dict[str, str] = {}
        if self.hooks is not None and attach_host:
            for path in libcuda.host_libraries():
                self._host[path] = self.libraries.host(path)
        self.holds: Holds | None = None
        self._held_events: list[Event] = []  # from resume_held, for the next poll
        if self.hooks is not None:
            self.holds = Holds(self.hooks, self.libraries, proc, clock, self.warnings)
            if hold:
                self.holds.start()
            self.holds.sweep()
        library = nvml_library or os.environ.get("WHYRESTART_NVML_LIBRARY") or None
        self.nvml: GpuSampler = open_nvml(nvml_interval_s, library, clock)
        self.nvml.set_pids(None if filter_all else frozenset())
        self.nvml.start()

        self._watched: set[int] = set()
        self._covered: dict[int, int] = {}  # pid -> when its libcuda was found
        self._gpu_pids: set[int] = set()  # pids with GPU bookkeeping in the BPF maps
        self._queue: deque[int] = deque()
        self._queued: set[int] = set()  # the live entries of _queue (an exit removes one)
        self._rescan_after = 0  # where the last round of second looks stopped (a pid)
        self._rescan_max_gap_ns = rescan_max_gap_ns
        self._next_look: dict[int, tuple[int, int]] = {}  # pid -> (due, gap) of its next look
        self._next_scan = clock() + SCAN_INTERVAL_NS
        self._pids_dirty = False
        self._lost_seen = 0
        self._map_full_warned = False
        if filter_all:
            # Under --all, processes are learned from exec events; the ones already running
            # (a serving process started before the recording) are looked at once here.
            self._enqueue_running()

    def _open_hooks(self, config: layout.WrGpuConfig, object_path: str | None, hold: bool) -> None:
        """Loads and attaches the GPU object; where that fails, says so in a warning and runs
        on without uprobes (NVML is still sampled)."""
        try:
            self.hooks = self._load(config, object_path, hold)
            self._rb = RingBuffer(self.hooks.events)
        except WhyrestartError as exc:
            self.hooks_error = exc.message
            if self.hooks is not None:
                self.hooks.close()
                self.hooks = None
            self.warnings.append(
                f"GPU allocation failures cannot be caught: {exc.message}"
                + (f" ({exc.fix})" if exc.fix else "")
            )

    def _enqueue_running(self) -> None:
        """Queues every process of ``proc`` but ourselves for one look at its mappings."""
        with contextlib.suppress(OSError):
            for name in os.listdir(self.proc):
                if name.isdigit() and int(name) != os.getpid():
                    self._enqueue(int(name))

    def _load(self, config: layout.WrGpuConfig, object_path: str | None, hold: bool) -> GpuHooks:
        """gpu.bpf.o with the main object's watched maps and the holds map shared between
        recorders (in bpffs); without either when that cannot be, said in a warning."""
        pin_dir = system.BPFFS if hold and system.ensure_bpffs() else None
        if hold and pin_dir is None:
            self.warnings.append(
                f"bpffs is not mounted at {system.BPFFS} and cannot be: another recorder "
                "holding the same GPU process may resume it before this one has probed it"
            )
        try:
            return GpuHooks(config, object_path, self.shared, pin_dir)
        except WhyrestartError as exc:
            if pin_dir is None and not self.shared:
                raise
            first = exc
        if pin_dir is not None:
            try:
                hooks = GpuHooks(config, object_path, self.shared)
            except WhyrestartError:
                pass
            else:
                # a map pinned by another version of whyrestart, of another shape
                self.warnings.append(
                    f"the holds map cannot be shared with other recorders ({first.message}): "
                    "another recorder holding the same GPU process may resume it before this "
                    "one has probed it"
                )
                return hooks
        # the two objects' map definitions drifted apart: watch with our own filter
        self.warnings.append(
            f"the GPU probes cannot share the main object's watched set ({first.message}): "
            "a new process is watched by them only once its fork is decoded (~10 ms)"
        )
        self.shared = {}
        config.watch_cgroups = 0
        return GpuHooks(config, object_path)

    # -- description ------------------------------------------------------------------------

    @property
    def rung(self) -> str | None:
        """The trace header's ``gpu_alloc`` hook: "uprobe" when failures can be caught."""
        return "uprobe" if self.hooks is not None else None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uprobes": "ready" if self.hooks is not None else f"unavailable: {self.hooks_error}",
            "host_libcuda": dict(self._host) or "none found",
            "hold": (
                "ready"
                if self.holds is not None and self.holds.armed
                else f"unavailable: {(self.holds and self.holds.error) or 'no uprobes'}"
            ),
            "pid_filter": "shared" if "watched_pids" in self.shared else "own",
            # holds of one process by several recorders wait for each other (bpffs map)
            "hold_peers": "shared" if self.hooks is not None and self.hooks.peers_shared else "own",
            # whether the guard outlives an OOM kill of this recorder's cgroup (oom.group)
            "hold_guard": (
                "spared by OOM kills"
                if system.has_capability(system.CAP_SYS_RESOURCE)
                else "not spared by OOM kills (no CAP_SYS_RESOURCE)"
            ),
        }
        out.update(self.nvml.describe())
        return out

    # -- which processes --------------------------------------------------------------------

    def watch(self, pids: Iterable[int]) -> None:
        for pid in pids:
            self._watch(pid)

    def track(self, events: Sequence[Event]) -> None:
        """Follow the watched set through the main object's lifecycle events."""
        for ev in events:
            if isinstance(ev, Fork):
                self._watch(ev.child_pid)
            elif isinstance(ev, Exec):
                # a new program image maps new libraries: look again, unless the look was
                # taken after this exec (the event may reach us after the scan)
                if self._covered.get(ev.pid, -1) < ev.ts:
                    self._covered.pop(ev.pid, None)
                    self._enqueue(ev.pid)
                self._watch(ev.pid)
            elif isinstance(ev, Exit):
                self._forget(ev.pid)
            elif isinstance(ev, GpuAllocFailure | GpuOomRecovered | GpuCallFailure):
                self._gpu_pids.add(ev.pid)

    def _watch(self, pid: int) -> None:
        if pid in self._watched:
            return
        self._watched.add(pid)
        self._pids_dirty = True
        self._enqueue(pid)
        if self.hooks is not None and not self.filter_all and "watched_pids" not in self.shared:
            try:
                self.hooks.watch_pid(pid)
            except WhyrestartError as exc:
                if not self._map_full_warned:
                    self._map_full_warned = True
                    self.warnings.append(f"GPU pid filter: {exc.message}")

    def _forget(self, pid: int) -> None:
        self._covered.pop(pid, None)
        self._next_look.pop(pid, None)
        self._queued.discard(pid)
        if pid in self._watched:
            self._watched.discard(pid)
            self._pids_dirty = True
        if self.hooks is not None and (pid in self._gpu_pids or not self.filter_all):
            self._gpu_pids.discard(pid)
            with contextlib.suppress(WhyrestartError):
                self.hooks.forget_pid(pid)

    def _enqueue(self, pid: int) -> None:
        if pid not in self._queued:
            self._queued.add(pid)
            self._queue.append(pid)

    # -- the loop ---------------------------------------------------------------------------

    def poll(self, now_ns: int, final: bool = False) -> list[Event]:
        """Everything new since the last call. ``final``: the last drain, no more scanning."""
        out, self._held_events = self._held_events, []
        out += self._resume_held(now_ns)
        if self._rb is not None and self.hooks is not None:
            out += self.decoder.decode_batch(self._rb.drain(0))
            lost = self.hooks.lost_count()
            if lost > self._lost_seen:
                out.append(Lost(ts=now_ns, count=lost - self._lost_seen))
                self._lost_seen = lost
        out += self.nvml.drain()
        if not final:
            if now_ns >= self._next_scan:
                self._next_scan = now_ns + SCAN_INTERVAL_NS
                if self.holds is not None:
                    self.holds.sweep()
                self._second_looks(now_ns)
                if self._pids_dirty and not self.filter_all:
                    self.nvml.set_pids(frozenset(self._watched))
                    self._pids_dirty = False
            out += self._scan(now_ns)
        return out

    # -- holds ------------------------------------------------------------------------------

    @property
    def final_holds(self) -> dict[str, Any] | None:
        """What holding cost, for the trace footer (once closed; None when it never held)."""
        return self.holds.final if self.holds is not None else None

    def resume_held(self, now_ns: int) -> None:
        """Resume held processes now, without handing events over (the caller is behind):
        their ``GpuLibrary`` events come out of the next ``poll``."""
        self._held_events += self._resume_held(now_ns)

    def _resume_held(self, now_ns: int) -> list[Event]:
        """``Holds.resume``; a ``GpuLibrary`` event for each process not yet covered."""
        out: list[Event] = []
        for pid, shown, res in self.holds.resume() if self.holds is not None else ():
            if pid not in self._covered:
                self._covered[pid] = now_ns
                self._gpu_pids.add(pid)
                out.append(_library_event(now_ns, pid, shown, res))
        return out

    def _second_looks(self, now_ns: int) -> None:
        """Queue the watched processes not known to map libcuda (they may dlopen it any time)
        whose next look is due, at most MAX_RESCANS_PER_ROUND of them, taking turns by pid."""
        pending = sorted(self._watched - self._covered.keys())
        if self._rescan_max_gap_ns > SCAN_INTERVAL_NS:
            due: list[int] = []
            for pid in pending:
                when, gap = self._next_look.get(pid, (0, SCAN_INTERVAL_NS // 2))
                if now_ns >= when:
                    gap = min(gap * 2, self._rescan_max_gap_ns)
                    self._next_look[pid] = (now_ns + gap - SCAN_INTERVAL_NS // 2, gap)
                    due.append(pid)
            pending = due
        if len(pending) > MAX_RESCANS_PER_ROUND:
            i = bisect.bisect_right(pending, self._rescan_after)
            pending = (pending[i:] + pending[:i])[:MAX_RESCANS_PER_ROUND]
        if pending:
            self._rescan_after = pending[-1]
        for pid in pending:
            self._enqueue(pid)

    def _scan(self, now_ns: int) -> list[Event]:
        out: list[Event] = []
        scanned = 0
        while self._queue and scanned < MAX_SCANS_PER_POLL:
            pid = self._queue.popleft()
            if pid not in self._queued:
                continue  # exited while queued: costs nothing (fork storms queue many)
            self._queued.discard(pid)
            if pid in self._covered or not (self.filter_all or pid in self._watched):
                continue
            scanned += 1
            maps = libcuda.mappings_of(pid, self.proc)
            if not maps:
                continue
            self._covered[pid] = now_ns
            self._gpu_pids.add(pid)
            out += [
                _library_event(now_ns, pid, m.path, self.libraries.for_mapping(pid, m))
                for m in maps
            ]
        return out

    def close(self) -> None:
        if self.holds is not None:
            self.holds.close()
        self.nvml.close()
        if self._rb is not None:
            self._rb.free()
            self._rb = None
        if self.hooks is not None:
            self.hooks.close()
            self.hooks = None
        if self.decoder.unknown or self.decoder.malformed:
            self.warnings.append(
                f"GPU ring buffer: {self.decoder.unknown} records of unknown type and "
                f"{self.decoder.malformed} short records were skipped"
            )


def _library_event(now_ns: int, pid: int, path: str, res: AttachedLibrary) -> GpuLibrary:
    """A process maps (or opened) a driver library, and what probing it gave."""
    aliases = [f"{a}={b}" for a, b in res.aliases.items()]
    return GpuLibrary(
        ts=now_ns,
        pid=pid,
        path=path,
        probed=",".join(res.probed + aliases),
        missing=",".join(res.missing),
        error="; ".join(res.errors),
    )
