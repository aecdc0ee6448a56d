"""The memory-backed filesystems a process sees that are full: `full_tmpfs`.

Read for a process that has just taken a fatal SIGBUS (tracer/pipeline/enrich.py, `TmpfsAtFault`):
a write fault on a shared mapping of a tmpfs file whose filesystem has no room left ends in a
SIGBUS, not an ENOSPC (mm/shmem.c: shmem_fault() -> shmem_get_folio_gfp() fails -ENOSPC from
shmem_inode_acct_blocks(), vmf_error() turns every error but -ENOMEM into VM_FAULT_SIGBUS, and
the arch fault handler's do_sigbus() sends SIGBUS with si_code BUS_ADRERR). POSIX shared memory
(shm_open) lives on /dev/shm, a tmpfs of 64 MiB in a Docker or podman container by default.

Everything is read through the process's own /proc entry, while it still exists: its
``mountinfo`` (its mount namespace: a container's /dev/shm, not the host's) and ``statvfs`` of
``/proc/PID/root/<mount point>`` (its root, so the container's mount is the one measured).
A process is usually gone by the time its signal is decoded (it dies within microseconds of the
fault unless it dumps core), and its mount namespace is released at its exit: then the reader
may measure through another live process that is verifiably in the same mount namespace
(``via``, `mount_ns`); never through one merely nearby.
"""

from __future__ import annotations

import os

from tracer.events import TmpfsFull
from tracer.parse.cgroup import parse_mountinfo

__all__ = ["FULL_FRACTION", "MAX_MOUNTS", "MIN_FREE_BYTES", "full_tmpfs", "is_full", "mount_ns"]

# A tmpfs counts as full when 95% of it is used, or when less than 2 MiB is free. A fault
# allocates one page (4 KiB), or a whole 2 MiB huge page on a tmpfs mounted huge=always or
# within_size (shmem_alloc_and_add_folio() falls back to a small page only when the huge one
# cannot be allocated, not when it cannot be accounted): by the time user space reads it,
# the faulting write has failed but other writers may have freed a little, so "no page left"
# exactly would miss it. 95% catches a large tmpfs whose last few MiB were taken by the write
# burst that faulted. A small tmpfs (a few KiB: the placeholders a runtime mounts) is full by
# the second test only when at least half of it is used.
FULL_FRACTION = 0.95
MIN_FREE_BYTES = 2 << 20
MAX_MOUNTS = 32  # a process's tmpfs mounts looked at (a container has a handful)


def is_full(size_bytes: int, used_bytes: int, avail_bytes: int) -> bool:
    """A sized tmpfs (size > 0; ``size=0`` means unlimited) with no room for a fault's page."""
    if size_bytes <= 0:
        return False
    if used_bytes >= FULL_FRACTION * size_bytes:
        return True
    return avail_bytes < MIN_FREE_BYTES and 2 * used_bytes >= size_bytes


def _mapped_files(text: str) -> list[str]:
    """The files a ``/proc/PID/maps`` text maps (the path is the sixth field)."""
    out: list[str] = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            out.append(fields[5].removesuffix(" (deleted)"))
    return out


def _under(path: str, mount_point: str) -> bool:
    return mount_point == "/" or path == mount_point or path.startswith(mount_point + "/")


def mount_ns(pid: int, proc_root: str = "/proc") -> str | None:
    """The mount namespace of a live process (``mnt:[4026531841]``: its inode, unique while the
    namespace lives), or None when it is gone (a zombie's namespaces are released)."""
    try:
        return os.readlink(f"{proc_root}/{pid}/ns/mnt")
    except OSError:
        return None


def full_tmpfs(pid: int, ts: int, proc_root: str = "/proc", via: int = 0) -> list[TmpfsFull] | None:
    """The full tmpfs mounts of ``pid`` (`is_full`), each measured through its root (or through
    ``via``'s, a live process in the same mount namespace); the ones it maps a file of first.
    None when the process read is gone; [] when it has no full tmpfs."""
    base = f"{proc_root}/{via or pid}"
    try:
        with open(f"{base}/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            mounts = parse_mountinfo(f.read(), ("tmpfs",))[:MAX_MOUNTS]
    except OSError:
        return None  # gone (a zombie's mount namespace is already released)
    if not mounts:
        return []
    mapped: list[str] = []
    if not via:  # (another process's mappings say nothing of this one's)
        try:
            with open(f"{base}/maps", encoding="utf-8", errors="surrogateescape") as f:
                mapped = _mapped_files(f.read())
        except OSError:
            pass
    # a mount over another at the same point hides it: the last one in the file is the one seen
    seen: dict[str, bool] = {}
    for m in mounts:
        if "ro" in m.options:  # (nothing writes to it: a runtime's mask over /proc/acpi...)
            seen.pop(m.mount_point, None)
            continue
        seen[m.mount_point] = any(_under(p, m.mount_point) for p in mapped)
    out: list[TmpfsFull] = []
    for point, maps_it in seen.items():
        try:
            st = os.statvfs(f"{base}/root{point}")
        except OSError:
            continue  # gone in the meantime, or not reachable from its root (a chroot)
        size = st.f_blocks * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        avail = st.f_bavail * st.f_frsize
        if is_full(size, used, avail):
            out.append(TmpfsFull(ts, pid, point, "tmpfs", size, used, avail, maps_it, via))
    out.sort(key=lambda e: not e.mapped)
    return out
