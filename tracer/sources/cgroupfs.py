"""Cgroup filesystem knowledge: which hierarchy holds the memory controller, what a cgroup id
names, which memory limit applies, and (for tests and the lab) throwaway child cgroups.

This module owns every read of cgroupfs and of ``/proc/PID/cgroup`` / ``/proc/self/mountinfo``
(the text itself is parsed by ``tracer.parse.cgroup``, which also spells the v1/v2 file names).
It is split in three layers:

* ``detect_layout``, pure: which mount holds the memory controller;
* ``CgroupLayout`` / ``CgroupResolver``, which read the live hierarchy, rooted at injectable
  paths (``proc_root``, the layout's mount points) so tests run them on trees in a tmp dir;
* ``ChildCgroup``, a context manager that creates, limits, fills, and removes a child memory
  cgroup (root only).

Why inode numbers: the BPF side reports ``cgroup->kn->id``. On 64-bit kernels >= 5.5 that kernfs
node id is also the inode number (``st_ino``) of the cgroup's directory, in every v1 hierarchy
and in the v2 unified hierarchy alike, so a directory walk with ``stat`` maps ids to paths.
Which hierarchy matters: on a hybrid host the ids whyrestart cares about are those of the v1
*memory* hierarchy, on a pure v2 host those of the unified hierarchy.

Readers are defensive: a missing or unreadable file (cgroups come and go while we look) yields
``None`` / an empty result, never an exception. The exceptions that do escape are documented
on the function that raises them (``UsageError`` for a cgroup path that does not exist,
``PermissionProblem`` / ``KernelUnsupported`` from ``ChildCgroup``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from tracer.errors import KernelUnsupported, PermissionProblem, UsageError
from tracer.events import CgroupInfo
from tracer.parse import cgpath
from tracer.parse.cgroup import (
    CGROUP_PROCS,
    MEMORY_FILES,
    MEMORY_V2,
    MemoryFiles,
    Mount,
    ProcCgroupLine,
    parse_limit,
    parse_mountinfo,
    parse_pids,
    parse_proc_cgroup,
)
from tracer.parse.memory import parse_uint

__all__ = [
    "CgroupLayout",
    "CgroupResolver",
    "ChildCgroup",
    "LayoutMode",
    "detect_layout",
    "own_memory_cgroup",
    "relative",
    "under",
]

LayoutMode = Literal["v1", "v2", "hybrid", "none"]

# Directories the resolver remembers. Old entries are kept on purpose (a cgroup that vanished is
# still named by the trace), but a host that churns through pods must not grow us forever.
DEFAULT_MAX_ENTRIES = 65536

# The fixed path every distribution mounts cgroups under; preferred when a hierarchy is mounted
# more than once (bind mounts into containers, tools' private mounts).
_CANONICAL_PREFIX = "/sys/fs/cgroup"


# ---------------------------------------------------------------------------------------------
# Layout


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the cgroup hierarchies are mounted and which one holds the memory controller.

    ``mode`` is "v1" (only v1 hierarchies with controllers), "v2" (only the unified hierarchy,
    possibly beside controller-less named v1 hierarchies), "hybrid" (both), or "none" (no cgroup
    mounts at all). ``memory_mount_root`` is the hierarchy directory the memory mount shows: "/"
    on a host or with a cgroup namespace, "/docker/<id>" in an old-style container; paths in
    ``/proc/PID/cgroup`` are relative to the hierarchy root, so it is stripped from them.
    """

    mode: LayoutMode
    memory_root: str | None
    memory_version: Literal[1, 2] | None
    unified_root: str | None
    memory_mount_root: str = "/"

    @property
    def hierarchy(self) -> str | None:
        """The ``CgroupInfo.hierarchy`` name of the memory hierarchy: "memory" or "unified"."""
        if self.memory_version == 1:
            return "memory"
        if self.memory_version == 2:
            return "unified"
        return None

    @classmethod
    def from_system(
        cls, proc_root: str = "/proc", *, mountinfo_path: str | None = None
    ) -> CgroupLayout:
        """Detect the layout of this machine from ``<proc_root>/self/mountinfo`` and the
        unified hierarchy's ``cgroup.controllers``. Unreadable mountinfo gives mode "none"."""
        path = mountinfo_path or os.path.join(proc_root, "self", "mountinfo")
        text = _read_text(path) or ""
        return detect_layout(text, _read_controllers_file)


