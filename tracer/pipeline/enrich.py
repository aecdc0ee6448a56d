"""The enrichers of a recording (`tracer.pipeline.core.Enricher`): what user space adds to
the kernel's events before they are ordered.

* `WatchSet`: which pids and cgroups are watched: the kernel's filter, the samplers, the kernel
  log's OOM reports (a report is kept when it concerns the watched set).
* `Follow`: ``--container`` targets across restarts, and a runtime's exec health checks
  (``tracer.pipeline.follow.Follower``).
* `SenderExe`: a signal's sender's executable, read from /proc when the signal is recorded
  (its name is its own choice; its executable is not).
* `TmpfsAtFault`: the full tmpfs mounts of a process the kernel has just sent a SIGBUS for an
  address it could not back (``TmpfsFull``), measured while the process still exists.
* `CgroupNamer`: the kernel sends cgroup ids; each id gets one ``CgroupInfo`` (its path) and,
  for a container or a systemd unit, one ``UnitInfo``, inserted before the first event that
  mentions it, so that a reader of the trace never meets an id it cannot name.
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgspec
import psutil

from tracer.clock import boottime_ns
from tracer.errors import UsageError
from tracer.events import (
    BUS_ADRERR,
    SI_KERNEL,
    CgroupMkdir,
    Event,
    Exec,
    Exit,
    Fork,
    KmsgOom,
    OomKill,
    Signal,
    cgroup_ids,
)
from tracer.parse import cgpath
from tracer.sources.tmpfs import full_tmpfs, mount_ns

if TYPE_CHECKING:
    from tracer.bpf import hooks
    from tracer.pipeline.follow import Follower
    from tracer.sources.cgroupfs import CgroupResolver
    from tracer.sources.samplers import SamplerSet

__all__ = ["CgroupNamer", "Follow", "SenderExe", "TmpfsAtFault", "WatchSet"]

MAX_KNOWN_PIDS = 65536


class WatchSet:
    """The watched set as the events change it.

    Under --all, processes are not sampled one by one (every process forked on the host, ten
    times a second, would cost more than the rest of the recorder, and verdicts do not use
    them): the cgroups they run in are."""

    def __init__(
        self,
        kernel: hooks.KernelHooks,
        samplers: SamplerSet,
        resolver: CgroupResolver,
        *,
        every: bool,
        pids: list[int],
        cgroup_paths: list[str],
    ) -> None:
        self.kernel = kernel
        self.samplers = samplers
        self.resolver = resolver
        self.every = every
        # pids seen in the watched set (dict: insertion order, trimmed oldest-first); exited
        # ones stay a while because their kernel-log OOM report can arrive after the exit
        self.known_pids: dict[int, None] = {}
        self.alive: set[int] = set(pids)  # the --pid targets still running
        self.cgroup_paths = [p.rstrip("/") or "/" for p in cgroup_paths]
        self._sampled_ids: set[int] = set()

    def seed_pid(self, pid: int) -> None:
        """Watch a running process and its descendants: not the recorder and what it runs
        (``--pid 1`` has them among its descendants), unless the target is one of those."""
        self.watch_pid(pid)
        try:
            me = psutil.Process(os.getpid())
            mine = {os.getpid(), *(p.pid for p in me.children(recursive=True))}
            if pid in mine:
                mine = set()
            for child in psutil.Process(pid).children(recursive=True):
                if child.pid not in mine:
                    self.watch_pid(child.pid)
        except psutil.Error:
            pass

    def watch_pid(self, pid: int, *, command: bool = False) -> None:
        # (the recorder's own helpers are refused by the kernel side: not known either)
        if self.kernel.watch_pid(pid, command=command):
            self._know(pid)

    def enrich(self, events: list[Event]) -> list[Event]:
        every = self.every
        samplers = self.samplers
        for ev in events:
            if isinstance(ev, Exit):
                # the exit event, not the pid's absence: a zombie nobody reaps still "exists"
                self.alive.discard(ev.pid)
                samplers.unwatch_pid(ev.pid)
            elif isinstance(ev, Fork):
                if not every:
                    self._know(ev.child_pid)
                    samplers.watch_pid(ev.child_pid)
            elif isinstance(ev, Exec):
                if not every:
                    self._know(ev.pid)
                    samplers.watch_pid(ev.pid)
                self.sample_cgroup(ev.cgroup_id)
            elif isinstance(ev, OomKill) and ev.limit_cgroup_id:
                self.sample_cgroup(ev.limit_cgroup_id)
                samplers.sample_soon(ev.limit_cgroup_id)
        return events

    def forget_cgroups(self, ids: Iterable[int]) -> None:
        """Cgroups that are gone (``Recorder.forget_cgroups``)."""
        self._sampled_ids.difference_update(ids)

    def sample_cgroup(self, cgroup_id: int) -> None:
        if cgroup_id in self._sampled_ids:
            return
        self._sampled_ids.add(cgroup_id)
        path = self.resolver.path_of(cgroup_id)
        if path is not None:
            with contextlib.suppress(UsageError):  # gone already: nothing to sample
                self.samplers.watch_cgroup(path)

    def _know(self, pid: int) -> None:
        self.known_pids[pid] = None
        if len(self.known_pids) > MAX_KNOWN_PIDS:
            for old in list(self.known_pids)[: MAX_KNOWN_PIDS // 2]:
                del self.known_pids[old]

    def wants_kmsg(self, k: KmsgOom) -> bool:
        if self.every or k.victim_pid in self.known_pids:
            return True
        return any(cgpath.is_within(k.task_memcg, p) for p in self.cgroup_paths)


class Follow:
    """Followed containers' new cgroups join the kernel's watched set and the samplers; exec'd
    health checks become probe samples."""

    def __init__(self, follower: Follower, kernel: hooks.KernelHooks, watch: WatchSet) -> None:
        self.follower = follower
        self.kernel = kernel
        self.watch = watch

    def enrich(self, events: list[Event]) -> list[Event]:
        extra, new_ids = self.follower.on_events(events)
        for cid in new_ids:
            self.kernel.watch_cgroup(cid)
            self.watch.sample_cgroup(cid)
        return events + extra if extra else events


class SenderExe:
    """Fills ``Signal.sender_exe``: the sender's executable (``/proc/PID/exe``), read as the
    signal is recorded, while the sender most likely still runs (a ``kill`` command may be gone
    already: then it stays ""). The analysis trusts it over the sender's self-chosen name
    (tracer/analysis/senders.py). Cached per pid for ``TTL_NS`` of stream time, so that a signal
    storm from one sender reads it once a second, and forgotten at that pid's exec."""

    TTL_NS = 1_000_000_000
    MAX_CACHED = 4096

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._cache: dict[int, tuple[int, str]] = {}  # pid -> (read at, executable)

    def _exe(self, pid: int, ts: int) -> str:
        hit = self._cache.get(pid)
        if hit is not None and ts - hit[0] < self.TTL_NS:
            return hit[1]
        try:
            exe = os.readlink(f"{self.proc_root}/{pid}/exe")
        except OSError:
            exe = ""  # gone, or a kernel thread
        if len(self._cache) >= self.MAX_CACHED:
            self._cache.clear()
        self._cache[pid] = (ts, exe)
        return exe

    def enrich(self, events: list[Event]) -> list[Event]:
        for i, ev in enumerate(events):
            if isinstance(ev, Signal):
                if ev.si_code != SI_KERNEL and ev.sender_pid > 0 and not ev.sender_exe:
                    exe = self._exe(ev.sender_pid, ev.ts)
                    if exe:
                        events[i] = msgspec.structs.replace(ev, sender_exe=exe)
            elif isinstance(ev, Exec):
                self._cache.pop(ev.pid, None)
        return events


