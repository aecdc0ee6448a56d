"""One memory cgroup's files (v1 or v2) → ``CgroupSample`` events: `CgroupSampler`."""

from __future__ import annotations

import errno
import os

from tracer.errors import UsageError
from tracer.events import CgroupSample, Event
from tracer.parse import cgpath
from tracer.parse.cgroup import CGROUP_PROCS, MEMORY_V1, MEMORY_V2, parse_flat_keyed, parse_limit
from tracer.parse.memory import Pressure, parse_oom_control, parse_pressure, parse_stat, parse_uint
from tracer.sources.cgroupfs import CgroupLayout, under
from tracer.sources.samplers.files import O_READ, PSI_MISSING, KeptFile, ProblemLog, strerror

# A cgroup is "near its limit" when usage >= this percentage of the limit.
NEAR_LIMIT_PERCENT = 90
# With a quiet interval (the agent's), a due cgroup whose usage moved less than this since its
# last full sample, far from its limits and not under pressure, is not sampled in full: one
# read of its usage file (~1 µs) instead of every file (40-70 µs) and an event downstream.
QUIET_BYTES = 1 << 20

V1, V2 = MEMORY_V1, MEMORY_V2
# Files some kernels lack everywhere: reported once per SamplerSet (target: the file name).
_LATE_FILES = {
    V2.peak: ("cgroup", f"{V2.peak} missing: added in Linux 5.19"),
    V2.pressure: ("psi", f"{V2.pressure} missing: {PSI_MISSING}"),
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
        self._files: dict[str, KeptFile] = {}
        self._v2_root = self.version == 2 and self.path == "/"
        # Hybrid: PSI from the unified hierarchy's same-named cgroup (see the module doc).
        self._unified_psi: KeptFile | None = None
        if self.version == 1 and layout.unified_root:
            pressure = os.path.join(under(layout.unified_root, self.path), V2.pressure)
            self._unified_psi = KeptFile(pressure)

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
            dir_fd = os.open(self.abs_path, O_READ | os.O_DIRECTORY)
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
        self._files = {name: KeptFile(name, dir_fd) for name in names}
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
            fd = os.open(CGROUP_PROCS, O_READ, dir_fd=self._dir_fd)
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

    def _missing(self, out: list[Event], ts: int, f: KeptFile) -> None:
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
                self._report(out, now_ns, "cgroup", self.path, f"{f.name}: {strerror(exc)}")
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
