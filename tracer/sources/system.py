"""Facts about this machine the recorder and ``doctor`` need: kernel version, BTF, tracefs, root,
kernel log.

Each check returns data (never prints), so ``doctor`` can show all of them and ``record`` can
fail on the first one that matters.
"""

from __future__ import annotations

import ctypes
import os
import re

BTF_PATH = "/sys/kernel/btf/vmlinux"
TRACEFS = "/sys/kernel/tracing"
DEBUGFS_TRACING = "/sys/kernel/debug/tracing"

# The oldest kernel the BPF objects load on: both ring buffers (BPF_MAP_TYPE_RINGBUF, commit
# 457f44363a88) and every event's timestamp (bpf_ktime_get_boot_ns, commit 71d19214776e) came in
# 5.8. Older kernels refuse the object with a libbpf error that names neither, so the version is
# checked first and the message says what to do. (A vendor kernel that backports both under an
# older number, as RHEL 8's 4.18 may, is refused too: none is tested here.)
MIN_KERNEL = (5, 8)
KERNEL_FIX = (
    f"boot Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} or later (Debian 11, Ubuntu 22.04 and RHEL 9 "
    "ship one); replaying a trace recorded elsewhere works on any kernel"
)


def kernel_release() -> str:
    """The running kernel's release, as uname(2) reports it (the only place it is read)."""
    return os.uname().release


def kernel_version(release: str) -> tuple[int, int] | None:
    """(major, minor) of a uname release: "6.1.0-18-amd64" -> (6, 1); None if it does not
    start with two numbers (a custom build's string: then nothing is judged by it)."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else None


def kernel_too_old(release: str) -> str | None:
    """Why a kernel of this release cannot record, or None when it is new enough (or its
    version cannot be read from the release)."""
    version = kernel_version(release)
    if version is None or version >= MIN_KERNEL:
        return None
    return (
        f"kernel {release} is too old: whyrestart needs Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} "
        "or later (BPF ring buffer, bpf_ktime_get_boot_ns)"
    )


def tracefs_events_dir() -> str | None:
    """Where tracepoint ids can be read (libbpf looks in both places), or None."""
    for d in (TRACEFS, DEBUGFS_TRACING):
        if os.path.isdir(os.path.join(d, "events", "sched")):
            return d
    return None


def tracefs_mounts(mounts: str = "/proc/self/mounts") -> list[str]:
    """Where tracefs is mounted, readable or not (from the mount table, which anyone can
    read: tracefs itself is mode 0700, so an unprivileged user cannot tell by looking)."""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [p[1] for p in (line.split() for line in lines) if len(p) > 2 and p[2] == "tracefs"]


def kmsg_readable(path: str = "/dev/kmsg") -> tuple[bool, str]:
    """(readable, why not): by opening it, as the recorder will. The mode bits say nothing
    here: reading the kernel log needs CAP_SYSLOG when kernel.dmesg_restrict is 1."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return False, exc.strerror or str(exc)
    os.close(fd)
    return True, ""


def ensure_tracefs() -> str | None:
    """Mount tracefs if it is not mounted (classic tracepoint rungs need it); None if it can't
    be mounted. tp_btf and raw_tp rungs work without it."""
    found = tracefs_events_dir()
    if found or os.geteuid() != 0 or not os.path.isdir(TRACEFS):
        return found
    mount_fs("tracefs", TRACEFS)
    return tracefs_events_dir()


def mount_fs(fstype: str, target: str) -> int:
    """mount(2) a pseudo file system (source = type, no flags, no data): 0, or the errno.
    One declaration for every caller: ctypes argtypes belong to the process's one libc
    function object, so a second, different declaration (bpffs's once said flags was a
    string) broke the first: the agent in the image mounts both and died on the TypeError."""
    libc = ctypes.CDLL(None, use_errno=True)
    # mount(2): source, target, fstype, unsigned long flags, const void *data
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    libc.mount.restype = ctypes.c_int
    if libc.mount(fstype.encode(), target.encode(), fstype.encode(), 0, None) == 0:
        return 0
    return ctypes.get_errno()


BPFFS = "/sys/fs/bpf"


def bpffs_mounted(mounts: str = "/proc/self/mounts") -> bool:
    try:
        with open(mounts) as f:
            return any(line.split()[1:3] == [BPFFS, "bpf"] for line in f if line.strip())
    except (OSError, IndexError):
        return False


def ensure_bpffs() -> bool:
    """Mount the BPF file system where libbpf pins maps by name, if it is not mounted (as
    bpftool does): the GPU side shares one map between recorders there. False if it can't."""
    if bpffs_mounted():
        return True
    if os.geteuid() != 0 or not os.path.isdir(BPFFS):
        return False
    mount_fs("bpf", BPFFS)
    return bpffs_mounted()


# The initial pid namespace's inode number: PROC_PID_INIT_INO (include/linux/proc_ns.h), fixed
# since 3.8 (nsfs numbers every other namespace from 0xF0000000 up). Compared with our own
# namespace's rather than read from /proc/self/status NSpid, which lists pids only from the
# namespace of the procfs mount down: a container with its own /proc shows a single entry there.
INIT_PID_NS_INO = 0xEFFFFFFC
PID_NS_FIX = (
    "run it in the host's pid namespace: docker/podman run --pid=host, hostPID: true in a "
    "Kubernetes pod spec, or no PrivatePIDs= in its systemd unit"
)


def pid_namespace_problem(ns_path: str = "/proc/self/ns/pid") -> str | None:
    """Why this process cannot record here, or None: BPF names every process by its pid in the
    host's pid namespace (bpf_get_current_pid_tgid, task->tgid), so a recorder in another one
    cannot tell itself from the processes it watches, and its SIGCONT to a process the kernel
    held (tracer/gpu/holds.py) would reach another process or none: it would stay stopped."""
    try:
        ino = os.stat(ns_path).st_ino
    except OSError:
        return None  # no /proc/self/ns (CONFIG_PID_NS off): one pid namespace only
    if ino == INIT_PID_NS_INO:
        return None
    return (
        f"this process runs in a pid namespace of its own (pid:[{ino}], not the host's): the "
        "kernel's pids would be misread, and a process held at its first GPU call would be "
        "resumed by the wrong pid"
    )


CAP_SYS_RESOURCE = 24  # include/uapi/linux/capability.h


def has_capability(cap: int, status: str = "/proc/self/status") -> bool:
    """``cap`` is in this process's effective set (root may lack some: a container or a
    systemd unit's CapabilityBoundingSet)."""
    try:
        with open(status) as f:
            eff = next(ln.split()[1] for ln in f if ln.startswith("CapEff:"))
    except (OSError, StopIteration, IndexError):
        return False
    return bool(int(eff, 16) >> cap & 1)