def _read_controllers_file(mount_point: str) -> str | None:
    return _read_text(os.path.join(mount_point, "cgroup.controllers"))


def _pick(mounts: list[Mount]) -> Mount | None:
    """The mount to use when a hierarchy is mounted several times: one that shows the whole
    hierarchy (root "/") under /sys/fs/cgroup if any, else the first in mountinfo order."""
    if not mounts:
        return None
    return min(
        mounts,
        key=lambda m: (m.root != "/", not cgpath.is_within(m.mount_point, _CANONICAL_PREFIX)),
    )


def detect_layout(
    mountinfo_text: str, read_controllers: Callable[[str], str | None]
) -> CgroupLayout:
    """Decide the cgroup layout from mountinfo text.

    ``read_controllers(mount_point)`` returns the text of ``<mount_point>/cgroup.controllers``
    of the cgroup2 mount (or None when unreadable); it is consulted only when no v1 hierarchy
    holds the memory controller, to see whether the unified hierarchy has it.
    """
    mounts = parse_mountinfo(mountinfo_text)
    v1 = [m for m in mounts if m.fstype == "cgroup"]
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    v1_with_controllers = [m for m in v1 if m.controllers]

    unified = _pick(v2)
    mode: LayoutMode
    if v1_with_controllers and unified is not None:
        mode = "hybrid"
    elif unified is not None:
        mode = "v2"
    elif v1:
        mode = "v1"
    else:
        mode = "none"

    unified_root = unified.mount_point if unified else None
    memory_v1 = _pick([m for m in v1 if "memory" in m.controllers])
    if memory_v1 is not None:
        # A controller lives in one hierarchy only: bound to v1, it is absent from v2.
        return CgroupLayout(mode, memory_v1.mount_point, 1, unified_root, memory_v1.root)
    if unified is not None:
        controllers = read_controllers(unified.mount_point)
        if controllers is not None and "memory" in controllers.split():
            return CgroupLayout(mode, unified.mount_point, 2, unified_root, unified.root)
    return CgroupLayout(mode, None, None, unified_root)


# ---------------------------------------------------------------------------------------------
# Small I/O helpers (all failures → None)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def relative(layout: CgroupLayout, path: str) -> str:
    """``path`` relative to the memory hierarchy root, canonical (``tracer.parse.cgpath``)."""
    return cgpath.relative(path, layout.memory_root)


def under(root: str, rel: str) -> str:
    """The directory of the canonical cgroup path ``rel`` below the hierarchy mounted at
    ``root``."""
    return root if rel == "/" else root.rstrip("/") + rel


# ---------------------------------------------------------------------------------------------
# Resolver