class TmpfsAtFault:
    """After a SIGBUS the kernel raised at a process's own fault for an address it could not
    back (si_code BUS_ADRERR: the sender is the faulting thread itself), the tmpfs mounts that
    process sees that are full (tracer/sources/tmpfs.py), each a ``TmpfsFull`` stamped when it
    was read.

    The signal is recorded as it is generated, before the process dies of it; but it dies within
    microseconds unless it dumps core or handles the signal, and the ring is drained every few
    milliseconds: it is usually gone when its record is decoded, and its mount namespace with
    it. So the mount namespace of each watched process is noted as its exec or fork is decoded
    (one readlink), and a gone process's filesystems are measured through another live process
    noted in that same namespace, checked again at the read (a DataLoader's main process for
    its worker, a shell for its command). A namespace that died with it gives nothing: no
    other process's view is taken for it. Read at most once per process per ``TTL_NS`` of
    stream time (a handled SIGBUS in a loop). A note costs a readlink (4 us): at most
    ``MAX_NOTES`` a second of stream time, so that a fork storm under --all (10k forks and
    execs a second) costs the recorder under 1% of a core; the processes past it go unnoted."""

    TTL_NS = 1_000_000_000
    MAX_CACHED = 8192
    MAX_NOTES = 2000

    def __init__(self, proc_root: str = "/proc", clock: Callable[[], int] = boottime_ns) -> None:
        self.proc_root = proc_root
        self.clock = clock
        self._read: dict[int, int] = {}  # pid -> stream time of the last read
        self._ns: dict[int, str] = {}  # pid -> its mount namespace, as last noted
        self._window = (0, 0)  # (the second of stream time, notes in it)

    def _note(self, pid: int, ts: int) -> None:
        second, n = self._window
        if ts // self.TTL_NS != second:
            second, n = ts // self.TTL_NS, 0
        if n >= self.MAX_NOTES:
            return
        self._window = (second, n + 1)
        ns = mount_ns(pid, self.proc_root)
        if ns is None:
            return
        if len(self._ns) >= self.MAX_CACHED:
            for old in list(self._ns)[: self.MAX_CACHED // 2]:
                del self._ns[old]
        self._ns[pid] = ns

    def _measure(self, pid: int) -> list[Event]:
        now = self.clock()
        full = full_tmpfs(pid, now, self.proc_root)
        if full is not None:
            return list(full)
        ns = self._ns.get(pid)
        if ns is None:
            return []
        for other, theirs in reversed(self._ns.items()):  # (the newest first)
            if other != pid and theirs == ns and mount_ns(other, self.proc_root) == ns:
                return list(full_tmpfs(pid, now, self.proc_root, via=other) or [])
        return []

    def enrich(self, events: list[Event]) -> list[Event]:
        extra: list[Event] = []
        for ev in events:
            if isinstance(ev, Exec):
                self._note(ev.pid, ev.ts)
            elif isinstance(ev, Fork):
                self._note(ev.child_pid, ev.ts)
            elif isinstance(ev, Exit):
                self._ns.pop(ev.pid, None)
            elif (
                isinstance(ev, Signal)
                and ev.sig == _signal.SIGBUS
                and ev.si_code == BUS_ADRERR
                and ev.sender_tid == ev.target_pid  # raised at its own fault, not sent
            ):
                last = self._read.get(ev.sender_pid)
                if last is not None and ev.ts - last < self.TTL_NS:
                    continue
                if len(self._read) >= self.MAX_CACHED:
                    self._read.clear()
                self._read[ev.sender_pid] = ev.ts
                extra += self._measure(ev.sender_pid)
        # (stamped when read, after the signal: the reorder window puts them in time order)
        return events + extra if extra else events


class CgroupNamer:
    def __init__(self, resolver: CgroupResolver, follower: Follower) -> None:
        self.resolver = resolver
        self.follower = follower
        self._named: set[int] = {0}

    def forget_cgroups(self, ids: Iterable[int]) -> None:
        """Cgroups that are gone (``Recorder.forget_cgroups``)."""
        self._named.difference_update(ids)

    def enrich(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        named = self._named
        unpolled = self.follower.unpolled
        for ev in events:
            if type(ev) is CgroupMkdir:
                self.resolver.learn(ev.cgroup_id, ev.path)
            for cid in cgroup_ids(ev):
                if cid not in named:
                    named.add(cid)
                    info = self.resolver.info(cid, ev.ts)
                    if info is not None:
                        out.append(info)
                        created = isinstance(ev, CgroupMkdir)
                        unit = self.follower.name(cid, info.path, ev.ts, created)
                        if unit is not None:
                            out.append(unit)
                elif unpolled and cid in unpolled and isinstance(ev, Exec | Exit | Fork):
                    # a container seen being created is ours once its processes are
                    self.follower.running_in(cid)
            out.append(ev)
        return out
