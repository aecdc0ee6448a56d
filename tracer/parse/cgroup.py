"""Cgroup filesystem text: mountinfo, ``/proc/PID/cgroup``, limits, flat-keyed files, pids;
and the memory controller's file names for cgroup v1 and v2, spelled here once.

Pure: every function takes the text of one file and returns data, never touching the
filesystem (``tracer.sources.cgroupfs`` does the reading), so the odd shapes of real hosts are
tested from fixture text.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "CGROUP_PROCS",
    "MEMORY_FILES",
    "MEMORY_V1",
    "MEMORY_V2",
    "MemoryFiles",
    "MemoryV1Files",
    "MemoryV2Files",
    "Mount",
    "ProcCgroupLine",
    "memory_path",
    "parse_flat_keyed",
    "parse_limit",
    "parse_mountinfo",
    "parse_pids",
    "parse_proc_cgroup",
]

# v1 prints "no limit" as PAGE_COUNTER_MAX pages in bytes: LONG_MAX rounded down to the page
# size (9223372036854771712 with 4 KiB pages, 9223372036854710272 with 64 KiB pages). Any value
# at or above 2**62 bytes (4 EiB) is no real limit, whatever the page size, so it means None.
_UNLIMITED_MIN = 1 << 62

# Super options of a v1 cgroup mount that are flags, not controllers (``name=...`` and other
# ``key=value`` options are recognised by their "=").
_V1_FLAG_OPTIONS = frozenset(
    {
        "rw",
        "ro",
        "none",
        "seclabel",  # SELinux hosts (CentOS/RHEL) list it among the super options
        "xattr",
        "noprefix",
        "clone_children",
        "cpuset_v2_mode",
        "favordynmods",
        "nsdelegate",
        "memory_localevents",
        "memory_recursiveprot",
        "memory_hugetlb_accounting",
        "pids_localevents",
    }
)


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of ``/proc/PID/mountinfo`` (see proc(5))."""

    mount_id: int
    parent_id: int
    root: str  # the directory of the filesystem this mount shows ("/docker/<id>" in a container)
    mount_point: str
    options: tuple[str, ...]  # per-mount options (rw, nosuid, relatime, ...)
    fstype: str
    source: str
    super_options: tuple[str, ...]  # per-superblock options: for cgroup v1, the controllers

    @property
    def controllers(self) -> tuple[str, ...]:
        """The v1 controllers bound to this hierarchy (``("cpu", "cpuacct")``); empty for v2
        and for named hierarchies such as ``name=systemd``."""
        if self.fstype != "cgroup":
            return ()
        return tuple(o for o in self.super_options if "=" not in o and o not in _V1_FLAG_OPTIONS)


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mount_field(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as \040 \011 \012 \134.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(
    text: str, fstypes: Collection[str] | None = ("cgroup", "cgroup2")
) -> list[Mount]:
    """Parse mountinfo text; keep only mounts whose fstype is in ``fstypes`` (all when None).

    By default only cgroup v1 (``cgroup``) and v2 (``cgroup2``) mounts are returned, in file
    order. Malformed lines are skipped.
    """
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        # id parent maj:min root mount_point options [optional...] - fstype source super_options
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3 or sep < 6:
            continue
        fstype = fields[sep + 1]
        if fstypes is not None and fstype not in fstypes:
            continue
        try:
            mount_id, parent_id = int(fields[0]), int(fields[1])
        except ValueError:
            continue
        super_opts = fields[sep + 3] if len(fields) > sep + 3 else ""
        mounts.append(
            Mount(
                mount_id=mount_id,
                parent_id=parent_id,
                root=_unescape_mount_field(fields[3]),
                mount_point=_unescape_mount_field(fields[4]),
                options=tuple(fields[5].split(",")),
                fstype=fstype,
                source=_unescape_mount_field(fields[sep + 2]),
                super_options=tuple(o for o in super_opts.split(",") if o),
            )
        )
    return mounts


@dataclass(frozen=True, slots=True)
class ProcCgroupLine:
    """One line of ``/proc/PID/cgroup``: ``hierarchy-id:controllers:path``."""

    hierarchy_id: int  # 0 for the v2 unified hierarchy
    controllers: tuple[str, ...]  # ("cpu", "cpuacct"), ("name=systemd",), () for v2
    path: str  # relative to the reader's cgroup namespace root, starts with "/"
    deleted: bool = False  # v2 marks a removed cgroup with a " (deleted)" suffix


_DELETED_SUFFIX = " (deleted)"


def parse_proc_cgroup(text: str) -> list[ProcCgroupLine]:
    """Parse ``/proc/PID/cgroup`` text. Malformed lines are skipped.

    The path is everything after the second colon (a path may itself contain colons).
    """
    lines: list[ProcCgroupLine] = []
    for raw in text.splitlines():
        parts = raw.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        try:
            hierarchy_id = int(hid)
        except ValueError:
            continue
        if not path.startswith("/"):
            continue
        deleted = path.endswith(_DELETED_SUFFIX)
        if deleted:
            path = path[: -len(_DELETED_SUFFIX)]
        controllers = tuple(c for c in ctrls.split(",") if c)
        lines.append(ProcCgroupLine(hierarchy_id, controllers, path, deleted))
    return lines


def memory_path(text: str) -> str | None:
    """The memory-hierarchy path from ``/proc/PID/cgroup`` text, whatever the host's layout.

    The v1 memory controller's line (``4:memory:/libpod_parent/libpod-<id>``) wins; without
    one (a pure v2 host) the unified line (``0::/system.slice/x.service``) is the memory
    hierarchy. None when neither is there.
    """
    unified: str | None = None
    for line in parse_proc_cgroup(text):
        if "memory" in line.controllers:
            return line.path
        if line.hierarchy_id == 0 and not line.controllers:
            unified = line.path
    return unified


def parse_limit(text: str, version: int) -> int | None:
    """A memory limit file's value in bytes, or None for "unlimited" or unreadable text.

    ``version`` 1: ``memory.limit_in_bytes``, a number; the kernel's "no limit" is a value near
    2**63 (page-size dependent), mapped to None. ``version`` 2: ``memory.max`` (or
    ``memory.high``), a number or ``max``. Either version accepts the other's spelling, since
    being lenient costs nothing here.
    """
    value = text.strip()
    if value == "max":
        return None
    if version not in (1, 2):
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    if n < 0 or n >= _UNLIMITED_MIN:
        return None
    return n


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Parse "key value" lines (``memory.stat``, ``memory.events``, ``memory.oom_control``).

    Lines that are not exactly a key and an integer are skipped; a repeated key keeps the last
    value.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return out


def parse_pids(text: str | None) -> list[int]:
    """``cgroup.procs`` text -> pids (a pid outside our namespace, shown as 0, is left out)."""
    pids: list[int] = []
    for line in (text or "").split():
        with contextlib.suppress(ValueError):
            pid = int(line)
            # 0 is how cgroup.procs shows a process outside the reader's pid namespace.
            if pid > 0:
                pids.append(pid)
    return pids


# ---------------------------------------------------------------------------------------------
# File names


@dataclass(frozen=True, slots=True)
class MemoryFiles:
    """The memory controller's files that both cgroup versions have, by their meaning."""

    usage: str
    limit: str
    peak: str  # the kernel's high-water mark (v2: Linux 5.19+)
    stat: str

    # the order a sampler reads them in (by field name)
    ORDER: ClassVar[tuple[str, ...]] = ("usage", "limit", "peak", "stat")

    def sampled(self) -> tuple[str, ...]:
        """Every file a sampler reads, in reading order."""
        return tuple(getattr(self, name) for name in self.ORDER)


@dataclass(frozen=True, slots=True)
class MemoryV1Files(MemoryFiles):
    failcnt: str  # how often the limit was hit
    oom_control: str  # under_oom, oom_kill

    ORDER: ClassVar[tuple[str, ...]] = ("usage", "limit", "peak", "failcnt", "oom_control", "stat")


@dataclass(frozen=True, slots=True)
class MemoryV2Files(MemoryFiles):
    high: str  # the throttling threshold
    events: str  # counters: low, high, max, oom, oom_kill
    pressure: str  # PSI (also read from a hybrid host's unified hierarchy)

    ORDER: ClassVar[tuple[str, ...]] = (
        "usage",
        "limit",
        "high",
        "peak",
        "events",
        "stat",
        "pressure",
    )


MEMORY_V1 = MemoryV1Files(
    usage="memory.usage_in_bytes",
    limit="memory.limit_in_bytes",
    peak="memory.max_usage_in_bytes",
    stat="memory.stat",
    failcnt="memory.failcnt",
    oom_control="memory.oom_control",
)
MEMORY_V2 = MemoryV2Files(
    usage="memory.current",
    limit="memory.max",
    peak="memory.peak",
    stat="memory.stat",
    high="memory.high",
    events="memory.events",
    pressure="memory.pressure",
)
MEMORY_FILES: dict[int, MemoryFiles] = {1: MEMORY_V1, 2: MEMORY_V2}
CGROUP_PROCS = "cgroup.procs"
