"""Memory samplers: cgroup memory files, host meminfo and PSI, per-process RSS, on a schedule.

This module owns the periodic reads behind ``CgroupSample``, ``EffectiveLimit``,
``HostSample``, ``ProcessSample`` and ``SampleError`` events. The text is parsed by
``tracer.parse.memory`` (pure); here is only the I/O and the bookkeeping:

* ``CgroupSampler(layout, path)``: one memory cgroup's files (v1 or v2);
* ``HostSampler(proc_root)``: ``/proc/meminfo`` and ``/proc/pressure/memory``;
* ``ProcessSampler(pid, proc_root)``: ``/proc/PID/status`` (RssAnon/RssFile/RssShmem/VmSwap);
* ``SamplerSet``: the watched cgroups (each with its ancestors up to the root), the host and
  the watched processes, each on its interval; ``due(now_ns)`` returns what is due.

Clock: nothing here reads the event clock. The caller passes ``now_ns`` (CLOCK_BOOTTIME,
``time.clock_gettime_ns(time.CLOCK_BOOTTIME)``, the clock the BPF side stamps with) and every
event of one call carries it. (``time.perf_counter_ns`` is read only for ``SamplerSet.stats``.)

Cost: files are opened once and re-read with ``os.pread(fd, 65536, 0)``; cgroupfs (kernfs) and
procfs files are seq_files, which restart from offset 0 on every pread. On the development VMs
(one pinned vCPU, noisy) a kept-open re-read took ~0.6 µs for memory.usage_in_bytes and ~4 µs
for memory.stat, against ~3-5 µs and ~7-9 µs with os.open+read+close (~7-13 µs with Python's
``open().read()``). Whole samples, parsing included: a v1 cgroup with memory.stat 40-70 µs
(the memory.stat lookup ~18-24 µs of it), the host 23-45 µs, a process 14-28 µs.

A cgroup's files are opened relative to a descriptor of its directory (``openat``): once a
cgroup is removed, reads of its open files fail with ENODEV and lookups in its directory fail
with ENOENT, even when a new cgroup of the same name (a restarted container) appears, so a
sampler never silently switches to a namesake.

Failures are events, never exceptions (except ``UsageError`` for a path that does not name a
cgroup when it is watched): each problem becomes one ``SampleError`` per (source, target,
message). A removed cgroup or an exited process gives one error and its sampler stops
(``SamplerSet`` drops it). A file this kernel lacks gives one error naming the kernel version
that added it, and its field stays None:

* ``memory.peak``: Linux 5.19 (v2);
* ``memory.pressure`` and ``/proc/pressure/memory`` (PSI): Linux 4.20, and only with
  CONFIG_PSI=y and not booted with ``psi=0``;
* ``memory.events``' ``oom_group_kill`` key: Linux 5.17 (an absent key, not reported);
* v1 ``memory.oom_control``'s ``oom_kill`` line: Linux 4.13 (an absent key, not reported).

On the v2 root cgroup the kernel has no memory.current/max/high/peak/events (and the first PSI
kernels had no memory.pressure there either): missing files there are expected and not
reported.

Hybrid hosts (memory controller on v1, a unified v2 hierarchy mounted beside it, like the
development VMs): PSI is accounted in the v2 hierarchy whatever controllers it has, so a v1
cgroup's memory pressure is read from ``<unified_root><same path>/memory.pressure`` when that
directory exists (systemd mirrors its unit paths in every hierarchy). Where it does not (other
managers), the PSI fields are None without an error: nothing failed.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from tracer.errors import UsageError
from tracer.events import (
    CgroupSample,
    EffectiveLimit,
    Event,
    HostSample,
    ProcessSample,
    SampleError,
)
from tracer.parse import cgpath
from tracer.parse.cgroup import CGROUP_PROCS, MEMORY_V1, MEMORY_V2, parse_flat_keyed, parse_limit
from tracer.parse.memory import (
    Pressure,
    parse_meminfo,
    parse_oom_control,
    parse_pressure,
    parse_proc_status,
    parse_stat,
    parse_uint,
    proc_status_state,
)
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver, under

__all__ = [
    "DEFAULT_FAST_INTERVAL_NS",
    "DEFAULT_INTERVAL_NS",
    "MAX_CGROUPS",
    "NEAR_LIMIT_PERCENT",
    "CgroupSampler",
    "HostSampler",
    "ProblemLog",
    "ProcessSampler",
    "SamplerSet",
    "SourceStats",
]

DEFAULT_INTERVAL_NS = 100_000_000  # 100 ms
DEFAULT_FAST_INTERVAL_NS = 20_000_000  # 20 ms, near a limit: an OOM builds up in well under 1 s
# Sampled cgroups (watched ones and their ancestors, counted once). At ~50 µs a cgroup, 256 of
# them cost ~13% of a core at 10 Hz, and more than half a core if all were near a limit (50 Hz).
MAX_CGROUPS = 256
# A cgroup is "near its limit" when usage >= this percentage of the limit.
NEAR_LIMIT_PERCENT = 90
# With a quiet interval (the agent's), a due cgroup whose usage moved less than this since its
# last full sample, far from its limits and not under pressure, is not sampled in full: one
# read of its usage file (~1 µs) instead of every file (40-70 µs) and an event downstream.
QUIET_BYTES = 1 << 20

_READ_SIZE = 65536
_O_READ = os.O_RDONLY | os.O_CLOEXEC

# PSI is absent without CONFIG_PSI, and disabled (files absent, or EOPNOTSUPP on read) by psi=0.
_PSI_MISSING = "PSI needs Linux 4.20+ built with CONFIG_PSI=y, not booted with psi=0"


# ---------------------------------------------------------------------------------------------
# Small parts


class ProblemLog:
    """Which problems were already reported, so that each is said once.

    A problem is (source, target, message). Samplers that share one log (those of a
    ``SamplerSet``) say a kernel-wide problem, such as a file this kernel lacks, once in all.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str, str]] = set()

    def once(self, ts: int, source: str, target: str, message: str) -> SampleError | None:
        """A ``SampleError`` the first time this problem is seen, else None."""
        key = (source, target, message)
        if key in self._seen:
            return None
        self._seen.add(key)
        return SampleError(ts=ts, source=source, target=target, message=message)

    def forget(self, source: str, target: str) -> None:
        """Forget the problems of one target: a target watched anew may report them again."""
        self._seen = {k for k in self._seen if (k[0], k[1]) != (source, target)}

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(slots=True)
class SourceStats:
    """What one kind of sampler has cost: ``calls`` to ``sample``, the ``SampleError`` events
    they returned, and the time spent in them (``perf_counter`` ns)."""

    calls: int = 0
    errors: int = 0
    total_ns: int = 0

    @property
    def mean_us(self) -> float:
        return self.total_ns / self.calls / 1000 if self.calls else 0.0


