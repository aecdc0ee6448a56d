"""The recorder's GPU side: one object that owns everything GPU during a recording.

``GpuSide`` loads bpf/gpu.bpf.o (``tracer.bpf.gpuhooks``), probes the host's libcuda.so.1 at
once, starts the NVML sampler (``tracer.gpu.nvml``), and then, from the recorder's loop:

* learns the watched processes (``watch`` for the seeds, ``track`` for the Fork/Exec/Exit events
  the main object sends) and mirrors them into the GPU object's pid filter;
* looks into /proc/PID/maps of watched processes for a libcuda they map (each new process at
  once, the others every second, a bounded number per call so a fork storm cannot stall the
  loop) and probes every library file once: a GPU process is covered from then on;
* resumes the processes the kernel held because they opened a libcuda file nobody probed yet
  (``LD_LIBRARY_PATH``, a conda environment, a container's compat directory), once that file is
  probed: their first driver call is caught however soon it comes. A guard process
  (``tracer.gpu.holdguard``) resumes them if this process dies, and ends holds that last longer
  than its bound;
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
import select
import subprocess
import sys
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
from tracer.gpu import holdguard, libcuda
from tracer.gpu.nvml import DEFAULT_INTERVAL_S, Clock, GpuSampler, open_nvml
from tracer.parse import cuda
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
# process's maps take ~1 ms), and an unprobed libcuda opened between looks is still held by
# the kernel until it is probed (``hold``).
# How often the loop tells the kernel it still resumes holds (gpu.bpf.c takes none once the
# heartbeat is 2 s old): a bpf(2) call per 250 ms, not one per loop.
HEARTBEAT_NS = 250_000_000
# The guard starts in ~30 ms (python -I -S, the standard library only); a loaded host may take
# much longer, and a recorder without holds still records.
GUARD_READY_S = 5.0


class GpuSide:
    """See the module docstring. Always ``close()`` it.

    Large on purpose: the GPU object, the library scans, the holds and NVML share one watched
    set and one pid filter, which is the point of having one owner (the recorder only sees its
    source, ``tracer.pipeline.sources.GpuSource``)."""

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
        open an unprobed libcuda until it is probed."""
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
        # each driver library file (libcuda.file_key: one per real file, however many
        # containers' overlays show it) -> what probing it gave
        self._libraries: dict[tuple[int, int, int], AttachedLibrary] = {}
        self._host: dict[str, str] = {}
        if self.hooks is not None and attach_host:
            for path in libcuda.host_libraries():
                self._host[path] = self._attach_file(path, path)
        # holds: the guard, and what they cost
        self._guard: subprocess.Popen[bytes] | None = None
        self._guard_pipe: int | None = None
        self.hold_error: str | None = None
        self.holds_resumed = 0
        self.hold_max_ns = 0
        self.hold_total_ns = 0
        self.final_holds: dict[str, Any] | None = None  # hold_summary() at close
        self._held_events: list[Event] = []  # from resume_held, for the next poll
        self._beat_ns = 0
        self.leftovers_resumed = 0  # processes a dead recorder's holds left stopped
        self._pid_ns_problem = system.pid_namespace_problem()
        if self.hooks is not None and hold:
            self._start_holding()
        self._sweep()
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
                if self._guard_pipe is not None
                else f"unavailable: {self.hold_error or 'no uprobes'}"
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
        if self._guard is not None and self._guard.poll() is not None:
            self._guard = None  # the guard's parent exited (it forks the guard): reaped
        if self._guard_pipe is not None:
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
                self._sweep()
                self._second_looks(now_ns)
                if self._pids_dirty and not self.filter_all:
                    self.nvml.set_pids(frozenset(self._watched))
                    self._pids_dirty = False
            out += self._scan(now_ns)
        return out

    # -- holds ------------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Resume what the holds of a recorder that died with its guard left stopped (at start,
        then every second: a recorder restarted at once finds them younger than the bound)."""
        if self.hooks is None or not self.hooks.peers_shared or self._pid_ns_problem:
            return
        self.leftovers_resumed += len(self.hooks.sweep_leftovers(boottime_ns(), self.proc))

    def _start_holding(self) -> None:
        """Start the guard, then let the kernel hold: never a hold nobody can end."""
        assert self.hooks is not None
        if self._pid_ns_problem:
            # our SIGCONT would name another process: a hold here would be for good
            self.hold_error = f"{self._pid_ns_problem} (fix: {system.PID_NS_FIX})"
            self.warnings.append(
                f"processes that load libcuda from an unprobed path are not held: {self.hold_error}"
            )
            return
        map_fd, peers_fd = self.hooks.held_map.fd, self.hooks.peers.fd
        r, w = os.pipe()  # both ends close on exec: only the guard gets the read end
        ready_r, ready_w = os.pipe()  # the guard writes a byte once it is ready
        try:
            self._guard = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    holdguard.__file__,
                    str(map_fd),
                    str(r),
                    str(peers_fd),
                    str(self.hooks.config.holder),
                ],
                pass_fds=(map_fd, r, peers_fd, ready_w),
                env={**os.environ, holdguard.READY_FD_ENV: str(ready_w)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(w)
            os.close(ready_r)
            self.hold_error = f"starting the hold guard: {exc.strerror}"
            self.warnings.append(
                f"processes that load libcuda from an unprobed path are not held: "
                f"{self.hold_error}; their first driver calls may be missed"
            )
            return
        finally:
            os.close(r)
            os.close(ready_w)
        self._guard_pipe = w
        # no hold before the guard outlives what a unit stop or an OOM group kill sends
        ready, _, _ = select.select([ready_r], [], [], GUARD_READY_S)
        started = bool(ready) and os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        if not started:
            self.hold_error = f"the hold guard did not start within {GUARD_READY_S:g} s"
            self._stop_guard()
            self.warnings.append(
                "processes that load libcuda from an unprobed path are not held "
                f"({self.hold_error}): their first driver calls may be missed"
            )
            return
        if not system.has_capability(system.CAP_SYS_RESOURCE):
            # the guard cannot set oom_score_adj -1000 (tracer/gpu/holdguard.py)
            self.warnings.append(
                "the hold guard is not spared by OOM kills (no CAP_SYS_RESOURCE): an OOM of "
                "this recorder's cgroup under memory.oom.group kills it too, and what it held "
                "is resumed only by the next recorder, about 5 s later "
                "(fix: grant CAP_SYS_RESOURCE)"
            )
        errors = self.hooks.enable_holds()
        if errors and len(errors) == 3:
            self.hold_error = "; ".join(errors)
            self._stop_guard()
            self.warnings.append(
                "processes that load libcuda from an unprobed path are not held "
                f"({self.hold_error}): their first driver calls may be missed"
            )

    def resume_held(self, now_ns: int) -> None:
        """Resume held processes now, without handing events over (the caller is behind):
        their ``GpuLibrary`` events come out of the next ``poll``."""
        if self._guard_pipe is not None:
            self._held_events += self._resume_held(now_ns)

    def _resume_held(self, now_ns: int) -> list[Event]:
        """Probe the file each held process opened, then resume it (SIGCONT, then forget the
        hold: the guard resumes whatever is left if we die in between)."""
        assert self.hooks is not None
        out: list[Event] = []
        beat = boottime_ns()
        if beat - self._beat_ns >= HEARTBEAT_NS:
            with contextlib.suppress(WhyrestartError):
                self.hooks.heartbeat()
                self._beat_ns = beat
        try:
            held = self.hooks.held()
        except WhyrestartError:
            return out
        for pid, h in held:
            fd_path = f"{self.proc}/{pid}/fd/{h.fd}"
            try:
                shown = os.readlink(fd_path)
            except OSError:
                shown = fd_path
            res = self._attach_file_once(fd_path, shown)
            if res.opened:
                # no more holds for this file (not when it could not even be looked at: the
                # process was gone, and the next one to open it must be held again)
                with contextlib.suppress(WhyrestartError):
                    self.hooks.mark_probed(h.file.dev, h.file.ino)
            self.hooks.resume(pid, self.clock())
            took = max(0, self.clock() - h.ts_ns)
            self.holds_resumed += 1
            self.hold_total_ns += took
            self.hold_max_ns = max(self.hold_max_ns, took)
            if pid in self._covered:
                continue
            self._covered[pid] = now_ns
            self._gpu_pids.add(pid)
            aliases = [f"{a}={b}" for a, b in res.aliases.items()]
            out.append(
                GpuLibrary(
                    ts=now_ns,
                    pid=pid,
                    path=shown,
                    probed=",".join(res.probed + aliases),
                    missing=",".join(res.missing),
                    error="; ".join(res.errors),
                )
            )
        return out

    def hold_summary(self) -> dict[str, Any]:
        """What holding cost and missed, for the trace footer."""
        taken = refused = stale = traced = 0
        if self.hooks is not None:
            with contextlib.suppress(WhyrestartError):
                taken, refused, stale, traced = self.hooks.hold_counts_now()
        return {
            "taken": taken,
            "not_taken": refused,
            # openers not held: this recorder's loop had not beaten for 2 s; or ptraced
            "spared_stale": stale,
            "spared_traced": traced,
            "leftovers_resumed": self.leftovers_resumed,
            "resumed_by_recorder": self.holds_resumed,
            "max_ms": round(self.hold_max_ns / 1e6, 3),
            "mean_ms": round(self.hold_total_ns / 1e6 / self.holds_resumed, 3)
            if self.holds_resumed
            else 0.0,
        }

    def _stop_guard(self) -> None:
        if self._guard_pipe is not None:
            os.close(self._guard_pipe)  # end of file: the guard resumes what is left, exits
            self._guard_pipe = None
        if self._guard is not None:
            # the process started is the guard's parent, which exited as soon as it forked the
            # guard; the guard itself looks again for a second (a hold racing the close) and
            # nobody needs to wait for that
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guard.wait(timeout=5)
            self._guard = None

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
            for m in maps:
                res = self._attach_mapping(pid, m)
                aliases = [f"{a}={b}" for a, b in res.aliases.items()]
                out.append(
                    GpuLibrary(
                        ts=now_ns,
                        pid=pid,
                        path=m.path,
                        probed=",".join(res.probed + aliases),
                        missing=",".join(res.missing),
                        error="; ".join(res.errors),
                    )
                )
        return out

    def _attach_mapping(self, pid: int, m: libcuda.Mapping) -> AttachedLibrary:
        if self.hooks is None:
            return AttachedLibrary(m.path, errors=[f"uprobes unavailable: {self.hooks_error}"])
        path = libcuda.attach_path(pid, m, self.proc)
        if path is None:
            # gone before we looked: the next process mapping this file tries again
            return AttachedLibrary(m.path, errors=["the process exited before probing"])
        # the same key as a hold's (_attach_file_once): a file probed on either path is
        # probed once
        return self._attach_file_once(path, m.path)

    def _attach_file_once(self, path: str, shown_as: str) -> AttachedLibrary:
        """Probe a library file by path, once per real file (``libcuda.file_key``)."""
        try:
            st = os.stat(path)
        except OSError as exc:
            return AttachedLibrary(shown_as, errors=[f"{shown_as}: {exc.strerror}"], opened=False)
        key = libcuda.file_key(st)
        res = self._libraries.get(key)
        if res is None:
            assert self.hooks is not None
            res = self.hooks.attach_library(path, shown_as)
            if not res.probed and res.errors and not os.path.exists(path):
                # the process (a /proc link) went away half-way: not this file's fault, so it
                # is neither remembered nor marked probed, and the next opener tries again
                res.opened = False
                return res
            self._libraries[key] = res
        return res

    def _attach_file(self, path: str, shown_as: str) -> str:
        """Probe a library file by path (the host's own), once; a one-line summary. A file
        probed here is marked probed for the kernel too: opening it holds nobody."""
        try:
            os.stat(path)
        except OSError as exc:
            return f"not probed: {exc.strerror}"
        res = self._attach_file_once(path, shown_as)
        if res.probed and self.hooks is not None:
            with contextlib.suppress(OSError, WhyrestartError):
                st = os.stat(path)
                # the kernel's dev_t encoding (MAJOR << 20 | MINOR), as a hold names the file
                kdev = (os.major(st.st_dev) << 20) | os.minor(st.st_dev)
                self.hooks.mark_probed(kdev, st.st_ino)
        if res.errors and not res.probed:
            return "not probed: " + "; ".join(res.errors)
        return f"{res.allocations_probed}/{len(cuda.ALLOC_FUNCTIONS)} allocation entry points"

    def close(self) -> None:
        if self.hooks is not None and self._guard_pipe is not None:
            with contextlib.suppress(WhyrestartError):
                self.hooks.disable_holds()
                self._resume_held(self.clock())
            summary = self.final_holds = self.hold_summary()
            if summary["not_taken"]:
                self.warnings.append(
                    f"{summary['not_taken']} processes opened an unprobed libcuda when they "
                    "could not be held: their first driver calls may have been missed"
                )
        self._stop_guard()
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