class CgroupResolver:
    """Maps cgroup ids of the memory hierarchy to paths and back, and reads limits.

    Paths are relative to the memory hierarchy's mount point and start with "/". Every id ever
    seen is remembered (up to ``max_entries``, the oldest-seen evicted first) so a cgroup that
    was removed after we first saw it is still named.
    """

    def __init__(
        self,
        layout: CgroupLayout,
        proc_root: str = "/proc",
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self.layout = layout
        self.proc_root = proc_root
        self.max_entries = max(1, max_entries)
        self._paths: OrderedDict[int, str] = OrderedDict()
        self._scans = 0

    @property
    def scan_count(self) -> int:
        """How many full walks of the hierarchy have been made (for diagnostics and tests)."""
        return self._scans

    # -- ids and paths -------------------------------------------------------------------------

    def _abs(self, path: str) -> str | None:
        root = self.layout.memory_root
        return None if root is None else under(root, cgpath.canonical(path))

    def _remember(self, cgroup_id: int, path: str) -> None:
        # Re-seen entries move to the young end so "oldest" means "longest unseen".
        self._paths[cgroup_id] = path
        self._paths.move_to_end(cgroup_id)
        while len(self._paths) > self.max_entries:
            self._paths.popitem(last=False)

    def rescan(self) -> None:
        """Walk the whole memory hierarchy once, remembering every directory's inode."""
        root = self.layout.memory_root
        if root is None:
            return
        self._scans += 1
        try:
            root_ino = os.stat(root).st_ino
        except OSError:
            return
        self._remember(root_ino, "/")
        stack: list[tuple[str, str]] = [(root, "")]
        while stack:
            abs_dir, rel_dir = stack.pop()
            try:
                it = os.scandir(abs_dir)
            except OSError:  # removed while we walk: fine, it is gone
                continue
            with it:
                for entry in it:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        # stat, not entry.inode(): d_ino and st_ino can differ on stacked
                        # filesystems, and st_ino is what the kernel id is defined to equal.
                        ino = entry.stat(follow_symlinks=False).st_ino
                    except OSError:
                        continue
                    rel = f"{rel_dir}/{entry.name}"
                    self._remember(ino, rel)
                    stack.append((entry.path, rel))

    def learn(self, cgroup_id: int, path: str) -> None:
        """A path the kernel reported with its id (cgroup_mkdir): known from then on, even if
        the cgroup is gone before anything looks it up (a crash-looping container's cgroup
        can live a few milliseconds; a rescan would find nothing) and without a rescan."""
        # (a path that fills the record's 256 bytes, WR_CGROUP_PATH_LEN, may have been cut)
        if cgroup_id not in self._paths and len(path.encode()) < 255:
            self._remember(cgroup_id, cgpath.canonical(path))

    def path_of(self, cgroup_id: int) -> str | None:
        """The path of ``cgroup_id`` (e.g. "/docker/abc"), or None if it is not known.

        Answers from the cache; on a miss walks the hierarchy again, at most once per call.
        """
        path = self._paths.get(cgroup_id)
        if path is not None:
            return path
        self.rescan()
        return self._paths.get(cgroup_id)

    def id_of(self, path: str) -> int:
        """The cgroup id (directory inode) of ``path``.

        ``path`` is relative to the memory hierarchy root ("/docker/abc"); a path that starts
        with the mount point itself ("/sys/fs/cgroup/memory/docker/abc") is accepted too.

        Raises:
            UsageError: no memory hierarchy, or no such cgroup directory.
        """
        root = self.layout.memory_root
        if root is None:
            raise UsageError(
                f"cgroup {path}: no cgroup hierarchy with the memory controller is mounted",
                fix="mount the memory controller (cgroup v1 memory or cgroup2 with memory)",
            )
        rel = relative(self.layout, path)
        abs_path = self._abs(rel)
        assert abs_path is not None  # memory_root is set
        try:
            st = os.stat(abs_path)
        except OSError:
            st = None
        if st is None or not os.path.isdir(abs_path):
            raise UsageError(
                f"cgroup {rel} not found ({abs_path})",
                fix=f"does it exist? list with ls {root}",
            )
        self._remember(st.st_ino, cgpath.canonical(rel))
        return st.st_ino

    # -- limits --------------------------------------------------------------------------------

    def limit_of(self, path: str) -> int | None:
        """The memory limit set on ``path`` itself (v1 ``memory.limit_in_bytes``, v2
        ``memory.max``); None when unlimited, when the cgroup is gone, or at the v2 root."""
        version = self.layout.memory_version
        text = self._read_memory_file(path, lambda files: files.limit)
        return None if text is None or version is None else parse_limit(text, version)

    def peak_of(self, path: str) -> int | None:
        """The kernel's own high-water mark of ``path`` (v1 ``memory.max_usage_in_bytes``, v2
        ``memory.peak``, Linux 5.19+): exact, where samples can miss a short peak. None when
        the kernel has no such file or the cgroup is gone."""
        text = self._read_memory_file(path, lambda files: files.peak)
        return parse_uint(text) if text is not None else None

    def _read_memory_file(self, path: str, name: Callable[[MemoryFiles], str]) -> str | None:
        version = self.layout.memory_version
        abs_path = self._abs(path)
        if abs_path is None or version is None:
            return None
        return _read_text(os.path.join(abs_path, name(MEMORY_FILES[version])))

    def effective_limit(self, path: str) -> tuple[int | None, str | None]:
        """The limit that applies to ``path`` and the path setting it, from the limits on its
        way to the root (``tracer.parse.cgpath.effective_limit``)."""
        return cgpath.effective_limit((p, self.limit_of(p)) for p in cgpath.ancestors(path))

    def info(self, cgroup_id: int, ts: int) -> CgroupInfo | None:
        """A ``CgroupInfo`` event for ``cgroup_id`` stamped ``ts``, or None if the id is unknown.

        ``limit_bytes`` is None when the cgroup has no limit of its own or is already gone.
        """
        hierarchy = self.layout.hierarchy
        if hierarchy is None:
            return None
        path = self.path_of(cgroup_id)
        if path is None:
            return None
        return CgroupInfo(
            ts=ts,
            cgroup_id=cgroup_id,
            path=path,
            hierarchy=hierarchy,
            limit_bytes=self.limit_of(path),
        )

    # -- processes -----------------------------------------------------------------------------

    def cgroup_of_pid(self, pid: int) -> str | None:
        """The memory-hierarchy path of ``pid`` from ``<proc_root>/PID/cgroup``, or None.

        v1: the line whose controllers include "memory"; v2: the ``0::`` line. None when the
        process is gone, or sits outside the part of the hierarchy our mount shows.
        """
        return self._cgroup_of(str(pid))

    def _cgroup_of(self, pid_dir: str) -> str | None:
        text = _read_text(os.path.join(self.proc_root, pid_dir, "cgroup"))
        if text is None:
            return None
        return _memory_path(parse_proc_cgroup(text), self.layout)

    def id_now(self, path: str) -> int | None:
        """The id of the cgroup at ``path`` now, or None when there is none (``id_of``
        without the error: a path made again holds a new id)."""
        try:
            return self.id_of(path)
        except UsageError:
            return None

    def exists(self, path: str) -> bool:
        """Whether the cgroup ``path`` (as ``id_of`` takes it) exists now."""
        abs_path = self._abs(relative(self.layout, path))
        return abs_path is not None and os.path.isdir(abs_path)

    def children(self, path: str) -> list[str]:
        """The paths of ``path``'s child cgroups, sorted ([] when it is gone or unreadable)."""
        abs_path = self._abs(path)
        if abs_path is None:
            return []
        try:
            with os.scandir(abs_path) as it:
                names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []
        base = cgpath.canonical(path).rstrip("/")
        return [f"{base}/{name}" for name in sorted(names)]

    def procs(self, path: str) -> list[int]:
        """The process ids in ``path``'s ``cgroup.procs`` ([] when gone or unreadable)."""
        abs_path = self._abs(path)
        if abs_path is None:
            return []
        return parse_pids(_read_text(os.path.join(abs_path, CGROUP_PROCS)))


def _memory_path(lines: list[ProcCgroupLine], layout: CgroupLayout) -> str | None:
    if layout.memory_version == 1:
        line = next((ln for ln in lines if "memory" in ln.controllers), None)
    elif layout.memory_version == 2:
        line = next((ln for ln in lines if ln.hierarchy_id == 0 and not ln.controllers), None)
    else:
        return None
    if line is None:
        return None
    path = line.path
    # A path starting "/.." lies outside our cgroup namespace: we cannot name it.
    if path == "/.." or path.startswith("/../"):
        return None
    # Without a cgroup namespace a container's mount shows only its own subtree (mount root
    # "/docker/<id>"), while /proc paths are from the hierarchy root: strip the mount root.
    mount_root = cgpath.canonical(layout.memory_mount_root)
    path = cgpath.canonical(path)
    if mount_root != "/":
        if path == mount_root:
            return "/"
        if not path.startswith(mount_root + "/"):
            return None
        path = path[len(mount_root) :]
    return path


def own_memory_cgroup(proc_root: str = "/proc", layout: CgroupLayout | None = None) -> str:
    """This process's memory cgroup path, relative to the memory hierarchy's mount point.

    Raises:
        KernelUnsupported: no hierarchy has the memory controller.
        UsageError: ``<proc_root>/self/cgroup`` does not name a memory cgroup we can see.
    """
    layout = layout or CgroupLayout.from_system(proc_root)
    if layout.memory_version is None:
        raise KernelUnsupported(
            "no cgroup hierarchy with the memory controller is mounted",
            fix="boot with the memory controller enabled (no cgroup_disable=memory)",
        )
    path = CgroupResolver(layout, proc_root)._cgroup_of("self")
    if path is None:
        raise UsageError(
            f"cannot find this process's memory cgroup in {proc_root}/self/cgroup",
            fix="run on the host or in a container with its cgroup filesystem mounted",
        )
    return path


# ---------------------------------------------------------------------------------------------
# Child cgroups (root only)


def _write(path: str, value: str) -> None:
    """Write ``value`` with one write(2), as cgroupfs expects; errors become our exceptions."""
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise _os_error(f"write {value!r} to {path}", exc) from exc


def _os_error(step: str, exc: OSError) -> UsageError | PermissionProblem:
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PermissionProblem(
            f"{step}: {reason}", fix="run as root with a writable cgroup filesystem"
        )
    return UsageError(f"{step}: {reason}")


class ChildCgroup:
    """A child memory cgroup that exists for the duration of a ``with`` block.

    ``ChildCgroup(parent, name, limit_bytes)`` creates ``<parent>/<name>`` in the memory
    hierarchy and sets its memory limit (v1 ``memory.limit_in_bytes``; v2 ``memory.max`` and,
    when ``high_bytes`` is given, ``memory.high``). Children nest: create one with a
    ``ChildCgroup``'s ``.path`` as the parent.

    On cgroup v2 the parent must have "+memory" in ``cgroup.subtree_control`` for the child to
    get memory files. If it is missing it is enabled (and left enabled afterwards: turning it
    off could disturb siblings that rely on it). The kernel refuses that for a non-root parent
    that has processes of its own ("no internal processes"), which is reported as a
    ``UsageError``; use a parent without processes (e.g. the parent of your own cgroup).

    On exit every process left in the child (and in any cgroup below it) gets SIGKILL, the
    exit waits up to ``kill_timeout_s`` for them to leave, and the directories are removed
    deepest first. If the calling process itself was moved in, it is moved back to the cgroup
    it was in at entry instead of being killed. With ``drop_cache``, the page cache it still
    holds is reclaimed before it is removed (`drop_page_cache`), and ``drop_error`` says why
    that failed, if it did.

    Raises (on entry): ``KernelUnsupported`` without a memory hierarchy, ``PermissionProblem``
    when not allowed to create or write, ``UsageError`` for a bad name, a missing parent, an
    existing child, or a limit the kernel rejects. On exit, a cgroup that cannot be removed
    raises ``UsageError`` unless the block is already raising.
    """

    def __init__(
        self,
        parent: str,
        name: str,
        limit_bytes: int | None = None,
        *,
        high_bytes: int | None = None,
        layout: CgroupLayout | None = None,
        proc_root: str = "/proc",
        kill_timeout_s: float = 2.0,
        drop_cache: bool = False,
    ) -> None:
        if not name or "/" in name or name in (".", "..") or "\0" in name:
            raise UsageError(f"bad cgroup name {name!r}", fix="use a single path component")
        self.parent = cgpath.canonical(parent)
        self.name = name
        self.limit_bytes = limit_bytes
        self.high_bytes = high_bytes
        self._layout = layout
        self.proc_root = proc_root
        self.kill_timeout_s = kill_timeout_s
        self.path = cgpath.canonical(f"{self.parent}/{name}")
        self._cgroup_id: int | None = None
        self._resolver: CgroupResolver | None = None
        self._home: str | None = None  # our own memory cgroup at entry
        self.drop_cache = drop_cache
        self.drop_error: str | None = None

    @property
    def cgroup_id(self) -> int:
        """The child's cgroup id (directory inode); available inside the ``with`` block."""
        if self._cgroup_id is None:
            raise RuntimeError("ChildCgroup.cgroup_id used outside its with block")
        return self._cgroup_id

    @property
    def abs_path(self) -> str:
        """The child's directory on the cgroup filesystem."""
        resolver = self._require_resolver()
        abs_path = resolver._abs(self.path)
        assert abs_path is not None
        return abs_path

    @property
    def procs_file(self) -> str:
        """The child's ``cgroup.procs``: writing a pid there moves that process in."""
        return os.path.join(self.abs_path, CGROUP_PROCS)

    def peak(self) -> int | None:
        """The child's high-water mark (``CgroupResolver.peak_of``)."""
        return self._require_resolver().peak_of(self.path)

    def _require_resolver(self) -> CgroupResolver:
        if self._resolver is None:
            raise RuntimeError("ChildCgroup used outside its with block")
        return self._resolver

    def __enter__(self) -> ChildCgroup:
        layout = self._layout or CgroupLayout.from_system(self.proc_root)
        if layout.memory_root is None or layout.memory_version is None:
            raise KernelUnsupported(
                "no cgroup hierarchy with the memory controller is mounted",
                fix="boot with the memory controller enabled (no cgroup_disable=memory)",
            )
        self._resolver = resolver = CgroupResolver(layout, self.proc_root)
        self._home = resolver._cgroup_of("self")
        parent_abs = resolver._abs(self.parent)
        assert parent_abs is not None
        if not os.path.isdir(parent_abs):
            raise UsageError(
                f"parent cgroup {self.parent} not found ({parent_abs})",
                fix=f"does it exist? list with ls {layout.memory_root}",
            )
        if layout.memory_version == 2:
            self._enable_memory_v2(parent_abs)
        child_abs = self.abs_path
        try:
            os.mkdir(child_abs)
        except FileExistsError as exc:
            raise UsageError(
                f"cgroup {self.path} already exists ({child_abs})",
                fix=f"remove the leftover with rmdir {child_abs}, or choose another name",
            ) from exc
        except OSError as exc:
            raise _os_error(f"mkdir {child_abs}", exc) from exc
        try:
            self._set_limits(child_abs, layout.memory_version)
            self._cgroup_id = os.stat(child_abs).st_ino
        except BaseException:
            self._cleanup()
            raise
        return self

    def _enable_memory_v2(self, parent_abs: str) -> None:
        control = os.path.join(parent_abs, "cgroup.subtree_control")
        if "memory" in (_read_text(control) or "").split():
            return
        try:
            _write(control, "+memory")
        except UsageError as exc:
            raise UsageError(
                f"cannot enable the memory controller for children of {self.parent}: {exc.message}",
                fix="use a parent cgroup that has no processes of its own (v2 rule)",
            ) from exc

    def _set_limits(self, child_abs: str, version: int) -> None:
        if self.limit_bytes is not None:
            _write(os.path.join(child_abs, MEMORY_FILES[version].limit), str(self.limit_bytes))
        if self.high_bytes is not None and version == 2:
            _write(os.path.join(child_abs, MEMORY_V2.high), str(self.high_bytes))

    def add_pid(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the child.

        Raises:
            UsageError: no such process, or the kernel refused the move.
            PermissionProblem: not allowed to move it.
        """
        _write(os.path.join(self.abs_path, CGROUP_PROCS), str(pid))

    def procs(self) -> list[int]:
        """The process ids now in the child (not counting cgroups below it)."""
        return self._require_resolver().procs(self.path)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        error = self._cleanup()
        if error is not None and exc_type is None:
            raise error

    # -- teardown ------------------------------------------------------------------------------

    def _subtree(self, child_abs: str) -> list[str]:
        """The child's directory and every cgroup directory below it, deepest first."""
        found: list[str] = []
        stack = [child_abs]
        while stack:
            d = stack.pop()
            found.append(d)
            with contextlib.suppress(OSError), os.scandir(d) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        # Children are appended after their parent, so reversing puts every child first.
        return found[::-1]

    def _kill_all(self, dirs: list[str], deadline: float) -> None:
        me = os.getpid()
        inside = any(me in parse_pids(_read_text(os.path.join(d, CGROUP_PROCS))) for d in dirs)
        # cgroup.kill (v2, Linux 5.14+) kills the whole subtree at once, so no fork escapes.
        # Not used when we are inside ourselves; ignored where the file does not exist.
        if self._layout_version() == 2 and not inside:
            with contextlib.suppress(UsageError, PermissionProblem):
                _write(os.path.join(dirs[-1], "cgroup.kill"), "1")
        while True:
            remaining = False
            for d in dirs:
                for pid in parse_pids(_read_text(os.path.join(d, CGROUP_PROCS))):
                    remaining = True
                    if pid == me:
                        self._move_home(pid)
                        continue
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            # Killed processes leave cgroup.procs when they exit (zombies are not listed).
            if not remaining or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def drop_page_cache(self) -> str | None:
        """Reclaim the page cache the emptied child still holds; None when done, else why not.

        A page stays charged to the cgroup that read it first, even once that cgroup is
        removed: a later cgroup reading the same file (the next repro run) finds it cached and
        is charged nothing for it, so a model's weights that thrash under a small limit read
        first would not under that limit read second. Freed here, every run reads its files
        itself. v1: ``memory.force_empty`` (reclaims all it can of a cgroup without tasks);
        v2: ``memory.reclaim`` of its usage (Linux 5.19), a few times, as it may stop short."""
        d = self.abs_path
        try:
            if self._layout_version() == 1:
                _write(os.path.join(d, "memory.force_empty"), "0")
                return None
            for _ in range(5):
                usage = _read_text(os.path.join(d, "memory.current"))
                if usage is None or int(usage) == 0:
                    return None
                with contextlib.suppress(UsageError):  # EAGAIN: it reclaimed less than asked
                    _write(os.path.join(d, "memory.reclaim"), usage.strip())
        except (UsageError, PermissionProblem) as exc:
            return str(exc)
        left = _read_text(os.path.join(d, "memory.current"))
        return None if left is None or int(left) == 0 else f"{int(left)} bytes still charged"

    def _layout_version(self) -> int | None:
        return self._resolver.layout.memory_version if self._resolver else None

    def _move_home(self, pid: int) -> None:
        resolver = self._require_resolver()
        home = resolver._abs(self._home or "/")
        if home is not None:
            with contextlib.suppress(UsageError, PermissionProblem):
                _write(os.path.join(home, CGROUP_PROCS), str(pid))

    def _cleanup(self) -> UsageError | None:
        """Kill what is left and remove the directories; return the error instead of raising."""
        if self._resolver is None:
            return None
        child_abs = self.abs_path
        if not os.path.isdir(child_abs):
            return None
        deadline = time.monotonic() + self.kill_timeout_s
        dirs = self._subtree(child_abs)
        self._kill_all(dirs, deadline)
        if self.drop_cache:
            self.drop_error = self.drop_page_cache()
        # rmdir can briefly fail with EBUSY while exiting tasks are still being uncharged.
        rm_deadline = time.monotonic() + self.kill_timeout_s
        for d in dirs:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EBUSY and time.monotonic() < rm_deadline:
                        time.sleep(0.02)
                        continue
                    left = parse_pids(_read_text(os.path.join(d, CGROUP_PROCS)))
                    return UsageError(
                        f"cannot remove cgroup {d}: {os.strerror(exc.errno or 0)}"
                        + (f" (processes left: {left})" if left else ""),
                        fix=f"kill its processes and rmdir {d}",
                    )
        return None