class _KeptFile:
    """One file kept open and re-read from offset 0 with ``pread``.

    ``read`` raises OSError. After a failed read the descriptor is closed; with ``reopen``
    the file is opened again once, at once (a file can fail transiently). Opens go through
    ``dir_fd`` when one is given (``openat``: never a namesake of a removed directory).
    """

    __slots__ = ("absent", "dir_fd", "fd", "name", "reopen")

    def __init__(self, name: str, dir_fd: int | None = None, *, reopen: bool = True) -> None:
        self.name = name
        self.dir_fd = dir_fd
        self.reopen = reopen
        self.fd: int | None = None
        self.absent = False  # missing on this host: not tried again

    def _open(self) -> int:
        fd = os.open(self.name, _O_READ, dir_fd=self.dir_fd)
        self.fd = fd
        return fd

    def _pread_all(self, fd: int) -> bytes:
        data = os.pread(fd, _READ_SIZE, 0)
        if len(data) < _READ_SIZE:
            return data
        chunks = [data]
        offset = len(data)
        while True:  # a file larger than one read (none of ours is, today)
            chunk = os.pread(fd, _READ_SIZE, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def read(self) -> str:
        fd = self.fd if self.fd is not None else self._open()
        try:
            data = self._pread_all(fd)
        except OSError:
            self.close()
            if not self.reopen:
                raise
            fd = self._open()
            try:
                data = self._pread_all(fd)
            except OSError:
                self.close()
                raise
        return data.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def _strerror(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


# ---------------------------------------------------------------------------------------------
# Cgroup sampler

V1, V2 = MEMORY_V1, MEMORY_V2
# Files some kernels lack everywhere: reported once per SamplerSet (target: the file name).
_LATE_FILES = {
    V2.peak: ("cgroup", f"{V2.peak} missing: added in Linux 5.19"),
    V2.pressure: ("psi", f"{V2.pressure} missing: {_PSI_MISSING}"),
}
# v1 memory.oom_control lines that are events (oom_kill_disable is a setting).
_V1_OOM_EVENTS = ("under_oom", "oom_kill")


class CgroupSampler:
    """Reads one memory cgroup's files; ``sample(now_ns, cgroup_id)`` → events.

    ``path`` is relative to the memory hierarchy root ("/system.slice/x.scope"; the mount point
    prefix is accepted too). ``cgroup_id`` is the directory's inode, as
    ``CgroupResolver.id_of`` gives it; a directory whose inode differs at the first sample is
    a namesake, and counts as the cgroup being removed (0 skips that check).

    Returns ``[SampleError..., CgroupSample]``, or ``[SampleError]`` (at most once) when the
    cgroup is gone, after which ``gone`` is True and ``sample`` returns ``[]``.

    Raises (on construction): ``UsageError`` when the layout has no memory hierarchy.
    """

    def __init__(
        self, layout: CgroupLayout, path: str, *, problems: ProblemLog | None = None
    ) -> None:
        if layout.memory_root is None or layout.memory_version is None:
            raise UsageError(
                f"cgroup {path}: no cgroup hierarchy with the memory controller is mounted",
                fix="mount the memory controller (cgroup v1 memory or cgroup2 with memory)",
            )
        self.layout = layout
        self.version: int = layout.memory_version
        self.path = cgpath.relative(path, layout.memory_root)
        self.abs_path = under(layout.memory_root, self.path)
        self.problems = problems if problems is not None else ProblemLog()
        self.gone = False
        self.last: CgroupSample | None = None  # the latest successful sample
        self._dir_fd: int | None = None
        self._files: dict[str, _KeptFile] = {}
        self._v2_root = self.version == 2 and self.path == "/"
        # Hybrid: PSI from the unified hierarchy's same-named cgroup (see the module doc).
        self._unified_psi: _KeptFile | None = None
        if self.version == 1 and layout.unified_root:
            pressure = os.path.join(under(layout.unified_root, self.path), V2.pressure)
            self._unified_psi = _KeptFile(pressure)

    # -- life ----------------------------------------------------------------------------------

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        if self._unified_psi is not None:
            self._unified_psi.close()
        if self._dir_fd is not None:
            fd, self._dir_fd = self._dir_fd, None
            os.close(fd)

    def _open_dir(self, cgroup_id: int) -> bool:
        try:
            dir_fd = os.open(self.abs_path, _O_READ | os.O_DIRECTORY)
        except OSError:
            return False
        try:
            ino = os.fstat(dir_fd).st_ino
        except OSError:
            ino = -1
        if cgroup_id and ino != cgroup_id:
            os.close(dir_fd)
            return False
        self._dir_fd = dir_fd
        names = (V2 if self.version == 2 else V1).sampled()
        self._files = {name: _KeptFile(name, dir_fd) for name in names}
        return True

    def _alive(self) -> bool:
        """Whether our directory is still a live cgroup (called when something failed).

        A removed kernfs directory keeps its link count but its names are gone, so a lookup of
        ``cgroup.procs`` (in every cgroup, v1 and v2) fails; on other filesystems (fixture
        trees) a removed directory has no links left.
        """
        if self._dir_fd is None:
            return False
        try:
            if os.fstat(self._dir_fd).st_nlink == 0:
                return False
            fd = os.open(CGROUP_PROCS, _O_READ, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # e.g. EACCES: it exists
        os.close(fd)
        return True

    def _removed(self, now_ns: int) -> list[Event]:
        self.gone = True
        self.close()
        err = self.problems.once(now_ns, "cgroup", self.path, "cgroup removed")
        return [err] if err is not None else []

    # -- sampling ------------------------------------------------------------------------------

    def _report(self, out: list[Event], ts: int, source: str, target: str, msg: str) -> None:
        err = self.problems.once(ts, source, target, msg)
        if err is not None:
            out.append(err)

    def _missing(self, out: list[Event], ts: int, f: _KeptFile) -> None:
        f.absent = True
        f.close()
        if self._v2_root:
            return  # the kernel has no such file on the v2 root: expected
        late = _LATE_FILES.get(f.name)
        base = self._files.get(V2.usage)
        if f.name == V2.peak and base is not None and base.absent:
            # Without memory.current the memory controller itself is missing here (v2: the
            # parent does not delegate it), so memory.peak's absence says nothing about the
            # kernel's age. (memory.pressure is a core cgroup file: only PSI decides it.)
            late = None
        if late is not None:
            self._report(out, ts, late[0], f.name, late[1])
        elif self.version == 2:
            self._report(
                out,
                ts,
                "cgroup",
                self.path,
                f"{f.name} missing: is memory enabled in the parent's cgroup.subtree_control?",
            )
        else:
            self._report(out, ts, "cgroup", self.path, f"{f.name} missing")

    def _read_all(self, now_ns: int, out: list[Event]) -> dict[str, str] | None:
        """The text of each readable file; None when the cgroup turned out to be removed."""
        texts: dict[str, str] = {}
        for f in self._files.values():
            if f.absent:
                continue
            try:
                texts[f.name] = f.read()
            except FileNotFoundError:
                # A file we had, or any file at a first look, may be missing because the whole
                # cgroup went away; only a live directory makes it a missing file.
                if not self._alive():
                    return None
                self._missing(out, now_ns, f)
            except OSError as exc:
                if exc.errno == errno.ENODEV and not self._alive():
                    return None
                if exc.errno == errno.EOPNOTSUPP and f.name == V2.pressure:
                    self._missing(out, now_ns, f)  # PSI disabled at boot
                    continue
                self._report(out, now_ns, "cgroup", self.path, f"{f.name}: {_strerror(exc)}")
        return texts

    def _unified_pressure(self) -> Pressure | None:
        f = self._unified_psi
        if f is None or f.absent:
            return None
        try:
            text = f.read()
        except FileNotFoundError:
            f.absent = True  # no such cgroup in the unified hierarchy (see the module doc)
            return None
        except OSError:
            return None
        return parse_pressure(text)

    def _number(
        self, out: list[Event], ts: int, texts: dict[str, str], name: str, *, limit: bool = False
    ) -> int | None:
        text = texts.get(name)
        if text is None:
            return None
        value = parse_limit(text, self.version) if limit else parse_uint(text)
        if value is None:
            # A limit file says "unlimited" as "max" (v2) or as a huge number (v1).
            unlimited = limit and (text.strip() == "max" or parse_uint(text) is not None)
            if not unlimited:
                self._report(
                    out, ts, "cgroup", self.path, f"{name}: unexpected content {text[:40]!r}"
                )
        return value

    def unchanged(self) -> bool:
        """Whether a full sample now would most likely repeat the last one: its usage, read
        alone, moved less than ``QUIET_BYTES``, and the last sample was below 90% of its own
        limit and of memory.high, with no memory pressure. False when in doubt (no sample yet,
        a read that fails: the full sample then finds out why)."""
        last = self.last
        if last is None or last.usage_bytes is None or self._dir_fd is None:
            return False
        used = last.usage_bytes * 100
        for bound in (last.limit_bytes, last.high_bytes):
            if bound is not None and used >= bound * NEAR_LIMIT_PERCENT:
                return False
        if last.psi_some_avg10:
            return False
        f = self._files.get(V2.usage if self.version == 2 else V1.usage)
        if f is None or f.absent or f.fd is None:
            return False
        try:
            usage = parse_uint(os.pread(f.fd, 64, 0).decode("ascii", errors="replace"))
        except OSError:
            return False
        return usage is not None and abs(usage - last.usage_bytes) < QUIET_BYTES

    def sample(self, now_ns: int, cgroup_id: int) -> list[Event]:
        """Read the files now; events stamped ``now_ns`` (see the class doc)."""
        if self.gone:
            return []
        out: list[Event] = []
        if self._dir_fd is None:
            if not self._open_dir(cgroup_id):
                return self._removed(now_ns)
        else:
            try:
                # Cheap: on a regular filesystem (fixture trees) reads of a removed directory's
                # files still succeed, but the directory has no links left.
                unlinked = os.fstat(self._dir_fd).st_nlink == 0
            except OSError:
                unlinked = True
            if unlinked:
                return self._removed(now_ns)
        texts = self._read_all(now_ns, out)
        if texts is None:
            return self._removed(now_ns)
        ts = now_ns
        pressure: Pressure | None
        if self.version == 2:
            usage = self._number(out, ts, texts, V2.usage)
            limit = self._number(out, ts, texts, V2.limit, limit=True)
            high = self._number(out, ts, texts, V2.high, limit=True)
            peak = self._number(out, ts, texts, V2.peak)
            failcnt = None
            events = parse_flat_keyed(texts.get(V2.events, ""))
            psi_text = texts.get(V2.pressure)
            pressure = parse_pressure(psi_text) if psi_text is not None else None
            if psi_text is not None and pressure is None:
                self._report(
                    out, ts, "psi", self.path, f"{V2.pressure}: unexpected {psi_text[:40]!r}"
                )
        else:
            usage = self._number(out, ts, texts, V1.usage)
            limit = self._number(out, ts, texts, V1.limit, limit=True)
            high = None
            peak = self._number(out, ts, texts, V1.peak)
            failcnt = self._number(out, ts, texts, V1.failcnt)
            oom = parse_oom_control(texts.get(V1.oom_control, ""))
            events = {k: oom[k] for k in _V1_OOM_EVENTS if k in oom}
            pressure = self._unified_pressure()
        stat = parse_stat(texts.get(V1.stat, ""), self.version)
        sample = CgroupSample(
            ts=ts,
            cgroup_id=cgroup_id,
            path=self.path,
            usage_bytes=usage,
            limit_bytes=limit,
            high_bytes=high,
            peak_bytes=peak,
            failcnt=failcnt,
            events=events,
            stat=stat,
            psi_some_avg10=pressure.some_avg10 if pressure else None,
            psi_full_avg10=pressure.full_avg10 if pressure else None,
            psi_some_total_us=pressure.some_total_us if pressure else None,
            psi_full_total_us=pressure.full_total_us if pressure else None,
        )
        self.last = sample
        out.append(sample)
        return out


# ---------------------------------------------------------------------------------------------
# Host sampler


_MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Cached", "SwapFree")


class HostSampler:
    """``/proc/meminfo`` and ``/proc/pressure/memory`` → ``HostSample`` (``sample(now_ns)``).

    Without PSI the psi fields are None and one ``SampleError`` (source "psi") says why. An
    unreadable meminfo gives one ``SampleError`` (source "host") and no sample that time.
    """

    def __init__(self, proc_root: str = "/proc", *, problems: ProblemLog | None = None) -> None:
        self.proc_root = proc_root
        self.problems = problems if problems is not None else ProblemLog()
        self.meminfo_path = os.path.join(proc_root, "meminfo")
        self.pressure_path = os.path.join(proc_root, "pressure", "memory")
        self._meminfo = _KeptFile(self.meminfo_path)
        self._pressure = _KeptFile(self.pressure_path)

    def close(self) -> None:
        self._meminfo.close()
        self._pressure.close()

    def _report(self, out: list[Event], ts: int, source: str, target: str, msg: str) -> None:
        err = self.problems.once(ts, source, target, msg)
        if err is not None:
            out.append(err)

    def _read_pressure(self, out: list[Event], ts: int) -> Pressure | None:
        f = self._pressure
        if f.absent:
            return None
        try:
            text = f.read()
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or exc.errno == errno.EOPNOTSUPP:
                f.absent = True
                self._report(out, ts, "psi", self.pressure_path, f"missing: {_PSI_MISSING}")
            else:
                self._report(out, ts, "psi", self.pressure_path, _strerror(exc))
            return None
        pressure = parse_pressure(text)
        if pressure is None:
            self._report(out, ts, "psi", self.pressure_path, f"unexpected content {text[:40]!r}")
        return pressure

    def sample(self, now_ns: int) -> list[Event]:
        """``[SampleError..., HostSample]`` stamped ``now_ns``."""
        out: list[Event] = []
        try:
            info = parse_meminfo(self._meminfo.read(), _MEMINFO_KEYS)
        except OSError as exc:
            self._report(out, now_ns, "host", self.meminfo_path, f"cannot read: {_strerror(exc)}")
            return out
        pressure = self._read_pressure(out, now_ns)
        total, free = info.get("MemTotal"), info.get("MemFree")
        if total is None or free is None:
            self._report(out, now_ns, "host", self.meminfo_path, "no MemTotal or MemFree line")
            return out
        out.append(
            HostSample(
                ts=now_ns,
                mem_total=total,
                mem_available=info.get("MemAvailable"),  # Linux 3.14+
                mem_free=free,
                cached=info.get("Cached"),
                swap_free=info.get("SwapFree"),
                psi_some_avg10=pressure.some_avg10 if pressure else None,
                psi_full_avg10=pressure.full_avg10 if pressure else None,
                psi_some_total_us=pressure.some_total_us if pressure else None,
                psi_full_total_us=pressure.full_total_us if pressure else None,
            )
        )
        return out


# ---------------------------------------------------------------------------------------------
# Process sampler


_STATUS_KEYS = ("RssAnon", "RssFile", "RssShmem", "VmSwap")


class ProcessSampler:
    """``/proc/PID/status`` → ``ProcessSample`` (``sample(now_ns)``).

    /proc/PID/status is cheap (~7 µs to read, ~17 µs parsed, here; the kernel sums counters it
    keeps anyway) where ``smaps_rollup`` walks every mapping (~12 ms for a 1 GiB process): fine
    on every tick.

    The file is opened once and never reopened: the open descriptor stays bound to this
    process, so a read after it was reaped fails (ESRCH) instead of reading a newcomer that
    got the same pid. A zombie (exited, not yet reaped) has no memory lines: it counts as
    exited. An exit gives one ``SampleError`` ("process exited"), then ``gone`` is True.
    """

    def __init__(
        self, pid: int, proc_root: str = "/proc", *, problems: ProblemLog | None = None
    ) -> None:
        self.pid = pid
        self.proc_root = proc_root
        self.problems = problems if problems is not None else ProblemLog()
        self.status_path = os.path.join(proc_root, str(pid), "status")
        self.gone = False
        self._status = _KeptFile(self.status_path, reopen=False)

    def close(self) -> None:
        self._status.close()

    def _exited(self, now_ns: int) -> list[Event]:
        self.gone = True
        self.close()
        err = self.problems.once(now_ns, "process", str(self.pid), "process exited")
        return [err] if err is not None else []

    def sample(self, now_ns: int) -> list[Event]:
        """``[ProcessSample]``, or ``[SampleError]`` once when the process is gone."""
        if self.gone:
            return []
        try:
            text = self._status.read()
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or exc.errno == errno.ESRCH:
                return self._exited(now_ns)
            err = self.problems.once(
                now_ns,
                "process",
                str(self.pid),
                f"cannot read {self.status_path}: {_strerror(exc)}",
            )
            return [err] if err is not None else []
        if proc_status_state(text) in ("Z", "X"):
            return self._exited(now_ns)
        fields = parse_proc_status(text, _STATUS_KEYS)
        return [
            ProcessSample(
                ts=now_ns,
                pid=self.pid,
                rss_anon=fields.get("RssAnon"),
                rss_file=fields.get("RssFile"),
                rss_shmem=fields.get("RssShmem"),
                vm_swap=fields.get("VmSwap"),
            )
        ]


# ---------------------------------------------------------------------------------------------
# The set


@dataclass(slots=True)
class _Watch:
    """A watched cgroup: its id, its ancestors (itself first), its schedule, and the effective
    limit last emitted for it."""

    cgroup_id: int
    paths: list[str]
    next_ns: int | None = None
    effective: tuple[int | None, str | None] | None = None
    fast: bool = False


@dataclass(slots=True)
class _Sampled:
    cgroup_id: int
    sampler: CgroupSampler


@dataclass(slots=True)
class _Proc:
    sampler: ProcessSampler
    next_ns: int | None = None


@dataclass(slots=True)
class _Pending:
    source: str
    target: str
    message: str


def _next_due(prev: int | None, now_ns: int, interval_ns: int) -> int:
    """The next sampling time: on the previous cadence, skipping ticks that were missed."""
    if prev is None:
        return now_ns + interval_ns
    nxt = prev + interval_ns
    return nxt if nxt > now_ns else now_ns + interval_ns


class SamplerSet:
    """The memory samplers of one recording, on their schedules.

    ``watch_cgroup(path)`` samples that cgroup and each ancestor up to the root (each sampled
    cgroup once, however many watched cgroups share it; at most ``max_cgroups`` of them).
    ``watch_pid(pid)`` adds a process; the host is sampled unless ``host=False``.

    ``due(now_ns)`` samples what is due and returns the events, in this order: problems noted
    since the last call (the cap), the host, the cgroups sorted by path (so ancestors come
    before their descendants), one ``EffectiveLimit`` per watched cgroup whose effective limit
    is new or changed (in watch order), then the processes by pid. A watched cgroup and its
    ancestors are due every ``interval_ns``, or every ``fast_interval_ns`` while any of them
    uses at least ``NEAR_LIMIT_PERCENT`` % of its own limit (that includes a watched cgroup
    within 10% of its effective limit, since usage counts the subtree); the host and the
    processes every ``interval_ns``. The first call samples everything.

    With ``quiet_interval_ns`` (the always-on agent's: a node runs a hundred idle containers,
    and sampling each in full once a second cost 1% of a core), a due cgroup that is not near a
    limit and whose usage has not moved (``CgroupSampler.unchanged``) is sampled in full only
    once that interval has passed since its last full sample; what it said still stands.

    A removed cgroup or an exited process gives one ``SampleError`` and is dropped (a removed
    cgroup takes the watched cgroups below it along). Watching it again starts afresh.
    """

    def __init__(
        self,
        layout: CgroupLayout,
        resolver: CgroupResolver,
        proc_root: str = "/proc",
        interval_ns: int = DEFAULT_INTERVAL_NS,
        fast_interval_ns: int = DEFAULT_FAST_INTERVAL_NS,
        *,
        host: bool = True,
        max_cgroups: int = MAX_CGROUPS,
        quiet_interval_ns: int | None = None,
    ) -> None:
        if interval_ns <= 0 or fast_interval_ns <= 0:
            raise UsageError(
                f"sampling intervals must be positive (got {interval_ns} and {fast_interval_ns} ns)"
            )
        self.layout = layout
        self.resolver = resolver
        self.proc_root = proc_root
        self.interval_ns = interval_ns
        self.fast_interval_ns = fast_interval_ns
        self.max_cgroups = max_cgroups
        self.quiet_interval_ns = quiet_interval_ns
        self._problems = ProblemLog()
        self._host = HostSampler(proc_root, problems=self._problems) if host else None
        self._host_next: int | None = None
        self._watched: dict[str, _Watch] = {}
        self._sampled: dict[str, _Sampled] = {}
        self._procs: dict[int, _Proc] = {}
        self._pending: list[_Pending] = []
        self._capped = False
        self._stats = {k: SourceStats() for k in ("cgroup", "host", "process")}

    # -- what is watched -----------------------------------------------------------------------

    @property
    def watched_cgroups(self) -> list[str]:
        return list(self._watched)

    @property
    def sampled_cgroups(self) -> list[str]:
        return sorted(self._sampled)

    @property
    def fast_cgroups(self) -> list[str]:
        """The watched cgroups now sampled every ``fast_interval_ns`` (near a limit)."""
        return [rel for rel, w in self._watched.items() if w.fast]

    @property
    def watched_pids(self) -> list[int]:
        return sorted(self._procs)

    @property
    def stats(self) -> dict[str, SourceStats]:
        """Per source ("cgroup", "host", "process"): calls, errors and time spent (copies)."""
        return {k: dataclasses.replace(v) for k, v in self._stats.items()}

    def watch_cgroup(self, path: str) -> bool:
        """Sample ``path`` (relative to the memory hierarchy, or under its mount point) and its
        ancestors. False when that would pass ``max_cgroups`` (reported once, at the next
        ``due``); True when watched (or already watched).

        Raises:
            UsageError: no memory hierarchy, or no such cgroup.
        """
        rel = cgpath.relative(path, self.layout.memory_root)
        if rel in self._watched:
            return True
        paths = cgpath.ancestors(rel)
        new = [p for p in paths if p not in self._sampled]
        if len(self._sampled) + len(new) > self.max_cgroups:
            if not self._capped:
                self._capped = True
                self._pending.append(
                    _Pending(
                        "cgroup",
                        rel,
                        f"not sampled: more than {self.max_cgroups} cgroups to sample "
                        "(this and later refusals are reported only once)",
                    )
                )
            return False
        ids = {p: self.resolver.id_of(p) for p in new}  # raises before anything changes
        own_id = ids[rel] if rel in ids else self._sampled[rel].cgroup_id
        for p in new:
            self._problems.forget("cgroup", p)
            self._sampled[p] = _Sampled(
                ids[p], CgroupSampler(self.layout, p, problems=self._problems)
            )
        self._watched[rel] = _Watch(own_id, paths)
        return True

    def sample_soon(self, cgroup_id: int) -> None:
        """Make the watched cgroups sampled with this one due at the next ``due``: an OOM kill
        there moved its counters (the OOM count the verdict quotes, usage freed), and the
        verdict waits for a sample after the kill rather than the next tick, a second away."""
        paths = {p for p, s in self._sampled.items() if s.cgroup_id == cgroup_id}
        if not paths:
            return
        for w in self._watched.values():
            if not paths.isdisjoint(w.paths):
                w.next_ns = None

    def unwatch_cgroup(self, path: str) -> None:
        """Stop sampling ``path`` (and ancestors no other watched cgroup needs)."""
        self._watched.pop(cgpath.relative(path, self.layout.memory_root), None)
        self._drop_unneeded()

    def watch_pid(self, pid: int) -> None:
        """Sample process ``pid``. One that does not exist gives one error at the next ``due``."""
        if pid in self._procs:
            return
        self._problems.forget("process", str(pid))
        self._procs[pid] = _Proc(ProcessSampler(pid, self.proc_root, problems=self._problems))

    def unwatch_pid(self, pid: int) -> None:
        proc = self._procs.pop(pid, None)
        if proc is not None:
            proc.sampler.close()

    def _drop_unneeded(self) -> None:
        needed = {p for w in self._watched.values() for p in w.paths}
        for p in [p for p in self._sampled if p not in needed]:
            self._sampled.pop(p).sampler.close()

    def close(self) -> None:
        """Close every kept-open file; the set samples nothing afterwards."""
        if self._host is not None:
            self._host.close()
            self._host = None
        self._watched.clear()
        self._drop_unneeded()
        for pid in list(self._procs):
            self.unwatch_pid(pid)

    def __enter__(self) -> SamplerSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- sampling ------------------------------------------------------------------------------

    def _timed(self, source: str, events: Iterable[Event], started_ns: int) -> list[Event]:
        out = list(events)
        stats = self._stats[source]
        stats.calls += 1
        stats.total_ns += time.perf_counter_ns() - started_ns
        stats.errors += sum(1 for e in out if isinstance(e, SampleError))
        return out

    def _effective(self, watch: _Watch) -> tuple[int | None, str | None]:
        """The limit that applies and who sets it, from the latest samples."""
        return cgpath.effective_limit(
            (p, last.limit_bytes if (last := self._sampled[p].sampler.last) is not None else None)
            for p in watch.paths
        )

    def _quiet(self, sampler: CgroupSampler, now_ns: int) -> bool:
        """Skip this full sample: the quiet interval is on, the last full one is younger than
        it, and nothing moved (``CgroupSampler.unchanged``)."""
        q = self.quiet_interval_ns
        last = sampler.last
        return bool(q and last is not None and now_ns - last.ts < q and sampler.unchanged())

    def _near_limit(self, watch: _Watch) -> bool:
        for p in watch.paths:
            last = self._sampled[p].sampler.last
            if last is None or last.usage_bytes is None or last.limit_bytes is None:
                continue
            if last.usage_bytes * 100 >= last.limit_bytes * NEAR_LIMIT_PERCENT:
                return True
        return False

    def due(self, now_ns: int) -> list[Event]:
        """Sample what is due at ``now_ns`` (CLOCK_BOOTTIME ns) and return the events."""
        out: list[Event] = []
        for pending in self._pending:
            err = self._problems.once(now_ns, pending.source, pending.target, pending.message)
            if err is not None:
                out.append(err)
        self._pending.clear()

        host = self._host
        if host is not None and (self._host_next is None or now_ns >= self._host_next):
            started = time.perf_counter_ns()
            out += self._timed("host", host.sample(now_ns), started)
            self._host_next = _next_due(self._host_next, now_ns, self.interval_ns)

        due = [w for w in self._watched.values() if w.next_ns is None or now_ns >= w.next_ns]
        if due:
            gone: set[str] = set()
            # (a first sample, or one asked for by sample_soon, is always a full one)
            forced = {p for w in due if w.next_ns is None or w.fast for p in w.paths}
            for p in sorted({p for w in due for p in w.paths}):
                entry = self._sampled[p]
                if p not in forced and self._quiet(entry.sampler, now_ns):
                    continue
                started = time.perf_counter_ns()
                out += self._timed("cgroup", entry.sampler.sample(now_ns, entry.cgroup_id), started)
                if entry.sampler.gone:
                    gone.add(p)
            for rel, w in list(self._watched.items()):
                if any(p in gone for p in w.paths):
                    del self._watched[rel]
                    continue
                if w.next_ns is not None and now_ns < w.next_ns:
                    continue  # not due this time
                effective = self._effective(w)
                if effective != w.effective:
                    w.effective = effective
                    out.append(
                        EffectiveLimit(
                            ts=now_ns,
                            cgroup_id=w.cgroup_id,
                            path=rel,
                            limit_bytes=effective[0],
                            set_by=effective[1],
                        )
                    )
                w.fast = self._near_limit(w)
                interval = self.fast_interval_ns if w.fast else self.interval_ns
                w.next_ns = _next_due(w.next_ns, now_ns, interval)
            if gone:
                self._drop_unneeded()

        for pid in sorted(self._procs):
            proc = self._procs[pid]
            if proc.next_ns is not None and now_ns < proc.next_ns:
                continue
            started = time.perf_counter_ns()
            out += self._timed("process", proc.sampler.sample(now_ns), started)
            if proc.sampler.gone:
                self.unwatch_pid(pid)
            else:
                proc.next_ns = _next_due(proc.next_ns, now_ns, self.interval_ns)
        return out
